"""One learning rate per agent (`MAGRPOConfig.agent_learning_rates`, `team/optimizer.py`): the optimizer's groups, one
SGD step, the scheduler, resume, the refusals, and (slow) 2 processes under DDP and ZeRO-2."""

import os
from types import SimpleNamespace

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback, length_ratio_reward
from datasets import Dataset
from peft import LoraConfig
from transformers import TrainerCallback

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.arguments import check_agent_learning_rates
from trl_multiagent.demo.testing import make_model
from trl_multiagent.team.optimizer import agent_parameter_groups


LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def make_trainer(tmp_path, tokenizer, shared=False, prompts=SEED_PROMPTS, callbacks=None, **overrides):
    """A 2-agent team: separate tiny models, or one tiny base with a LoRA adapter per agent (`shared`). One turn,
    2 prompts per step."""
    values = dict(
        output_dir=str(tmp_path / "run"), num_generations=2, per_device_train_batch_size=4, max_new_tokens=4,
        max_steps=1, logging_steps=1, report_to="none", seed=0, num_turns=1, save_strategy="no",
        learning_rate=1.0, optim="sgd", lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=0.0,
        check_functions_before_training=False,
    )  # fmt: skip
    values.update(overrides)
    team = (
        {"model": make_model(tokenizer, seed=0), "num_agents": 2, "peft_config": LoraConfig(**LORA)}
        if shared
        else {"model": [make_model(tokenizer, seed=i) for i in range(2)]}
    )
    return MAGRPOTrainer(
        **team, processing_class=tokenizer, reward_funcs=length_ratio_reward, external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": prompts}), args=MAGRPOConfig(**values), callbacks=callbacks,
    )  # fmt: skip


def group_of(optimizer, parameter):
    """The one group holding `parameter` (by identity), or None."""
    found = [g for g in optimizer.param_groups if any(p is parameter for p in g["params"])]
    assert len(found) <= 1
    return found[0] if found else None


def agent_lrs(trainer):
    """Each agent's learning rates, read from the groups that hold its trainable parameters."""
    return [
        sorted({group_of(trainer.optimizer, p)["lr"] for p in trainer.team.agent_parameters(i) if p.requires_grad})
        for i in range(trainer.num_agents)
    ]


@pytest.mark.parametrize("shared", [False, True], ids=["separate-models", "shared-base-lora"])
def test_each_agent_parameters_are_in_groups_at_its_rate(tmp_path, tokenizer, shared):
    trainer = make_trainer(tmp_path, tokenizer, shared, agent_learning_rates=[0.25, 0.75], weight_decay=0.1)
    optimizer = trainer.create_optimizer()
    assert isinstance(optimizer, torch.optim.SGD)  # `optim` still picks the class
    team, decay = trainer.team, set(trainer.get_decay_parameter_names(trainer.model))
    name_of = {id(p): n for n, p in trainer.model.named_parameters()}
    grouped = {id(p) for g in optimizer.param_groups for p in g["params"]}
    trainable = {id(p) for p in trainer.model.parameters() if p.requires_grad}
    assert grouped == trainable and sum(len(g["params"]) for g in optimizer.param_groups) == len(trainable)
    for i, rate in enumerate([0.25, 0.75]):
        own = [p for p in team.agent_parameters(i) if p.requires_grad]
        assert own
        for p in own:
            group = group_of(optimizer, p)
            assert group["lr"] == rate
            assert group["weight_decay"] == (0.1 if name_of[id(p)] in decay else 0.0)
    # Per agent, a group with weight decay and (for a full model: norms take none) one without, and nothing else.
    expected = [(0.25, 0.1), (0.75, 0.1)] if shared else [(0.25, 0.0), (0.25, 0.1), (0.75, 0.0), (0.75, 0.1)]
    assert sorted((g["lr"], g["weight_decay"]) for g in optimizer.param_groups) == expected
    if shared:  # the base is frozen and in no group; the adapters are the agents
        base = [p for n, p in trainer.model.named_parameters() if "lora_" not in n]
        assert base and all(group_of(optimizer, p) is None for p in base)


