"""Teams that fit: per-agent LoRA on one shared base, separate adapters, frozen partners, heterogeneous teams."""

import re

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tokenizer
from trl_multiagent.update.batching import split_micro_batches


LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj", "down_proj"], lora_dropout=0.0)


def args_for(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=4, per_device_train_batch_size=8, max_new_tokens=8,
        max_steps=2, logging_steps=1, report_to="none", seed=0, num_turns=2, early_termination_threshold=0.9,
        learning_rate=5e-2, save_strategy="no",
    )  # fmt: skip
    values.update(overrides)
    return MAGRPOConfig(**values)


def shared_lora_trainer(tmp_path, tokenizer, n, lora=None, prompts=SEED_PROMPTS, **overrides):
    return MAGRPOTrainer(
        model=make_model(tokenizer, seed=0), num_agents=n, peft_config=LoraConfig(**(lora or LORA)),
        processing_class=tokenizer, reward_funcs=lambda *completions: length_ratio_reward(*completions[:2]),
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": prompts}),
        args=args_for(tmp_path, **overrides),
    )  # fmt: skip


def adapter_state(trainer, i):
    return [p.detach().clone() for p in trainer.team.agent_parameters(i)]


def one_micro_batch(trainer):
    rows = [{"prompt": p} for p in SEED_PROMPTS[:2] for _ in range(trainer.num_generations)]
    trainer.current_gradient_accumulation_steps = 1
    agent_batches = trainer._generate_and_score_completions(rows)["agents"]
    return split_micro_batches(agent_batches, 1)[0]


def team_gradients(trainer, inputs, separately):
    team = trainer.team
    grads = []
    if not separately:
        team.zero_grad()
        trainer.compute_loss(team, inputs).backward()
    for i in range(trainer.num_agents):
        if separately:
            team.zero_grad()
            with team.acting(i):
                trainer._compute_loss(team, inputs[i]).backward()
        grads.append([p.grad.clone() for p in team.agent_parameters(i)])
    return grads


@pytest.mark.parametrize("n", [2, 3])
def test_shared_base_lora_gradients_with_checkpointing(tmp_path, tokenizer, n):
    """One backward over every agent's loss gives each adapter the gradient of its own loss alone."""
    trainer = shared_lora_trainer(
        tmp_path, tokenizer, n, lora={**LORA, "init_lora_weights": False}, gradient_checkpointing=True
    )
    team = trainer.team
    assert trainer.args.gradient_checkpointing
    team.train()
    team.activation_checkpointing_enable()
    assert team.is_gradient_checkpointing
    inputs = one_micro_batch(trainer)

    joint = team_gradients(trainer, inputs, separately=False)
    reference = team_gradients(trainer, inputs, separately=True)
    for i in range(n):
        assert len(joint[i]) == 2 * 4 * 2  # A and B of 4 target modules in 2 layers
        for g, r in zip(joint[i], reference[i], strict=True):
            assert r.abs().sum() > 0
            torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-8)

    # The same check fails when the recomputation does not restore the adapter: the test can tell.
    team.activation_checkpointing_disable()
    team._checkpoint_kwargs = lambda kwargs: {**(kwargs or {}), "use_reentrant": False}
    team.activation_checkpointing_enable()
    broken = team_gradients(trainer, inputs, separately=False)
    wrong = [
        i
        for i in range(n)
        if any(not torch.allclose(g, r, rtol=1e-3) for g, r in zip(broken[i], reference[i], strict=True))
    ]
    assert wrong == list(range(1, n))  # every agent but the one whose adapter is active during backward


def test_shared_base_trains_every_adapter_and_saves_adapters(tmp_path, tokenizer):
    trainer = shared_lora_trainer(tmp_path, tokenizer, 2, max_steps=3)
    base_before = {
        k: v.clone() for k, v in trainer.team.agent(0).get_base_model().state_dict().items() if "lora" not in k
    }
    before = [adapter_state(trainer, i) for i in range(2)]
    trainer.train()
    after = [adapter_state(trainer, i) for i in range(2)]
    for i in range(2):
        assert any(not torch.equal(a, b) for a, b in zip(before[i], after[i], strict=True)), (
            f"adapter {i} did not train"
        )
    # adapters differ from each other, and the base weights did not move
    assert any(not torch.equal(a, b) for a, b in zip(after[0], after[1], strict=True))
    for k, v in trainer.team.agent(0).get_base_model().state_dict().items():
        if k in base_before:
            assert torch.equal(v, base_before[k]), k

    out = tmp_path / "saved"
    trainer.save_model(str(out))
    for i in range(2):
        loaded = PeftModel.from_pretrained(make_model(tokenizer, seed=0), out / f"agent_{i}")
        loaded_params = [p for n, p in loaded.named_parameters() if "lora_" in n]
        assert len(loaded_params) == len(after[i])
        for p, q in zip(loaded_params, after[i], strict=True):
            assert torch.equal(p, q)

    # merged full weights: same outputs as the base with that agent's adapter
    trainer.save_merged_model(str(tmp_path / "merged"))
    ids = torch.tensor([[5, 17, 42, 7]])
    for i in range(2):
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged" / f"agent_{i}")
        with torch.no_grad(), trainer.team.acting(i) as acting:
            acting.eval()
            expected = acting(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-5)


