"""CoMLRL 1.4.3's actor-critic trainers in the CoMLRL face (`IACTrainer`, `MAACTrainer`): their configs' names,
defaults and refusals (one generation per prompt accepted), and one training step of each on tiny models, in which
the actors' loss receives the critic's TD advantages on its rollout-time values (worked by hand here), the value loss
reaches only the critics and the policy loss only the actors, the critics take a hand-computed AdamW step, and
CoMLRL's metric names are logged. CoMLRL's numbers are read from its 1.4.3 source
(comlrl/trainers/actor_critic/{ac_base,iac,maac}.py)."""

import copy
import inspect
import math

import pytest
import torch

from trl_multiagent.comlrl import IACConfig, IACTrainer, MAACConfig, MAACTrainer, MAGRPOConfig
from trl_multiagent.critic.learner import CriticModel, CriticSettings, TeamCritic
from trl_multiagent.critic.value_head import last_hidden
from trl_multiagent.demo.testing import make_model


# CoMLRL 1.4.3's defaults of the fields both configs have (IACConfig / MAACConfig)
COMLRL_DEFAULTS = {
    "agent_learning_rate": 5e-6,
    "critic_learning_rate": 5e-6,
    "rollout_buffer_size": 8,
    "value_loss_coef": 0.6,
    "advantage_normalization": True,
    "max_new_tokens": 256,
    "temperature": 0.6,
    "top_p": 0.6,
    "num_train_epochs": 40,
    "critic_type": "v",
    "num_agents": 2,
    "num_turns": 2,
    "parallel_training": "none",
    "discount": 1.0,
    "num_generations": 1,
    "eval_interval": 16,
    "eval_num_samples": 4,
    "early_termination_threshold": -0.2,
    "logging_steps": 1,
    "reference_kl_enabled": False,
    "reference_kl_coef": 0.1,
}
IAC_ONLY = {"value_clip_range": 0.2, "use_separate_critic": True, "critic_value_head_hidden_dim": None}
# CoMLRL's trainers' parameters, in order (both trainers share them)
COMLRL_PARAMETERS = [
    "agent_model", "critic_model", "tokenizer", "reward_func", "reward_processor", "formatters", "args",
    "train_dataset", "eval_dataset", "model_config", "wandb_config", "metrics_callback", "external_transition",
    "agents", "critics",
]  # fmt: skip
DISCOUNT = 0.5
PROMPTS = [{"prompt": "count to three"}, {"prompt": "name a colour"}, {"prompt": "say hi"}]