@pytest.mark.parametrize("shared", [False, True], ids=["separate-models", "shared-base-lora"])
def test_a_frozen_agent_has_no_group(tmp_path, tokenizer, shared):
    trainer = make_trainer(tmp_path, tokenizer, shared, agent_learning_rates=[0.25, 0.75], trainable_agents=[1])
    optimizer = trainer.create_optimizer()
    assert all(group_of(optimizer, p) is None for p in trainer.team.agent_parameters(0))
    assert [g["lr"] for g in optimizer.param_groups] == ([0.75] if shared else [0.75, 0.75])  # decay, no decay


def test_without_rates_the_optimizer_is_the_trainers(tmp_path, tokenizer):
    optimizer = make_trainer(tmp_path, tokenizer, learning_rate=0.5).create_optimizer()
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.5]  # the Trainer's two groups (decay, no decay)


class Recorder(TrainerCallback):
    """The gradients just before each optimizer step, and the groups' learning rates after each step."""

    def __init__(self):
        self.grads, self.lrs = [], {}

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.grads.append({id(p): p.grad.detach().clone() for p in model.parameters() if p.grad is not None})

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self.lrs[state.global_step] = [g["lr"] for g in optimizer.param_groups]


@pytest.mark.parametrize(
    ("shared", "rates"), [(False, [0.3, 0.0]), (True, [2.0, 7.0])], ids=["separate-models", "shared-base-lora"]
)
def test_one_sgd_step_moves_each_agent_by_its_rate_times_its_gradient(tmp_path, tokenizer, shared, rates):
    recorder = Recorder()
    # learning_rate=1.0 is no agent's rate: a step at it would move each agent by its whole gradient.
    trainer = make_trainer(tmp_path, tokenizer, shared, callbacks=[recorder], agent_learning_rates=rates)
    before = [[p.detach().clone() for p in trainer.team.agent_parameters(i)] for i in range(2)]
    trainer.train()
    (grads,) = recorder.grads
    for i, rate in enumerate(rates):
        moved = 0
        for start, p in zip(before[i], trainer.team.agent_parameters(i), strict=True):
            if not p.requires_grad:
                assert torch.equal(p, start)
                continue
            grad = grads[id(p)]
            torch.testing.assert_close(p.detach() - start, -rate * grad, rtol=1e-5, atol=1e-7)
            moved += int(grad.abs().sum() > 0)
        assert moved > 0  # the agent had a gradient: only its rate decides whether and how far it moves
        if rate == 0.0:
            assert all(torch.equal(p, s) for s, p in zip(before[i], trainer.team.agent_parameters(i), strict=True))


def test_a_linear_schedule_scales_every_agent_rate_by_the_same_factor(tmp_path, tokenizer):
    recorder = Recorder()
    trainer = make_trainer(
        tmp_path, tokenizer, callbacks=[recorder], agent_learning_rates=[0.02, 0.06], lr_scheduler_type="linear",
        max_steps=3, learning_rate=1.0,
    )  # fmt: skip
    trainer.train()
    for step, factor in [(1, 2 / 3), (2, 1 / 3)]:  # after step k of 3, linear decay to 0 leaves (3 - k) / 3
        lrs = recorder.lrs[step]
        rates = [0.02] * 2 + [0.06] * 2  # agent 0's two groups, then agent 1's
        assert lrs == pytest.approx([r * factor for r in rates], rel=1e-12, abs=0), (step, lrs)


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = state.global_step >= self.step


