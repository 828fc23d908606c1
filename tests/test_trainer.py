"""MAGRPOTrainer on tiny random models: tree sizes, metrics, saving and resuming."""

import glob
import os
import sys
import textwrap
from collections import defaultdict

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from transformers import AutoModelForCausalLM, TrainerCallback

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        per_device_train_batch_size=8,
        max_new_tokens=8,
        num_train_epochs=1,
        logging_steps=1,
        report_to="none",
        seed=0,
    )
    values.update(overrides)
    return MAGRPOConfig(**values)


def team(tokenizer, n=2, seed=0):
    return [make_model(tokenizer, seed=seed + i) for i in range(n)]


def dataset(n=4):
    return Dataset.from_dict({"prompt": SEED_PROMPTS[:n]})


class CountingReward:
    """Records, per turn, how many joint answers each reward call scored."""

    __name__ = "counting_reward"

    def __init__(self):
        self.sizes = defaultdict(list)

    def __call__(self, completions1, completions2, turn, **kwargs):
        self.sizes[turn].append(len(completions1))
        return length_ratio_reward(completions1, completions2)


@pytest.mark.parametrize(
    "threshold, mode, k, expected",
    [(None, "aligned", 4, {1: 4, 2: 16}), (-0.2, "aligned", 4, {1: 4}), (None, "cross", 2, {1: 4, 2: 16})],
)
def test_joint_answers_per_prompt(tmp_path, tokenizer, threshold, mode, k, expected):
    reward = CountingReward()
    args = config(
        tmp_path, num_turns=2, early_termination_threshold=threshold, joint_mode=mode, num_generations=k,
        per_device_train_batch_size=2 * k, max_steps=1, check_functions_before_training=False,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=team(tokenizer), processing_class=tokenizer, reward_funcs=reward, external_transition=length_feedback,
        train_dataset=dataset(), args=args,
    )  # fmt: skip
    trainer.train()
    prompts_per_step = 2
    assert {t: sizes[0] // prompts_per_step for t, sizes in reward.sizes.items()} == expected
    assert all(len(sizes) == 1 for sizes in reward.sizes.values())  # one reward call per turn


def test_metrics_reach_tensorboard(tmp_path, tokenizer):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = config(
        tmp_path, num_turns=2, early_termination_threshold=None, report_to="tensorboard", max_steps=2,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=team(tokenizer), processing_class=tokenizer, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=dataset(), args=args,
    )  # fmt: skip
    trainer.train()
    events = glob.glob(str(tmp_path / "**" / "events.out.tfevents*"), recursive=True)
    assert events
    acc = EventAccumulator(os.path.dirname(events[0]))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for key in [
        "turn_1/reward_mean", "turn_2/reward_mean", "turn_1/reward_std", "turn_1/expected_return",
        "turn_1/terminated_frac", "agent_0/completions/mean_length", "agent_1/completions/mean_length",
        "reward", "reward_std", "entropy", "clip_ratio/region_mean", "completions/mean_length",
        "throughput/generate_tokens_per_s",
    ]:  # fmt: skip
        assert f"train/{key}" in tags, key
    # turn-1 expected return = turn-1 reward + mean turn-2 return (discount 1, every branch expanded)
    last = trainer.state.log_history[-2]
    assert last["turn_1/expected_return"] == pytest.approx(last["turn_1/reward_mean"] + last["turn_2/reward_mean"])
    # no threshold: no node ends early, in either turn
    assert last["turn_2/terminated_frac"] == 0.0 and last["turn_1/terminated_frac"] == 0.0
    # the update is timed apart from the rollout its micro-step ran first (`training_step`, `timing.MicroStep`): with
    # the generation's seconds counted in, it would take the whole step
    first = trainer.state.log_history[0]
    assert first["throughput/update_tokens_per_s"] > 0
    assert first["timing/update_s"] + first["timing/generate_s"] < first["step_time"]


def test_save_model_writes_loadable_agents(tmp_path, tokenizer):
    args = config(tmp_path, max_steps=1, learning_rate=1e-2)
    agents = team(tokenizer)
    trainer = MAGRPOTrainer(model=agents, processing_class=tokenizer, reward_funcs=length_ratio_reward,
                            train_dataset=dataset(), args=args)  # fmt: skip
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    for i, agent in enumerate(agents):
        loaded = AutoModelForCausalLM.from_pretrained(out / f"agent_{i}")
        for (name, p), q in zip(agent.state_dict().items(), loaded.state_dict().values(), strict=True):
            assert torch.equal(p, q), name
    # the agents did train, and differently from each other
    fresh = team(tokenizer)
    changes = [
        a.model.layers[0].mlp.up_proj.weight - f.model.layers[0].mlp.up_proj.weight
        for a, f in zip(agents, fresh, strict=True)
    ]
    assert all(change.abs().max() > 0 for change in changes)
    assert not torch.allclose(changes[0], changes[1])


def _final_weights(trainer):
    return [{k: v.clone() for k, v in a.state_dict().items()} for a in trainer.team.agents]


def test_resume_matches_uninterrupted_run(tmp_path, tokenizer, caplog):
    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    def run(output, resume=None, interrupt=False):
        args = config(
            tmp_path, output_dir=str(output), num_turns=2, early_termination_threshold=0.9, max_steps=4,
            save_steps=2, learning_rate=1e-2, per_device_train_batch_size=4,
        )  # fmt: skip
        trainer = MAGRPOTrainer(
            model=team(tokenizer), processing_class=tokenizer, reward_funcs=length_ratio_reward,
            external_transition=length_feedback, train_dataset=dataset(), args=args,
            callbacks=[StopAt()] if interrupt else None,
        )  # fmt: skip
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = _final_weights(run(tmp_path / "full"))
    assert run(tmp_path / "part", interrupt=True).state.global_step == 2  # interrupted after saving checkpoint-2
    resumed = run(tmp_path / "resumed", resume=str(tmp_path / "part" / "checkpoint-2"))
    assert resumed.state.global_step == 4
    # the resume names its checkpoint and step
    assert f"resuming from {tmp_path / 'part' / 'checkpoint-2'} (step 2)" in caplog.text
    for a, b in zip(full, _final_weights(resumed), strict=True):
        for name in a:
            torch.testing.assert_close(a[name], b[name], msg=name)


def test_evaluation_rollouts(tmp_path, tokenizer):
    args = config(
        tmp_path, num_turns=2, early_termination_threshold=None, max_steps=2, eval_strategy="steps", eval_steps=1,
        eval_on_start=True, per_device_eval_batch_size=2, num_generations_eval=1, eval_do_sample=False,
    )  # fmt: skip
    trainer = MAGRPOTrainer(
        model=team(tokenizer), processing_class=tokenizer, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=dataset(), eval_dataset=dataset(2), args=args,
    )  # fmt: skip
    trainer.train()
    evals = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert [h["step"] for h in evals] == [0, 1, 2]  # a baseline before training, then after each step
    for h in evals:
        for t in (1, 2):
            assert f"eval_turn_{t}/reward_mean" in h and f"eval_turn_{t}/expected_return" in h
        # greedy, one completion per agent: 2 prompts x 1 joint answer, each expanded once
        assert h["eval_turn_1/expected_return"] == pytest.approx(
            h["eval_turn_1/reward_mean"] + h["eval_turn_2/reward_mean"]
        )
    # greedy evaluation is deterministic: evaluating twice gives the same rewards
    first, second = trainer.evaluate(), trainer.evaluate()
    assert first["eval_turn_1/reward_mean"] == second["eval_turn_1/reward_mean"]
    assert first["eval_turn_2/reward_mean"] == second["eval_turn_2/reward_mean"]
    assert first["eval_turn_1/reward_mean"] == evals[-1]["eval_turn_1/reward_mean"]


def test_length_chunked_logps_equal_padded_logps(tmp_path, tokenizer):
    """Sorting rows by length and trimming shared padding changes no log-prob or entropy (beyond float rounding)."""
    from trl import GRPOTrainer

    from trl_multiagent.update.batching import agent_rows, length_chunks

    trainer = MAGRPOTrainer(model=team(tokenizer, n=1), processing_class=tokenizer, reward_funcs=lambda c: [0.0] * len(c),
                            train_dataset=dataset(), args=config(tmp_path))  # fmt: skip
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (3, 30, 5, 28, 12, 2)]
    completions = [torch.randint(3, 300, (n,), generator=g).tolist() for n in (8, 1, 4, 8, 2, 6)]
    rows = agent_rows(prompts, completions, torch.zeros(6), tokenizer.pad_token_id)
    ids = torch.cat([rows["prompt_ids"], rows["completion_ids"]], 1)
    mask = torch.cat([rows["prompt_mask"], rows["completion_mask"]], 1)
    chunks = length_chunks(ids, mask, 8, chunk_rows=2)
    # prompt lengths 3, 30, 5, 28, 12, 2: sorted, in pairs
    assert [c[0].tolist() for c in chunks] == [[5, 0], [2, 4], [3, 1]]
    # first column after the padding the pair shares (prompt width 30), and the pair's longest completion
    assert [(c[1], c[2]) for c in chunks] == [(27, 8), (18, 4), (0, 8)]
    model = trainer.team.agent(0)
    with torch.no_grad(), trainer.team.acting(0):
        ours = trainer._get_per_token_logps_and_entropies(
            trainer.team, ids, mask, 8, batch_size=2, compute_entropy=True
        )
        padded = GRPOTrainer._get_per_token_logps_and_entropies(trainer, model, ids, mask, 8, compute_entropy=True)
    completion_mask = rows["completion_mask"].bool()
    torch.testing.assert_close(ours[0][completion_mask], padded[0][completion_mask], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1][completion_mask], padded[1][completion_mask], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("baseline, scale", [("rloo", 4 / 3), ("none", None), ("max", None)])