@pytest.mark.parametrize("config_cls, extra", [(IACConfig, IAC_ONLY), (MAACConfig, {})])
def test_configs_have_comlrls_defaults_and_accept_one_generation(config_cls, extra, tmp_path):
    config = config_cls(str(tmp_path))
    for name, value in {**COMLRL_DEFAULTS, **extra}.items():
        assert getattr(config, name) == value, name
    assert config.top_k == 0 and config.learning_rate == 5e-6  # CoMLRL's None (no top-k); agent_learning_rate
    # rollout_buffer_size=8 tree nodes of an agent, a tree of two turns with K=1 has 2: four prompts per step
    assert (config.per_device_train_batch_size, config.steps_per_generation) == (4, 1)
    with pytest.raises(ValueError, match="num_generations must be >= 2, got 1"):
        MAGRPOConfig(str(tmp_path), num_generations=1)  # the group's baseline needs two
    assert isinstance(config, MAGRPOConfig)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"use_vllm": True}, "use_vllm=True is refused"),
        ({"joint_mode": "cross"}, "joint_mode='cross' is refused"),
        ({"num_generations": 2}, "Multi-turn IAC currently supports num_generations == 1"),
        ({"critic_type": "w"}, "critic_type must be one of: 'v', 'q'"),
        ({"use_separate_critic": False, "critic_type": "q", "mask_truncated_completions": True}, "the mask hides"),
        ({"value_clip_range": -0.1}, "value_clip_range must be >= 0 or None, got -0.1"),
        ({"use_separate_critic": False, "max_grad_norm": 1.0}, "max_grad_norm=1.0 with use_separate_critic=False"),
        ({"deepspeed": "ds_zero2.json"}, "deepspeed='ds_zero2.json' is refused: the critics are not DeepSpeed"),
        ({"advantage_mode": "rloo"}, "advantage_mode='rloo' is refused"),
        ({"reference_kl_enabled": True}, "reference_kl_enabled=True is refused"),
        ({"branching": "best"}, "branching='best' is refused"),
        # GRPOConfig's own refusals stay: only its refusal of one generation is caught
        ({"generation_batch_size": 8}, "'generation_batch_size' and 'steps_per_generation' can not be both"),
    ],
)
def test_iac_config_refuses_what_is_not_built_or_comlrl_refuses(change, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        IACConfig(str(tmp_path), **change)


def test_critic_learning_rate_none_is_the_agents_in_iac(tmp_path):
    assert IACConfig(str(tmp_path), agent_learning_rate=1e-3, critic_learning_rate=None).critic_learning_rate == 1e-3


@pytest.mark.parametrize("config_cls", [IACConfig, MAACConfig])
def test_mp_training_needs_both_device_lists_and_accepts_them(config_cls, tmp_path):
    """CoMLRL's rule: parallel_training='mp' needs agent_devices and critic_devices; given both, it is accepted."""
    config = config_cls(str(tmp_path), parallel_training="mp", agent_devices="cpu", critic_devices="cpu")
    assert (config.agent_devices, config.critic_devices) == ("cpu", "cpu")
    with pytest.raises(ValueError, match="requires explicit critic_devices"):
        config_cls(str(tmp_path), parallel_training="mp", agent_devices="cpu")
    with pytest.raises(ValueError, match=rf"^{config_cls.__name__}: parallel_training='mp' .* needs agent_devices"):
        config_cls(str(tmp_path), parallel_training="mp", critic_devices="cpu")


@pytest.mark.parametrize("trainer_cls, config_cls, count", [(IACTrainer, IACConfig, 2), (MAACTrainer, MAACConfig, 1)])
def test_a_wrong_number_of_critics_is_refused_in_comlrls_words(trainer_cls, config_cls, count, tmp_path, tokenizer):
    models = [make_model(tokenizer, seed=0), make_model(tokenizer, seed=1), make_model(tokenizer, seed=2)]
    with pytest.raises(ValueError, match=rf"{trainer_cls.__name__}: critics length \(3\) must be {count}"):
        trainer_cls(
            agents=models[:2],
            critics=models,
            tokenizer=tokenizer,
            reward_func=score,
            args=config_cls(str(tmp_path), num_turns=1),
        )


@pytest.mark.parametrize(
    "late, message",
    [
        ({"reference_kl_enabled": True}, "reference_kl_enabled=True is refused"),
        ({"branching": "top"}, "branching='top'"),
        ({"use_separate_critic": False, "max_grad_norm": 1.0}, "max_grad_norm=1.0 with use_separate_critic=False"),
    ],
)
def test_a_setting_not_built_is_refused_at_build_when_set_after_the_config(late, message, tmp_path, tokenizer):
    args = IACConfig(str(tmp_path), num_turns=1)
    for name, value in late.items():
        setattr(args, name, value)
    models = [make_model(tokenizer, seed=seed) for seed in range(4)]
    critics = models[2:] if args.use_separate_critic else None  # value heads on the actors take none
    with pytest.raises(ValueError, match=message):
        IACTrainer(agents=models[:2], critics=critics, tokenizer=tokenizer, reward_func=score, args=args)


@pytest.mark.parametrize("trainer_cls", [IACTrainer, MAACTrainer])
def test_trainer_signatures_are_comlrls(trainer_cls):
    assert list(inspect.signature(trainer_cls).parameters)[: len(COMLRL_PARAMETERS)] == COMLRL_PARAMETERS


def score(completions1, completions2):
    """Differs between answers (the tiny models' answers all have max_new_tokens tokens)."""
    return [float(sum(map(ord, a + b)) % 7) for a, b in zip(completions1, completions2, strict=True)]


def one_step(trainer_cls, config_cls, tmp_path, tokenizer, critic_type, critics, **config):
    values = dict(
        output_dir=str(tmp_path / "run"), max_new_tokens=3, num_train_epochs=1, eval_interval=0,
        early_termination_threshold=None, report_to="none", seed=0, agent_learning_rate=1e-3,
        critic_learning_rate=1e-2, rollout_buffer_size=6, discount=DISCOUNT, critic_type=critic_type,
        value_loss_coef=0.6, update_chunk_size=12,  # one loss call per agent
    )  # fmt: skip
    args = config_cls(**{**values, **config})
    trainer = trainer_cls(
        agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)],
        critics=[make_model(tokenizer, seed=2 + i) for i in range(critics)],
        tokenizer=tokenizer,
        reward_func=score,
        external_transition=lambda **_: ["next a", "next b"],
        train_dataset=PROMPTS,
        args=args,
        metrics_callback=lambda samples: seen["callbacks"].append(samples) or {"samples": len(samples), "bad": "x"},
    )
    seen = {"values": [], "updates": [], "advantages": [], "actor_grads_after_update": [], "callbacks": []}
    critic = trainer.critic
    values, update, loss = critic.values, critic.update, trainer._compute_loss

    def recorded_values(tree):
        result = values(tree)
        seen["values"].append(result[0].clone())
        seen["tree"] = tree
        return result

    def recorded_update(inputs, targets, turns, batch_size=None):
        seen["critics_before"] = copy.deepcopy(critic.critics)
        seen["updates"].append((inputs, targets.clone(), list(turns)))
        result = update(inputs, targets, turns, batch_size)
        actors = [p for p in trainer.model.parameters() if p.grad is not None and bool(p.grad.any())]
        seen["actor_grads_after_update"].append(len(actors))
        seen["critic_grads"] = [p.grad.clone() for c in critic.critics for p in c.parameters()]
        seen["losses"] = result
        return result

    def recorded_loss(model, inputs):
        seen["advantages"].append(row_keys(inputs, tokenizer.pad_token_id))
        return loss(model, inputs)

    critic.values, critic.update, trainer._compute_loss = recorded_values, recorded_update, recorded_loss
    actors_before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    assert trainer.state.global_step == 1 and len(seen["values"]) == 1 and len(seen["updates"]) == 1
    seen["actors_changed"] = any(
        not torch.equal(b, p) for b, p in zip(actors_before, trainer.model.parameters(), strict=True)
    )
    return trainer, seen