def test_resume_continues_with_the_same_rates_and_weights(tmp_path, tokenizer, caplog):
    # 8 prompts, 2 per step: 4 steps end inside the first epoch (as tests/test_teams.py's resume test). AdamW, so the
    # optimizer's state must come back too; a linear schedule, so the rates at steps 3 and 4 are not the initial ones.
    rates = [0.02, 0.005]
    common = dict(
        prompts=SEED_PROMPTS * 2, agent_learning_rates=rates, optim="adamw_torch", lr_scheduler_type="linear",
        max_steps=4, save_strategy="steps", save_steps=2,
    )  # fmt: skip

    def run(name, resume=None, stop_at=None, **changed):
        recorder = Recorder()
        callbacks = [recorder, StopAt(stop_at)] if stop_at else [recorder]
        trainer = make_trainer(tmp_path / name, tokenizer, callbacks=callbacks, **{**common, **changed})
        trainer.train(resume_from_checkpoint=resume)
        return trainer, recorder

    full, full_lrs = run("full")
    run("part", stop_at=2)
    checkpoint = str(tmp_path / "part" / "run" / "checkpoint-2")
    resumed, resumed_lrs = run("resumed", resume=checkpoint)
    assert sorted(resumed_lrs.lrs) == [3, 4]
    for step in (3, 4):
        factor = (4 - step) / 4
        expected = [rates[0] * factor] * 2 + [rates[1] * factor] * 2
        assert full_lrs.lrs[step] == pytest.approx(expected, rel=1e-12, abs=0)
        assert resumed_lrs.lrs[step] == full_lrs.lrs[step]
    assert [g["initial_lr"] for g in resumed.optimizer.param_groups] == [rates[0]] * 2 + [rates[1]] * 2
    for i in range(2):
        for a, b in zip(full.team.agent_parameters(i), resumed.team.agent_parameters(i), strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert "not applied" not in caplog.text  # the same rates: nothing to say
    # The checkpoint's rates are the ones restored (optimizer and scheduler state), whatever the resumed config says,
    # and the run says so.
    _, changed_lrs = run("changed", resume=checkpoint, agent_learning_rates=[1.0, 1.0])
    assert changed_lrs.lrs == resumed_lrs.lrs
    assert (
        "resuming at step 2 with the learning rates saved in the checkpoint (per optimizer group: [0.02, 0.02, 0.005, "
        "0.005]); agent_learning_rates=[1.0, 1.0] asks for [1.0, 1.0, 1.0, 1.0] and is not applied"
    ) in caplog.text


def test_a_trainable_parameter_of_no_agent_is_refused():
    agent, stray = torch.nn.Linear(2, 2), torch.nn.Parameter(torch.zeros(2))
    model = torch.nn.Module()
    model.agent, model.stray = agent, stray
    team = SimpleNamespace(agent_parameters=lambda i: list(agent.parameters()))
    with pytest.raises(ValueError, match=r"1 trainable parameter\(s\) belong to no agent \(first: 'stray'\)"):
        agent_parameter_groups(team, model, [0.1], decay_names=["agent.weight"], weight_decay=0.0)
    stray.requires_grad_(False)
    groups = agent_parameter_groups(team, model, [0.1], decay_names=["agent.weight"], weight_decay=0.5)
    assert [(g["params"], g["lr"], g["weight_decay"]) for g in groups] == [
        ([agent.weight], 0.1, 0.5), ([agent.bias], 0.1, 0.0),
    ]  # fmt: skip


@pytest.mark.parametrize(
    "optimizer_cls_and_kwargs",
    [(torch.optim.SGD, {"lr": 1.0, "params": []}), (lambda: None, {"lr": 1.0})],
    ids=["builds-its-own-groups", "factory"],
)
def test_an_optim_that_groups_the_parameters_itself_is_refused(tmp_path, tokenizer, optimizer_cls_and_kwargs):
    trainer = make_trainer(tmp_path, tokenizer, agent_learning_rates=[0.1, 0.2])
    trainer.optimizer_cls_and_kwargs = optimizer_cls_and_kwargs  # as `optim="galore_adamw"` or a Muon factory give
    with pytest.raises(ValueError, match=r"agent_learning_rates needs an optimizer built from parameter groups"):
        trainer.create_optimizer()


def test_a_rate_count_that_is_not_the_team_size_is_refused_before_loading(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"agent_learning_rates has 3 rates for a team of 2 agents"):
        MAGRPOTrainer(
            model=["no/such-model-a", "no/such-model-b"], processing_class=tokenizer, reward_funcs=length_ratio_reward,
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}),
            args=MAGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4,
                              report_to="none", agent_learning_rates=[0.1, 0.2, 0.3]),
        )  # fmt: skip


def test_an_optimizer_given_with_rates_is_refused_before_loading(tmp_path, tokenizer):
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)

    def build(**overrides):
        return MAGRPOTrainer(
            model=["/nope/agent_0", "/nope/agent_1"], processing_class=tokenizer, reward_funcs=length_ratio_reward,
            train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), optimizers=(optimizer, None),
            args=MAGRPOConfig(output_dir=str(tmp_path), num_generations=2, per_device_train_batch_size=4,
                              report_to="none", **overrides),
        )  # fmt: skip

    with pytest.raises(ValueError, match=r"`optimizers=` gives an optimizer, and MAGRPOConfig\.agent_learning_rates"):
        build(agent_learning_rates=[0.1, 0.2])
    # Without rates the check lets it through, to the team's own checks (before any model is loaded too).
    with pytest.raises(FileNotFoundError, match=r"model\[0\] = '/nope/agent_0' could not be loaded: no such folder"):
        build()