def test_advantage_baseline_reaches_the_update(tmp_path, tokenizer, baseline, scale):
    """One on-policy SGD step moves the weights linearly in the advantages: RLOO's step is K/(K-1) times GRPO's mean
    baseline's; the raw and max baselines move them differently."""
    steps = {}
    for name in ("mean", baseline):
        agents = team(tokenizer, n=1, seed=3)
        before = {k: v.clone() for k, v in agents[0].state_dict().items()}
        args = config(
            tmp_path / name, max_steps=1, scale_rewards="none", advantage_baseline=name, learning_rate=0.5,
            optim="sgd", lr_scheduler_type="constant", max_grad_norm=0.0,
        )  # fmt: skip
        trainer = MAGRPOTrainer(
            model=agents, processing_class=tokenizer, reward_funcs=lambda completions: [len(c) / 10 for c in completions],
            train_dataset=dataset(), args=args,
        )  # fmt: skip
        trainer.train()
        steps[name] = torch.cat([(agents[0].state_dict()[k] - v).flatten() for k, v in before.items()])
    assert steps["mean"].abs().max() > 1e-4
    if scale is not None:
        torch.testing.assert_close(steps[baseline], scale * steps["mean"], rtol=1e-3, atol=1e-6)
    else:
        assert (steps[baseline] - steps["mean"]).abs().max() > 1e-4