def row_keys(inputs, pad: int) -> list:
    """Each row of a loss call as (its prompt's ids, its completion's ids, its advantage), sorted: the update runs
    the rows in an order of its own."""
    rows = []
    for i in range(inputs["prompt_ids"].size(0)):
        prompt = inputs["prompt_ids"][i][inputs["prompt_mask"][i].bool()].tolist()
        completion = inputs["completion_ids"][i].tolist()
        while completion and completion[-1] == pad:
            completion.pop()
        rows.append((tuple(prompt), tuple(completion), float(inputs["advantages"][i])))
    return sorted(rows)


def node_keys(tree, agent: int, advantages: list, pad: int) -> list:
    rows = []
    for node, advantage in zip(tree.nodes, advantages, strict=True):
        completion = list(node.completion_ids[agent][0])
        while completion and completion[-1] == pad:
            completion.pop()
        rows.append((tuple(node.prompt_ids[agent][0]), tuple(completion), advantage))
    return sorted(rows)


def zscore(values):
    mean = sum(values) / len(values)
    std = max(math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)), 1e-6)
    return [(v - mean) / std for v in values]


def hand_advantages(tree, values):
    """CoMLRL's TD(0) advantages by hand, K=1: per agent, ``reward + discount * value of the next turn's sample`` (the
    reward alone at the last turn), less the value; standardised per agent over the samples of a turn."""
    rows = values if values.dim() == 2 else values.expand(2, -1)
    out = []
    for agent in range(2):
        adv = []
        for a, action in enumerate(tree.joint_actions):
            nxt = 0.0 if action.child is None else float(rows[agent, tree.nodes[action.child].joint_actions[0]])
            adv.append(action.reward + DISCOUNT * nxt - float(rows[agent, a]))
        turns = [tree.nodes[a.node].turn for a in tree.joint_actions]
        for turn in set(turns):
            members = [a for a, t in enumerate(turns) if t == turn]
            for a, z in zip(members, zscore([adv[a] for a in members]), strict=True):
                adv[a] = z
        # the actors' rows are node-major, one per node with K=1
        out.append([adv[node.joint_actions[0]] for node in tree.nodes])
    return out


