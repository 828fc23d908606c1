"""A PEFT model that arrives with a trained adapter (SFT, then RL): with `beta != 0` its KL reference is a frozen copy
of that adapter, as GRPOTrainer's "ref" adapter, per agent; a fresh adapter from `peft_config` keeps the base as its
reference. The reference's log-probs are compared with GRPOTrainer's and with the untouched adapter's own, before and
after a step and a resume."""

import copy
import os

import pytest
import torch
from conftest import SEED_PROMPTS, assert_same_sgd_step
from datasets import Dataset
from peft import LoraConfig
from safetensors.torch import load_file
from trl import GRPOConfig, GRPOTrainer

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer, joint
from trl_multiagent.demo.testing import ALL_PROJECTIONS, make_model, with_trained_adapter


COMMON = dict(
    num_generations=4, per_device_train_batch_size=8, max_completion_length=8, max_steps=1, logging_steps=1,
    report_to="none", seed=7, beta=0.1, learning_rate=0.5, optim="sgd", lr_scheduler_type="constant",
    max_grad_norm=0.0, use_cpu=True, bf16=False, save_strategy="no",
)  # fmt: skip


def pretrained(tokenizer, seed):
    """A tiny model with a LoRA adapter that is not the identity, as an SFT run leaves one."""
    return with_trained_adapter(make_model(tokenizer, seed=seed), seed)


def chars(completions, **kwargs):
    return [len(c) / 10 for c in completions]


def recording(trainer, rows: list):
    """Record every rollout's batches: GRPOTrainer's one dict, or MAGRPOTrainer's `{"agents": [per agent]}`."""
    generate = trainer._generate_and_score_completions

    def recorded(inputs):
        output = generate(inputs)
        rows.append(output)
        return output

    trainer._generate_and_score_completions = recorded


@torch.no_grad()
def own_logps(model, batch) -> list[torch.Tensor]:
    """Per row, the log-probs `model` gives the row's completion tokens, in a plain forward of the row alone (no
    padding, no fused head, no chunking)."""
    model.eval()
    result = []
    for prompt, prompt_mask, completion, completion_mask in zip(
        batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"], strict=True
    ):
        prompt, completion = prompt[prompt_mask.bool()], completion[completion_mask.bool()]
        if len(completion) == 0:
            result.append(completion.float())
            continue
        logits = model(input_ids=torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : -1]
        result.append(logits.float().log_softmax(-1).gather(-1, completion[:, None])[:, 0])
    return result


def assert_reference_is(batch, model, atol=1e-5):
    """The batch's reference log-probs are `model`'s own, token by token."""
    expected = own_logps(model, batch)
    assert sum(len(e) for e in expected) > 10
    for row, (want, mask) in enumerate(zip(expected, batch["completion_mask"], strict=True)):
        got = batch["ref_per_token_logps"][row][mask.bool()]
        torch.testing.assert_close(got, want, rtol=0, atol=atol, msg=f"row {row}")


def test_one_agents_reference_is_its_pretrained_adapter_as_grpotrainers(tmp_path, tokenizer):
    """Stock GRPOTrainer and MAGRPOTrainer on the same pretrained adapter: the same reference log-probs (the adapter's
    own), KL 0 at the first step, and the same SGD step (the KL's gradient pulls toward the same reference)."""
    data = Dataset.from_dict({"prompt": SEED_PROMPTS})
    stock_model, ours_model = pretrained(tokenizer, 3), pretrained(tokenizer, 3)
    untouched = copy.deepcopy(stock_model)
    before = {k: v.clone() for k, v in stock_model.state_dict().items() if ".default." in k}
    stock_rows, ours_rows = [], []
    stock = GRPOTrainer(
        model=stock_model, reward_funcs=chars, train_dataset=data, processing_class=tokenizer,
        args=GRPOConfig(output_dir=str(tmp_path / "stock"), **COMMON),
    )  # fmt: skip
    recording(stock, stock_rows)
    stock.train()  # each trainer seeds when it is built: the second is built after the first has trained
    ours = MAGRPOTrainer(
        model=ours_model, processing_class=tokenizer, reward_funcs=chars, train_dataset=data,
        args=MAGRPOConfig(output_dir=str(tmp_path / "ours"), early_termination_threshold=None, **COMMON),
    )  # fmt: skip
    assert "ref" in ours_model.peft_config  # GRPOTrainer's name, so TRL code that looks for it finds it
    assert all(torch.equal(v, ours_model.state_dict()[k]) for k, v in before.items())
    recording(ours, ours_rows)
    ours.train()

    stock_batch, ours_batch = stock_rows[0], ours_rows[0]["agents"][0]
    assert torch.equal(ours_batch["completion_ids"], stock_batch["completion_ids"])  # the same rows to compare
    mask = stock_batch["completion_mask"].bool()
    torch.testing.assert_close(
        ours_batch["ref_per_token_logps"][mask], stock_batch["ref_per_token_logps"][mask], rtol=0, atol=1e-5
    )
    assert_reference_is(ours_batch, untouched)
    with untouched.disable_adapter():  # the base, which was the reference before: far from the adapter's
        base = own_logps(untouched, ours_batch)
    assert max((b - a).abs().max().item() for a, b in zip(own_logps(untouched, ours_batch), base, strict=True)) > 0.1
    assert stock.state.log_history[0]["kl"] == 0.0 and ours.state.log_history[0]["kl"] == 0.0
    assert_same_sgd_step(before, stock_model, ours_model)