# ---------------------------------------------------------------------- checks when the trainer is built


UNLOADABLE = ["no/such-model"] * 2  # agents for a check that fails before any model is loaded (or asks the hub)


def checked_config(tmp_path):  # noqa: N802  (a config, named as the constant beside it)
    """Two turns with the opt-in placeholder call of the reward and the transition when the trainer is built."""
    return config(tmp_path, num_turns=2, check_functions_before_training=True)


def build(tmp_path, tokenizer, **overrides):
    kwargs = dict(
        model=UNLOADABLE, processing_class=tokenizer, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=dataset(), args=config(tmp_path, num_turns=2),
    )  # fmt: skip
    kwargs.update(overrides)
    return MAGRPOTrainer(**kwargs)


def test_a_reward_of_fixed_length_fails_when_built(tmp_path, tokenizer):
    """The placeholder call scores more than one joint action: a reward returning `[0.0, 0.0, 0.0]` cannot pass it
    (`[0.0]` is CoMLRL's one-joint-action-per-call convention: see test_rewards.py)."""
    with pytest.raises(ValueError, match=r"'<lambda>' \(turn 1\) returned 3 values for 2 joint actions"):
        build(tmp_path, tokenizer, reward_funcs=lambda a, b: [0.0, 0.0, 0.0], args=checked_config(tmp_path))


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception notes are Python 3.11+ (3.10 logs the note)")
@pytest.mark.parametrize("failing", ["reward", "transition"])
def test_an_error_of_the_placeholder_call_keeps_its_type_and_says_where_it_came_from(tmp_path, tokenizer, failing):
    def broken_reward(completions1, completions2):
        return [1 / 0]

    def broken_transition(prompt, agent_completions, num_agents):
        return {}["feedback"]

    functions = {"reward_funcs": broken_reward} if failing == "reward" else {"external_transition": broken_transition}
    with pytest.raises(ZeroDivisionError if failing == "reward" else KeyError) as caught:
        build(tmp_path, tokenizer, **functions, args=checked_config(tmp_path))
    notes = "\n".join(caught.value.__notes__)
    named = "the joint reward ['broken_reward']" if failing == "reward" else "external_transition 'broken_transition'"
    assert f"this came from the check that calls {named}" in notes
    assert "with the placeholder answer 'placeholder answer'" in notes
    assert "MAGRPOConfig(check_functions_before_training=False)" in notes