def hand_adamw(model, lr, loss):
    """One AdamW step from a fresh state, by hand: ``p (1 - lr wd) - lr m/(sqrt(v) + eps)`` with ``m = g``,
    ``v = g^2`` after bias correction (torch's defaults: weight decay 0.01, eps 1e-8), no clipping."""
    model.zero_grad()
    loss.backward()
    return [p.detach() * (1 - lr * 0.01) - lr * p.grad / (p.grad.abs() + 1e-8) for p in model.parameters()]


@pytest.mark.parametrize(
    "trainer_cls, config_cls, critic_type, critics",
    [(IACTrainer, IACConfig, "q", 2), (MAACTrainer, MAACConfig, "v", 1)],
)
def test_one_step_takes_the_critics_advantages_and_updates_each_side_apart(
    trainer_cls, config_cls, critic_type, critics, tmp_path, tokenizer
):
    trainer, seen = one_step(trainer_cls, config_cls, tmp_path, tokenizer, critic_type, critics)
    tree, values = seen["tree"], seen["values"][0]
    assert len(tree.nodes) == 2 * len(PROMPTS) and values.shape == ((2, 6) if critics == 2 else (6,))
    # (a) the actors' loss received the TD advantages of the rollout-time values (agent 0's rows, then agent 1's)
    expected = hand_advantages(tree, values)
    for agent, got in enumerate(seen["advantages"]):
        want = node_keys(tree, agent, expected[agent], tokenizer.pad_token_id)
        assert [row[:2] for row in got] == [row[:2] for row in want], agent
        assert [row[2] for row in got] == pytest.approx([row[2] for row in want], abs=1e-5), agent
    # MAAC's critic reads the joint prompt as CoMLRL writes it, with the first agent's tokenizer
    inputs, targets, turns = seen["updates"][0]
    if critics == 1:
        prompts = tree.action_prompts(0)
        text = f"[Agent 0] {prompts[0]}\n\n[Agent 1] {prompts[1]}"
        assert inputs[0][0] == tokenizer(text, truncation=True)["input_ids"]
    # (b) the value loss's backward left no gradient on the actors; the policy loss's none on the critics (their
    # gradients after the step are the value loss's), and each optimizer holds only its own side's parameters
    assert seen["actor_grads_after_update"] == [0] and seen["actors_changed"]
    after = [p.grad for c in trainer.critic.critics for p in c.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(after, seen["critic_grads"], strict=True))
    actor_ids = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    critic_ids = {id(p) for c in trainer.critic.critics for p in c.parameters()}
    assert actor_ids and critic_ids and not actor_ids & critic_ids
    assert {id(p) for o in trainer.critic.optimizers for g in o.param_groups for p in g["params"]} == critic_ids
    # each critic took one step per agent and turn (MAAC's one critic: once per agent, as CoMLRL's `_ac_step`)
    assert len(seen["losses"]) == 2 * 2 and sorted(set(turns)) == [1, 2]
    # CoMLRL's metrics_callback: once per row, with that row's samples (each agent's, each turn's) as CoMLRL's
    # RolloutSample gives them; its numbers logged, the rest left out
    assert len(seen["callbacks"]) == len(PROMPTS)
    for samples in seen["callbacks"]:
        assert [(s.agent_idx, s.metadata["turn_idx"]) for s in samples] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        first = next(a for a, action in enumerate(tree.joint_actions) if action.node == tree.nodes.index(
            next(n for n in tree.nodes if n.turn == 1 and n.prompts[0] == samples[0].prompt)))  # fmt: skip
        value = values[first] if values.dim() == 1 else values[0, first]
        assert float(samples[0].old_value) == pytest.approx(float(value))
        assert samples[0].metadata["batch_item"]["prompt"] in samples[0].prompt
    # (d) CoMLRL's metric names; the logged returns are its undiscounted sums (turn 1: both turns' rewards)
    logs = trainer.state.log_history[0]
    assert logs["samples"] == 4 and "bad" not in logs
    for t in (1, 2):
        assert f"turn_{t}/reward_mean" in logs and f"turn_{t}/expected_return" in logs
    both = [a.reward + tree.joint_actions[tree.nodes[a.child].joint_actions[0]].reward for a in tree.joint_actions
            if a.child is not None]  # fmt: skip
    assert logs["turn_1/expected_return"] == pytest.approx(sum(both) / len(both))
    # the logged value loss is value_loss_coef times the mean squared TD error, averaged over the critics' steps
    assert logs["critic/value_loss"] == pytest.approx(sum(seen["losses"]) / len(seen["losses"]))