def deepspeed_args(config, rates=(0.1, 0.2)):
    """What `check_agent_learning_rates` reads of a config built with `deepspeed=config` (or under `accelerate
    launch` with a DeepSpeed config file): the plugin's config."""
    return SimpleNamespace(
        agent_learning_rates=list(rates) if rates else None,
        deepspeed_plugin=SimpleNamespace(deepspeed_config=config) if config is not None else None,
    )


@pytest.mark.parametrize(
    ("config", "refused"),
    [
        ({"optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}, r'"optimizer" \(AdamW\)'),
        ({"scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}}}, r'"scheduler" \(WarmupLR\)'),
        ({"optimizer": {"type": "Adam"}, "scheduler": {"type": "WarmupDecayLR"}}, r'"optimizer" \(Adam\) and "sch'),
        ({"zero_optimization": {"stage": 2}, "scheduler": {"type": "WarmupCosineLR"}}, None),
        ({"zero_optimization": {"stage": 3}}, None),
        (None, None),  # no DeepSpeed
    ],
    ids=["optimizer", "scheduler", "both", "ratio-keeping-scheduler", "zero-only", "no-deepspeed"],
)
def test_a_deepspeed_config_that_would_replace_the_rates_is_refused(config, refused):
    if refused is None:
        check_agent_learning_rates(deepspeed_args(config), (None, None))
    else:
        with pytest.raises(ValueError, match=rf"agent_learning_rates=\[0.1, 0.2\] .*DeepSpeed config has {refused}"):
            check_agent_learning_rates(deepspeed_args(config), (None, None))
    check_agent_learning_rates(deepspeed_args(config, rates=None), (None, None))  # no rates: DeepSpeed's own is fine


@pytest.mark.slow
@pytest.mark.distributed
def test_two_processes_train_at_the_agents_rates_under_ddp_and_zero(tmp_path):
    """tests/distributed/run_length_ratio.py (SGD at a constant rate, 2 steps) with agent 0 at 0.5 and agent 1 at 0: on
    every rank the optimizer's groups hold those rates, the ranks end identical, agent 1 never moves and agent 0 does,
    and ZeRO-2 and ZeRO-3 (the Trainer's optimizer inside DeepSpeed's; ZeRO-3 partitions each agent's parameters)
    reach DDP's weights."""
    pytest.importorskip("deepspeed")
    from test_distributed import DS_CONFIGS, assert_same, finished, initial_weights

    start = initial_weights()
    runs = {}
    zero = {f"zero{stage}": ("--deepspeed", os.path.join(DS_CONFIGS, f"ds_zero{stage}.json")) for stage in (2, 3)}
    for name, extra in [("ddp", ()), *zero.items()]:
        info, weights = finished(tmp_path / name, "--max_steps", 2, "--agent_learning_rates", 0.5, 0.0, *extra)
        assert info["num_processes"] == 2
        assert info["group_lrs"] == [[0.5, 0.5, 0.0, 0.0]] * 2, (name, info["group_lrs"])  # per rank: 2 groups each
        assert_same(weights[0], weights[1], rtol=0, atol=0)
        assert all(torch.equal(weights[0][k], start[k]) for k in start if k.startswith("1."))
        assert max((weights[0][k] - start[k]).abs().max().item() for k in start if k.startswith("0.")) > 1e-4
        runs[name] = weights[0]
    for stage in zero:
        assert_same(runs[stage], runs["ddp"], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_deepspeed_optimizer_section_is_refused_under_launch(tmp_path):
    import json

    from test_distributed import DS_CONFIGS, launch

    with open(os.path.join(DS_CONFIGS, "ds_zero2.json")) as f:
        config = json.load(f)
    config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto"}}
    path = tmp_path / "ds_with_optimizer.json"
    path.write_text(json.dumps(config))
    result, _ = launch(tmp_path / "run", "--max_steps", 1, "--agent_learning_rates", "0.5", "0.1", "--deepspeed", path)
    assert result.returncode != 0
    assert 'the DeepSpeed config has "optimizer" (AdamW)' in result.stderr