def test_shared_base_resume_restores_trainable_adapters(tmp_path, tokenizer):
    class StopAt2(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = state.global_step == 2

    def run(name, resume=None, interrupt=False):
        # 8 prompts, 2 per step: the run resumes mid-epoch. (At an epoch boundary TRL's RepeatSampler would restart
        # its shuffle from its seed, so the resumed epoch would see another prompt order.)
        trainer = shared_lora_trainer(
            tmp_path / name, tokenizer, 2, prompts=SEED_PROMPTS * 2, max_steps=4, save_strategy="steps", save_steps=2
        )
        if interrupt:
            trainer.add_callback(StopAt2())
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run("full")
    run("part", interrupt=True)
    resumed = run("resumed", resume=str(tmp_path / "part" / "run" / "checkpoint-2"))
    for i in range(2):
        parameters = list(resumed.team.agent_parameters(i))
        assert parameters and all(p.requires_grad for p in parameters)
        for a, b in zip(adapter_state(full, i), adapter_state(resumed, i), strict=True):
            torch.testing.assert_close(a, b)


@pytest.mark.parametrize("shared", [True, False])
def test_frozen_agent_is_bit_identical(tmp_path, tokenizer, shared):
    if shared:
        trainer = shared_lora_trainer(tmp_path, tokenizer, 2, max_steps=3, trainable_agents=[1])
    else:
        trainer = MAGRPOTrainer(
            model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer,
            reward_funcs=length_ratio_reward, external_transition=length_feedback,
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
            args=args_for(tmp_path, max_steps=3, trainable_agents=[1]),
        )  # fmt: skip
    before = [adapter_state(trainer, i) for i in range(2)]
    trainer.train()
    after = [adapter_state(trainer, i) for i in range(2)]
    assert before[0] and all(torch.equal(a, b) for a, b in zip(before[0], after[0], strict=True))
    assert any(not torch.equal(a, b) for a, b in zip(before[1], after[1], strict=True))


@pytest.mark.parametrize("shared", [True, False])
def test_kl_against_reference(tmp_path, tokenizer, shared):
    overrides = dict(beta=0.5, max_steps=3)
    if shared:
        trainer = shared_lora_trainer(tmp_path, tokenizer, 2, **overrides)
    else:
        trainer = MAGRPOTrainer(
            model=[make_model(tokenizer, seed=i) for i in range(2)], processing_class=tokenizer,
            reward_funcs=length_ratio_reward, external_transition=length_feedback,
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args_for(tmp_path, **overrides),
        )  # fmt: skip
        assert trainer.ref_team is not None
    trainer.train()
    kl = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert len(kl) == 3
    assert kl[0] == 0.0  # the policies start as their references
    assert kl[-1] > 0.0


def test_a_tokenizer_that_does_not_match_its_agent_is_named(tmp_path):
    tok_a, tok_b = make_tokenizer(400), make_tokenizer(300)
    agents = [make_model(tok_a, seed=0, arch="llama"), make_model(tok_b, seed=1, arch="qwen2", hidden=48)]
    trainer = MAGRPOTrainer(
        model=agents, processing_class=[tok_b, tok_a], reward_funcs=length_ratio_reward,  # swapped
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=args_for(tmp_path, early_termination_threshold=None),
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"agent 1's tokenizer produced token id 3\d\d, but the agent's vocabulary has "
                                         r"300 entries"):  # fmt: skip
        trainer.train()


def test_heterogeneous_team_llama_and_qwen2(tmp_path):
    tok_a, tok_b = make_tokenizer(400), make_tokenizer(300)
    agents = [make_model(tok_a, seed=0, arch="llama"), make_model(tok_b, seed=1, arch="qwen2", hidden=48)]
    trainer = MAGRPOTrainer(
        model=agents, processing_class=[tok_a, tok_b], reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=args_for(tmp_path, early_termination_threshold=None),
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "turn_2/reward_mean" in h]
    assert len(logs) == 2
    # each agent generated with its own vocabulary
    assert agents[0].get_output_embeddings().weight.shape[0] == len(tok_a) != len(tok_b)
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    text = "Describe a city in the clouds:"
    for i, (tok, agent) in enumerate(zip([tok_a, tok_b], agents, strict=True)):
        # PreTrainedTokenizerFast: AutoTokenizer would swap in Qwen2's own pre-tokenizer for the qwen2 config
        reloaded_tok = PreTrainedTokenizerFast.from_pretrained(out / f"agent_{i}")
        assert reloaded_tok(text)["input_ids"] == tok(text)["input_ids"]
        reloaded = AutoModelForCausalLM.from_pretrained(out / f"agent_{i}")
        assert type(reloaded) is type(agent)
        for (name, p), q in zip(agent.state_dict().items(), reloaded.state_dict().values(), strict=True):
            assert torch.equal(p, q), name


def test_separate_bases_each_with_an_adapter(tmp_path, tokenizer):
    agents = [make_model(tokenizer, seed=i) for i in range(2)]
    trainer = MAGRPOTrainer(
        model=agents, peft_config=LoraConfig(**LORA), processing_class=tokenizer, reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=args_for(tmp_path, beta=0.1),
    )  # fmt: skip
    assert not trainer.team.is_shared_base and trainer.team.all_adapters and trainer.ref_team is None

    def lora_params(i):
        return [p.detach().clone() for n, p in trainer.team.agent(i).named_parameters() if "lora_" in n]

    before = [lora_params(i) for i in range(2)]
    trainer.train()
    out = tmp_path / "saved"
    trainer.save_model(str(out))
    for i in range(2):
        trained = lora_params(i)
        assert any(not torch.equal(a, b) for a, b in zip(before[i], trained, strict=True)), (
            f"adapter {i} did not train"
        )
        loaded = PeftModel.from_pretrained(make_model(tokenizer, seed=i), out / f"agent_{i}")
        for p, q in zip([p for n, p in loaded.named_parameters() if "lora_" in n], trained, strict=True):
            assert torch.equal(p, q)
        # the base weights of each agent stayed as they were
        base_before = make_model(tokenizer, seed=i).state_dict()
        for name, value in trainer.team.agent(i).get_base_model().state_dict().items():
            if "lora_" not in name and name.replace("base_layer.", "") in base_before:
                assert torch.equal(value, base_before[name.replace("base_layer.", "")]), name


# ---------------------------------------------------------------------- mistakes in the team, said before loading


def build_before_loading(tmp_path, **overrides):
    """A trainer whose agents cannot be loaded (`no/such-model`): a check that passes reaches the hub and fails there."""
    kwargs = dict(
        model=["no/such-model"] * 2, processing_class=make_tokenizer(), reward_funcs=length_ratio_reward,
        external_transition=length_feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=args_for(tmp_path),
    )  # fmt: skip
    kwargs.update(overrides)
    return MAGRPOTrainer(**kwargs)


@pytest.mark.parametrize(
    "trainable, message",
    [
        ([], r"MAGRPOConfig.trainable_agents=\[\] trains no agent; at least one agent must train"),
        ([1, 1], r"MAGRPOConfig.trainable_agents=\[1, 1\] names agent\(s\) \[1\] more than once"),
        ([0, 2], r"MAGRPOConfig.trainable_agents=\[0, 2\] names agents outside 0..1"),
    ],
)
def test_trainable_agents_that_train_nobody_or_repeat_an_agent_are_refused_before_loading(
    tmp_path, trainable, message
):
    with pytest.raises(ValueError, match=message):
        build_before_loading(tmp_path, args=args_for(tmp_path, trainable_agents=trainable))


@pytest.mark.parametrize("path", ["/nope/model", "./nope/model", "~/nope-model", "runs/nope/agent_0"])
def test_a_missing_folder_is_said_before_the_hub_is_asked(tmp_path, path):
    with pytest.raises(FileNotFoundError, match=rf"model\[0\] = '{path}' could not be loaded: no such folder"):
        build_before_loading(tmp_path, model=[path, "no/such-model"])
    with pytest.raises(FileNotFoundError, match=rf"model = '{path}' could not be loaded: no such folder"):
        build_before_loading(tmp_path, model=path, num_agents=2)


def test_an_agent_that_is_not_a_model_is_named_before_loading(tmp_path):
    with pytest.raises(TypeError, match=r"model\[1\] must be a model or a model id, got int: 7"):
        build_before_loading(tmp_path, model=["no/such-model", 7])


@pytest.mark.parametrize("given_tokenizer", [True, False], ids=["model", "tokenizer"])
def test_an_agent_that_cannot_be_loaded_is_named_with_the_loader_error_chained(tmp_path, tiny_model_dir,
                                                                             given_tokenizer):  # fmt: skip
    empty = tmp_path / "empty"  # a folder, but no model or tokenizer in it
    empty.mkdir()
    what = "" if given_tokenizer else "the tokenizer of "
    message = rf"MAGRPOTrainer: {what}model\[1\] = '{re.escape(str(empty))}' could not be loaded: "
    with pytest.raises((OSError, ValueError), match=message) as caught:
        build_before_loading(
            tmp_path,
            model=[tiny_model_dir, str(empty)],
            processing_class=make_tokenizer() if given_tokenizer else None,
        )
    cause = caught.value.__cause__  # the loader's own error, with its traceback, and of the same kind
    assert cause is not None and isinstance(caught.value, OSError) == isinstance(cause, OSError)