def test_each_iac_critic_takes_a_hand_computed_adamw_step(tmp_path, tokenizer):
    """One turn: each agent's critic takes one step, on all its samples; by hand, from the critic before the update,
    on ``value_loss_coef * mean((target - value)^2)``, the target the reward (no next turn)."""
    trainer, seen = one_step(IACTrainer, IACConfig, tmp_path, tokenizer, "v", 2, num_turns=1, rollout_buffer_size=3)
    inputs, targets, turns = seen["updates"][0]
    tree = seen["tree"]
    assert targets.tolist() == [[a.reward for a in tree.joint_actions]] * 2 and turns == [1, 1, 1]
    for agent, before in enumerate(seen["critics_before"]):
        values = trainer.critic._values(before, inputs[agent])
        loss = 0.6 * ((targets[agent] - values) ** 2).mean()
        assert seen["losses"][agent] == pytest.approx(float(loss))
        expected = hand_adamw(before, 1e-2, loss)
        after = list(trainer.critic.critics[agent].parameters())
        for e, a in zip(expected, after, strict=True):
            torch.testing.assert_close(a.detach(), e, atol=1e-6, rtol=1e-5)


def test_an_interrupted_and_resumed_run_equals_an_uninterrupted_one_critics_included(tmp_path, tokenizer):
    """Two steps, and the same run resumed from its first step's checkpoint: every actor and critic weight, and the
    critics' AdamW moments, are the same; `critics.pt` and `critic_optimizers.pt` are in each checkpoint."""

    def build(folder):
        args = MAACConfig(
            output_dir=str(folder), max_new_tokens=3, num_train_epochs=2, eval_interval=0, num_turns=1,
            early_termination_threshold=None, report_to="none", seed=0, agent_learning_rate=1e-3,
            critic_learning_rate=1e-2, rollout_buffer_size=3, save_strategy="steps", save_steps=1,
        )  # fmt: skip
        return MAACTrainer(
            agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)],
            critics=[make_model(tokenizer, seed=2)],
            tokenizer=tokenizer,
            reward_func=score,
            train_dataset=PROMPTS,
            args=args,
        )

    whole = build(tmp_path / "whole")
    whole.train()
    first = tmp_path / "whole" / "checkpoint-1"
    assert whole.state.global_step == 2 and {"critics.pt", "critic_optimizers.pt"} <= {p.name for p in first.iterdir()}
    resumed = build(tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(tmp_path / "whole" / "checkpoint-1"))
    assert resumed.state.global_step == 2
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    for a, b in zip(whole.critic.weights()[0].values(), resumed.critic.weights()[0].values(), strict=True):
        torch.testing.assert_close(a, b)
    saved, again = whole.critic.optimizer_states()[0], resumed.critic.optimizer_states()[0]
    moments = [(s["exp_avg"], s["exp_avg_sq"], s["step"]) for s in saved["state"].values()]
    moments_again = [(s["exp_avg"], s["exp_avg_sq"], s["step"]) for s in again["state"].values()]
    torch.testing.assert_close(moments, moments_again)
    assert float(moments[0][2]) == 2 * 2  # one step per agent, per training step