def chat(text):
    return [{"role": "user", "content": text}]


def test_chat_prompts_for_an_agent_without_chat_template_fail_before_loading(tmp_path, tokenizer):
    import copy

    templated = copy.deepcopy(tokenizer)
    templated.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    chats = Dataset.from_dict({"prompt": [chat(p) for p in SEED_PROMPTS]})
    message = (
        r"agent 1's prompt from the dataset row .* is a list of chat messages, but agent 1's tokenizer has no chat "
        r"template .*plain-text prompts \(the recipes' `--prompt_format plain`\)"
    )
    for checks in (True, False):  # the dataset's prompts are checked also without the placeholder call
        with pytest.raises(ValueError, match=message):
            build(
                tmp_path, [templated, tokenizer], train_dataset=chats,
                args=config(tmp_path, num_turns=2, check_functions_before_training=checks),
            )  # fmt: skip
    with pytest.raises(ValueError, match=r"agent 0's prompt from the dataset row .* is a list of chat messages"):
        build(tmp_path, tokenizer, train_dataset=dataset(), eval_dataset=chats)
    build(tmp_path, templated, model=team(tokenizer), train_dataset=chats)  # every agent has a chat template


def test_a_transition_writing_chat_messages_for_an_agent_without_chat_template_names_it(tmp_path, tokenizer):
    def chat_feedback(prompt, agent_completions, num_agents):
        return [prompt, chat("Write a longer answer.")]

    message = r"agent 1's prompt from external_transition 'chat_feedback' after turn 1 is a list of chat messages"
    with pytest.raises(ValueError, match=message):
        build(tmp_path, tokenizer, external_transition=chat_feedback, args=checked_config(tmp_path))


def test_a_transition_with_one_turn_is_said_to_be_unused(tmp_path, tokenizer, caplog):
    import trl_multiagent.arguments as arguments_module

    arguments_module.logger.warning_once.cache_clear()  # an earlier test may have said the same thing already
    with caplog.at_level("WARNING"):
        build(tmp_path, tokenizer, model=team(tokenizer), args=config(tmp_path, num_turns=1))
    assert "external_transition 'length_feedback' is never called with num_turns=1" in caplog.text
    caplog.clear()
    arguments_module.logger.warning_once.cache_clear()
    with caplog.at_level("WARNING"):
        build(tmp_path, tokenizer, model=team(tokenizer))  # two turns: it is used
    assert "is never called" not in caplog.text


def test_the_class_docstring_example_runs_with_a_local_model(tmp_path, tiny_model_dir, monkeypatch):
    """The example in MAGRPOTrainer's docstring is valid code: with its hub id swapped for a tiny saved model and one
    step, it trains."""
    code = textwrap.dedent(MAGRPOTrainer.__doc__.split("```python")[1].split("```")[0])
    hub_id = '"HuggingFaceTB/SmolLM2-135M-Instruct"'
    assert hub_id in code and "max_completion_length=64" in code
    code = code.replace(hub_id, repr(tiny_model_dir))
    code = code.replace("max_completion_length=64", "max_completion_length=4, max_steps=1")
    monkeypatch.chdir(tmp_path)  # the example writes to the default output_dir
    namespace = {}
    exec(compile(code, "MAGRPOTrainer docstring", "exec"), namespace)
    assert namespace["trainer"].state.global_step == 1