def test_each_agent_of_a_peft_team_is_referenced_to_its_own_adapter(tmp_path, tokenizer):
    """Two PEFT models with different trained adapters: each agent's reference log-probs are its own adapter's."""
    agents = [pretrained(tokenizer, 3), pretrained(tokenizer, 4)]
    untouched = [copy.deepcopy(a) for a in agents]
    trainer = MAGRPOTrainer(
        model=agents, processing_class=tokenizer, reward_funcs=joint(lambda a, b: [len(x) / 10 for x in a]),
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=MAGRPOConfig(output_dir=str(tmp_path), early_termination_threshold=None, **COMMON),
    )  # fmt: skip
    rows = []
    recording(trainer, rows)
    trainer.train()
    batches = rows[0]["agents"]
    for i in range(2):
        assert_reference_is(batches[i], untouched[i])
    with pytest.raises(AssertionError):  # the two adapters differ: each agent's reference is its own
        assert_reference_is(batches[1], untouched[0])
    assert trainer.state.log_history[0]["kl"] == 0.0
    trainer.save_model(str(tmp_path / "saved"))
    trainer.model.save_pretrained(str(tmp_path / "pretrained"))
    for folder in ("saved", "pretrained"):  # each agent's own adapter, without its reference copy
        for i in range(2):
            saved = load_file(tmp_path / folder / f"agent_{i}" / "adapter_model.safetensors")
            assert len(saved) == len([n for n in untouched[i].state_dict() if ".default." in n])
            assert not any(".ref." in key for key in saved) and not (tmp_path / folder / f"agent_{i}" / "ref").exists()


def test_an_adapter_made_from_peft_config_keeps_the_base_as_its_reference(tmp_path, tokenizer):
    """As GRPOTrainer with `peft_config`: the reference is the base, adapter disabled (here an adapter initialised
    away from the identity, so that the two differ at once)."""
    base = make_model(tokenizer, seed=3)
    untouched = copy.deepcopy(base)
    trainer = MAGRPOTrainer(
        model=base, processing_class=tokenizer, reward_funcs=chars,
        peft_config=LoraConfig(r=4, target_modules=list(ALL_PROJECTIONS), init_lora_weights=False),
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
        args=MAGRPOConfig(output_dir=str(tmp_path), early_termination_threshold=None, **COMMON),
    )  # fmt: skip
    assert set(trainer.model.peft_config) == {"default"}
    rows = []
    recording(trainer, rows)
    trainer.train()
    assert_reference_is(rows[0]["agents"][0], untouched)
    assert trainer.state.log_history[0]["kl"] > 1e-3


def resumable_trainer(tmp_path, tokenizer, agent, max_steps):
    args = MAGRPOConfig(
        output_dir=str(tmp_path / "run"), early_termination_threshold=None,
        **{**COMMON, "max_steps": max_steps, "save_strategy": "steps", "save_steps": 1},
    )  # fmt: skip
    return MAGRPOTrainer(
        model=agent, processing_class=tokenizer, reward_funcs=chars, args=args,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS * 2}),
    )  # fmt: skip


def test_reference_stays_the_pretrained_adapter_after_a_step_and_a_resume(tmp_path, tokenizer):
    """Two steps, a checkpoint after each: every step's reference is the adapter as it arrived, though the policy
    moved; the checkpoint holds the agent's adapter alone (no "ref" copy: GRPOTrainer's would); a run resumed from
    the first checkpoint computes the same reference and ends on the same weights."""
    start = pretrained(tokenizer, 3)
    trainer = resumable_trainer(tmp_path, tokenizer, copy.deepcopy(start), max_steps=2)
    trainable = [name for name, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all(".default." in name for name in trainable)  # the copy trains nothing
    rows = []
    recording(trainer, rows)
    trainer.train()
    assert sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"]) == sum(
        trainer.model.get_parameter(name).numel() for name in trainable
    )
    for output in rows:
        assert_reference_is(output["agents"][0], start)
    moved = [
        name for name in trainable if not torch.allclose(trainer.model.get_parameter(name), start.get_parameter(name))
    ]
    assert len(moved) > len(trainable) // 2  # the policy left the adapter it started from; its reference did not

    checkpoint = tmp_path / "run" / "checkpoint-1"
    saved = load_file(checkpoint / "adapter_model.safetensors")
    assert saved and not any(".ref." in key for key in saved) and not (checkpoint / "ref").exists()
    assert len(saved) == len(trainable)

    resumed = resumable_trainer(tmp_path, tokenizer, copy.deepcopy(start), max_steps=2)
    resumed_rows = []
    recording(resumed, resumed_rows)
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert len(resumed_rows) == 1
    assert torch.equal(resumed_rows[0]["agents"][0]["completion_ids"], rows[1]["agents"][0]["completion_ids"])
    assert_reference_is(resumed_rows[0]["agents"][0], start)
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(resumed.model.get_parameter(name), p, rtol=0, atol=1e-6, msg=name)
    assert not any(os.path.exists(tmp_path / "run" / f"checkpoint-{s}" / "ref") for s in (1, 2))


@pytest.mark.parametrize("team", ["one", "copies", "list"])
def test_a_peft_model_with_peft_config_is_refused_as_grpotrainer_refuses(tmp_path, tokenizer, team):
    """A second adapter would wrap the trained one (GRPOTrainer refuses the pair); refused before anything trains."""
    agent = pretrained(tokenizer, 3)
    model = {"one": {"model": agent}, "copies": {"model": agent, "num_agents": 2}, "list": {"model": [agent, agent]}}
    reward = chars if team == "one" else joint(lambda a, b: [0.0] * len(a))
    with pytest.raises(ValueError, match=r"model(\[0\])? is a `PeftModel` and `peft_config` was given too"):
        MAGRPOTrainer(
            **model[team], processing_class=tokenizer, reward_funcs=reward, peft_config=LoraConfig(r=4),
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
            args=MAGRPOConfig(output_dir=str(tmp_path), early_termination_threshold=None, **COMMON),
        )  # fmt: skip