def test_an_iac_critic_must_read_its_agents_token_ids(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="critic 1 reads agent 1's token ids, as in CoMLRL, but its embeddings have"):
        IACTrainer(
            agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)],
            critics=[make_model(tokenizer, seed=2), make_model(tokenizer, seed=3, vocab_size=100)],
            tokenizer=tokenizer,
            reward_func=score,
            args=IACConfig(str(tmp_path), num_turns=1, report_to="none"),
        )


# ---------------------------------------------------------------- IAC's value heads on the actors' backbones


def test_a_shared_heads_value_loss_is_comlrls_clipped_loss_and_reaches_the_backbone(tokenizer):
    """`TeamCritic.shared_value_loss` on fixed rows, targets and rollout-time values (two of three moved beyond the
    clip since the rollout): CoMLRL's `_ac_step` loss, ``coef * mean(max((t - v)^2, (t - clip(v))^2))``, written out
    here on a copy of the model, with the same gradients on the head and the backbone."""
    settings = CriticSettings(
        centralized=False, critic_type="v", discount=1.0, normalize=True, value_loss_coef=0.6, learning_rate=1e-3,
        batch_size=4, shared=True, value_clip_range=0.05,
    )  # fmt: skip
    critic_model = CriticModel(make_model(tokenizer, seed=0))
    torch.nn.init.normal_(critic_model.value_head.layers[-1].weight, std=1.0)  # values far from 0
    copy_of = copy.deepcopy(critic_model)
    team = TeamCritic([critic_model], settings, num_agents=1)
    assert team.optimizers == [] and team.shared_heads() == [critic_model.value_head]
    rows = [tokenizer("count to three")["input_ids"], tokenizer("say hi")["input_ids"], tokenizer("a")["input_ids"]]
    with torch.no_grad():
        now = torch.stack([copy_of(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0] for r in rows])
    old = now + torch.tensor([0.0, 0.2, -0.2])  # the last two have moved by 0.2 since the rollout: clipped at 0.05
    targets = torch.tensor([1.0, -1.0, 2.0])
    loss = team.shared_value_loss(0, rows, targets, old)
    loss.backward()

    by_hand = 0.0
    for row, t, o in zip(rows, targets, old, strict=True):
        ids = torch.tensor([row])
        v = copy_of.value_head(last_hidden(copy_of.model, ids, torch.ones_like(ids)))[0]
        clipped = o + torch.clamp(v - o, -0.05, 0.05)
        by_hand = by_hand + torch.max((t - v) ** 2, (t - clipped) ** 2)
    by_hand = 0.6 * by_hand / len(rows)
    by_hand.backward()
    torch.testing.assert_close(loss.detach(), by_hand.detach())
    plain = 0.6 * ((targets - now) ** 2).mean()
    assert float(loss.detach()) > float(plain) + 1e-3  # the clip counted: a clipped error is the larger one
    pairs = list(zip(critic_model.parameters(), copy_of.parameters(), strict=True))
    for ours, theirs in pairs:
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-6, rtol=1e-4)
    backbone = [ours.grad for ours, _ in pairs[: -len(list(critic_model.value_head.parameters()))]]
    assert any(bool(g.abs().sum() > 0) for g in backbone)  # the value loss reaches the backbone


FOUR_PROMPTS = [*PROMPTS, {"prompt": "list two fruits"}]
# How one optimizer step's rows reach the loss: one loss call per agent; chunks of one row; two micro-batches of
# gradient accumulation (TRL's layout, given in its names)
LAYOUTS = {
    "one_call": {"rollout_buffer_size": 4, "update_chunk_size": 12},
    "chunks_of_one_row": {"rollout_buffer_size": 4, "update_chunk_size": 1},
    "accumulation_of_two": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2},
}


def shared_head_step(tmp_path, tokenizer, value_loss_coef, layout):
    """One optimizer step of IAC with value heads on the actors (one turn, K=1, four prompts), recording the
    gradients each parameter has when the optimizer steps and what the critic's step gave."""
    from transformers import TrainerCallback

    args = IACConfig(
        output_dir=str(tmp_path / f"run{value_loss_coef}"), max_new_tokens=3, num_train_epochs=1, eval_interval=0,
        early_termination_threshold=None, report_to="none", seed=0, agent_learning_rate=1e-3, num_turns=1,
        value_loss_coef=value_loss_coef, use_separate_critic=False, value_head_hidden_dim=4, **LAYOUTS[layout],
    )  # fmt: skip
    trainer = IACTrainer(
        agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)],
        tokenizer=tokenizer, reward_func=score, train_dataset=FOUR_PROMPTS, args=args,
    )  # fmt: skip
    # each head as built (a deep copy of the critic would not do: the agent's forward is bound to the live model)
    seen = {"heads": [copy.deepcopy(c.value_head.state_dict()) for c in trainer.critic.critics]}

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, *_, **__):
            seen["grads"] = [
                [None if p.grad is None else p.grad.clone() for p in c.parameters()] for c in trainer.critic.critics
            ]

    step = trainer.critic.step

    def recorded_step(tree, train, log=None, gather=None):
        result = step(tree, train, log, gather)
        seen["tree"], seen["step"] = tree, result
        return result

    trainer.critic.step = recorded_step
    trainer.add_callback(Grads())
    trainer.train()
    accumulation = 2 if layout == "accumulation_of_two" else 1
    assert trainer.state.global_step == 1 and trainer.args.gradient_accumulation_steps == accumulation
    assert len(seen["tree"].nodes) == 4
    return trainer, seen


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_iac_value_heads_on_the_actors_learn_with_them_as_comlrls_shared_critic(tmp_path, tokenizer, layout):
    """use_separate_critic=False: no critic model and no critic optimizer (CoMLRL's `critics == []`); each head is in
    the actors' optimizer at the agent's rate; the step's gradients are the actors' loss's plus the value loss's,
    ``coef * mean((target - value)^2)`` per agent over the step's rows on the rollout-time inputs (worked here on the
    models before the step; one turn, so the target is the reward), which reaches the backbone, whether the rows go
    through one loss call, chunks of one row, or two micro-batches of accumulation; the heads are saved."""
    trainer, seen = shared_head_step(tmp_path, tokenizer, 0.6, layout)
    without, seen_without = shared_head_step(tmp_path, tokenizer, 0.0, layout)
    assert trainer.critics == [] and trainer.critic_optimizers == []
    head_ids = {id(p) for head in trainer.critic.shared_heads() for p in head.parameters()}
    grouped = {id(p): g["lr"] for g in trainer.optimizer.param_groups for p in g["params"]}
    assert head_ids and all(grouped.get(i) == 1e-3 for i in head_ids)
    tree = seen["tree"]
    assert [a.reward for a in tree.joint_actions] == [a.reward for a in seen_without["tree"].joint_actions]
    inputs = trainer.critic.inputs(tree)
    for agent, head in enumerate(seen["heads"]):
        before = CriticModel(make_model(tokenizer, seed=agent), 4)  # the agent and its head before the step
        before.value_head.load_state_dict(head)
        targets = torch.tensor([a.reward for a in tree.joint_actions])
        values = torch.stack(
            [before(torch.tensor([r]), torch.ones(1, len(r), dtype=torch.long))[0] for r in inputs[agent]]
        )
        torch.testing.assert_close(values.detach(), seen["step"].values[agent])
        (0.6 * ((targets - values) ** 2).mean()).backward()
        difference = [
            a - (b if b is not None else torch.zeros_like(a))
            for a, b in zip(seen["grads"][agent], seen_without["grads"][agent], strict=True)
        ]
        for got, parameter in zip(difference, before.parameters(), strict=True):
            torch.testing.assert_close(got, parameter.grad, atol=1e-6, rtol=1e-4)
        backbone = difference[: -len(list(before.value_head.parameters()))]
        assert any(bool(g.abs().sum() > 0) for g in backbone)
    logged = trainer.state.log_history[0]
    assert "critic/value_loss" in logged
    assert logged["critic/value_mean"] == pytest.approx(float(seen["step"].values.mean()), rel=1e-5)
    trainer.create_optimizer()  # as a second `train()` does: the heads are not added twice
    held = [id(p) for group in trainer.optimizer.param_groups for p in group["params"]]
    assert len(held) == len(set(held))
    trainer.save_model(str(tmp_path / "saved"))
    saved = torch.load(tmp_path / "saved" / "critics.pt", weights_only=True)
    for state, head in zip(saved, trainer.critic.shared_heads(), strict=True):
        assert state.keys() == head.state_dict().keys()
        for key, value in state.items():
            torch.testing.assert_close(value, head.state_dict()[key])


def test_iac_with_heads_on_the_actors_refuses_critics_in_comlrls_words(tmp_path, tokenizer):
    with pytest.raises(ValueError, match="critics can only be provided when use_separate_critic=True"):
        IACTrainer(
            agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)],
            critics=[make_model(tokenizer, seed=2), make_model(tokenizer, seed=3)],
            tokenizer=tokenizer, reward_func=score, train_dataset=PROMPTS,
            args=IACConfig(str(tmp_path), num_turns=1, use_separate_critic=False),
        )  # fmt: skip
    with pytest.raises(
        ValueError, match="got critic_model=. Leave critic_model out to put a value head on each actor"
    ):
        IACTrainer(
            agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)], critic_model="any/critic",
            tokenizer=tokenizer, reward_func=score, args=IACConfig(str(tmp_path), num_turns=1, use_separate_critic=False),
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"agents length \(3\) must match num_agents \(2\).*IACConfig\(num_agents=3"):
        IACTrainer(
            agents=[make_model(tokenizer, seed=s) for s in range(3)], tokenizer=tokenizer, reward_func=score,
            args=IACConfig(str(tmp_path), num_turns=1, use_separate_critic=False),
        )  # fmt: skip
    agents = [make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)]
    optimizer = torch.optim.SGD([p for a in agents for p in a.parameters()], lr=0.1)
    with pytest.raises(ValueError, match="use_separate_critic=False with optimizers=: the value heads join"):
        IACTrainer(
            agents=agents, tokenizer=tokenizer, reward_func=score, train_dataset=PROMPTS,
            args=IACConfig(str(tmp_path), num_turns=1, use_separate_critic=False), optimizers=(optimizer, None),
        )  # fmt: skip


def test_a_checkpoint_without_the_critics_optimizers_resumes_with_fresh_ones_and_says_so(tmp_path, tokenizer, caplog):
    """As the Trainer's own optimizer file, `critic_optimizers.pt` is optional on resume (a `save_only_model`
    checkpoint has none): the critics' weights load, their AdamW starts afresh, with a warning naming the file."""

    def build(folder, epochs):
        args = MAACConfig(
            output_dir=str(folder), max_new_tokens=3, num_train_epochs=epochs, eval_interval=0, num_turns=1,
            early_termination_threshold=None, report_to="none", seed=0, rollout_buffer_size=3, save_strategy="steps",
            save_steps=1,
        )  # fmt: skip
        return MAACTrainer(
            agents=[make_model(tokenizer, seed=0), make_model(tokenizer, seed=1)], critics=[make_model(tokenizer, seed=2)],
            tokenizer=tokenizer, reward_func=score, train_dataset=PROMPTS, args=args,
        )  # fmt: skip

    first = build(tmp_path / "run", 1)
    first.train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    (checkpoint / "critic_optimizers.pt").unlink()
    resumed = build(tmp_path / "run", 2)
    with caplog.at_level("WARNING"):
        resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 2
    assert "has no critic_optimizers.pt" in caplog.text and "start afresh" in caplog.text
