"""The CoMLRL face trains what CoMLRL 1.4.3 trains, where TRL's core can (docs/from_comlrl.md, "The objective"):
its advantages for every `advantage_mode` with normalisation on and off, its undiscounted returns, its optimizer and
its sequence-summed REINFORCE loss at temperature 1; one update from the same completions and rewards leaves the same
parameters as CoMLRL's.

CoMLRL's rule is written here as a reference, each piece citing the lines of `comlrl/trainers/reinforce/magrpo.py`
(CoMLRL 1.4.3's sdist) it follows. `test_the_reference_is_comlrls_own_update` (slow) runs CoMLRL's own
`MAGRPOTrainer._update_from_samples` on the face's completions, in a venv with comlrl==1.4.3 made as the contract
harness makes it (tests/comlrl_contract/run_comlrl_tests.py), and checks the face's parameters against CoMLRL's.
"""

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import TrainerCallback

import trl_multiagent.comlrl.config as comlrl_config
from trl_multiagent.comlrl import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.credit.returns import completion_returns, joint_returns, team_advantages
from trl_multiagent.demo.testing import make_model


CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trl_multiagent" / "comlrl_contract"
COMLRL_PYTHON = Path(os.environ.get("COMLRL_CONTRACT_PYTHON", CACHE / "venv" / "bin" / "python"))
ONE_UPDATE = Path(__file__).parent / "comlrl_contract" / "one_update.py"

RETURNS = [0.2, 0.5, 0.9, 0.4]
# CoMLRL's advantages of RETURNS, by hand: each mode's baseline subtracted, then (normalising) minus the mean, over the
# population std; with normalisation on every mode gives the same
BY_HAND = {
    ("mean", False): [-0.3, 0.0, 0.4, -0.1],
    ("raw", False): [0.2, 0.5, 0.9, 0.4],
    ("max", False): [-0.7, -0.4, 0.0, -0.5],
    ("rloo", False): [-0.4, 0.0, 1.6 / 3, -0.4 / 3],
    **{(mode, True): [-1.1767, 0.0, 1.5689, -0.3922] for mode in ("mean", "raw", "max", "rloo")},
}


def comlrl_advantages(returns: list[float], mode: str, normalise: bool) -> torch.Tensor:
    """CoMLRL 1.4.3's advantages of one node's K returns for one agent: `_compute_advantages` (magrpo.py:1590-1604),
    then, in `_compute_loss_with_gradients` (magrpo.py:1629-1633), with `advantage_normalization` and more than one
    completion, minus their mean over their population std clamped at 1e-6."""
    r = torch.tensor(returns, dtype=torch.float)
    if mode == "mean":
        a = r - r.mean()
    elif mode == "raw":
        a = r
    elif mode == "max":
        a = r - r.max()
    else:  # rloo
        a = (r * r.numel() - r.sum()) / (r.numel() - 1) if r.numel() > 1 else r - r.mean()
    if normalise and a.numel() > 1:
        a = (a - a.mean()) / a.std(unbiased=False).clamp(min=1e-6)
    return a


def comlrl_returns(tree) -> dict[int, list[float]]:
    """CoMLRL 1.4.3's training returns of every node's joint actions, undiscounted whatever `discount` is:
    `compute_returns` (magrpo.py:1040-1054), a leaf's returns its rewards, a parent's `r_j + mean(child returns)`."""
    returns: dict[int, list[float]] = {}

    def of(node_id: int) -> list[float]:
        node = tree.nodes[node_id]
        values = []
        for a in node.joint_actions:
            action = tree.joint_actions[a]
            child = [] if action.child is None else of(action.child)
            values.append(action.reward + (sum(child) / len(child) if child else 0.0))
        returns[node_id] = values
        return values

    for node_id, node in enumerate(tree.nodes):
        if node.parent is None:
            of(node_id)
    return returns


def test_the_by_hand_numbers_are_comlrls_formula():
    for (mode, normalise), expected in BY_HAND.items():
        got = comlrl_advantages(RETURNS, mode, normalise)
        assert torch.allclose(got, torch.tensor(expected), atol=1e-4), (mode, normalise, got)


def face_advantages(credited: torch.Tensor, mode: str, normalise: bool) -> torch.Tensor:
    """The face's advantages of ``(nodes, agents, K)`` credited returns: the core's credit with the config's choice."""
    config = MAGRPOConfig(
        output_dir="unused", report_to="none", advantage_mode=mode, advantage_normalization=normalise
    )  # fmt: skip
    return team_advantages(credited, config.advantage_scale, config.advantage_baseline)


@pytest.mark.parametrize("normalise", [True, False], ids=["normalised", "not-normalised"])
@pytest.mark.parametrize("mode", ["mean", "rloo", "max", "raw"])
def test_advantages_are_comlrls_for_every_mode(mode, normalise):
    got = face_advantages(torch.tensor([[RETURNS]]), mode, normalise)[0, 0]
    assert torch.allclose(got, torch.tensor(BY_HAND[(mode, normalise)]), atol=1e-4), got
    # several nodes and agents: CoMLRL's group is one agent's K completions at one node, each normalised on its own
    credited = torch.tensor(
        [[[0.2, 0.5, 0.9, 0.4], [3.0, 1.0, 1.0, 2.0]], [[5.0, 5.0, 5.0, 5.0], [-1.0, 0.0, 4.0, 9.0]]]
    )
    got = face_advantages(credited, mode, normalise)
    for node in range(2):
        for agent in range(2):
            expected = comlrl_advantages(credited[node, agent].tolist(), mode, normalise)
            assert torch.allclose(got[node, agent], expected, atol=1e-5), (node, agent, got[node, agent], expected)


@pytest.mark.parametrize("normalise", [True, False], ids=["normalised", "not-normalised"])
@pytest.mark.parametrize("mode", ["mean", "rloo", "max", "raw"])
def test_one_completion_per_group_is_not_normalised(mode, normalise):
    """CoMLRL normalises only a group of more than one (`advantages.numel() > 1`)."""
    got = face_advantages(torch.tensor([[[0.7]]]), mode, normalise)
    assert torch.allclose(got.flatten(), comlrl_advantages([0.7], mode, normalise))


def test_the_tree_returns_are_undiscounted_and_discount_is_said_once(tmp_path, caplog):
    config = MAGRPOConfig(output_dir=str(tmp_path), report_to="none", discount=0.9)
    assert config.discount == 0.9  # kept, as CoMLRL keeps it
    comlrl_config.logger.warning_once.cache_clear()  # an earlier test may have said it already
    trained = copy.copy(config)
    with caplog.at_level("WARNING"):
        comlrl_config.undiscounted(trained)
        comlrl_config.undiscounted(copy.copy(config))
    assert trained.discount == 1.0 and config.discount == 0.9
    assert caplog.text.count("discount=0.9 is not used, as in CoMLRL 1.4.3") == 1, caplog.text
    # turn 1's return is its reward plus the plain mean of its children's: 1.0 + (0.5 + 1.5) / 2
    assert joint_returns([1.0, 0.0, 0.5, 1.5], [[2, 3], [], [], []], trained.discount) == [2.0, 0.0, 0.5, 1.5]
    with caplog.at_level("WARNING"):
        comlrl_config.undiscounted(MAGRPOConfig(output_dir=str(tmp_path), report_to="none"))
    assert caplog.text.count("is not used, as in CoMLRL") == 1  # the default says nothing


def test_the_update_settings_are_comlrls(tmp_path):
    config = MAGRPOConfig(output_dir=str(tmp_path), report_to="none")
    assert (config.max_grad_norm, config.weight_decay, str(config.optim.value)) == (0.0, 0.01, "adamw_torch")
    assert (config.loss_type, config.importance_sampling_level, config.update_temperature) == (
        "luspo",
        "sequence",
        1.0,
    )
    assert (config.adam_beta1, config.adam_beta2, config.adam_epsilon) == (0.9, 0.999, 1e-8)  # torch's AdamW's
    assert config.scale_rewards == "group_zscore"


def joint_score(completions1, completions2):
    return [float(sum(map(ord, a + b)) % 7) for a, b in zip(completions1, completions2, strict=True)]


def feedback(prompt, agent_completions, num_agents, **history):
    return [f"{prompt} Try again, agent {i}." for i in range(num_agents)]


class Recorded(TrainerCallback):
    """Each agent's gradient just before the optimizer steps (after any clipping)."""

    def __init__(self, trainer):
        self.trainer, self.grads = trainer, None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.grads = [[p.grad.detach().clone() for p in agent.parameters()] for agent in self.trainer.agents]


def one_face_update(tmp_path, tokenizer, **overrides):
    """One optimizer step of the face from its defaults, 2 turns and discount=0.9 (ignored, as in CoMLRL), on one
    prompt: the agents before it, the tree, each agent's gradient and each agent after it."""
    agents = [make_model(tokenizer, seed=seed) for seed in (0, 1)]
    before = [copy.deepcopy(agent) for agent in agents]
    values = dict(
        output_dir=str(tmp_path / "run"), num_turns=2, discount=0.9, max_new_tokens=4,
        num_generations=3,  # with 2, a normalised group's advantages are always -1 and 1, whatever the returns
        early_termination_threshold=None,  # CoMLRL's -0.2 would end every branch after turn 1
        rollout_buffer_size=4,  # CoMLRL updates once its buffer holds a whole tree (1 + 3 nodes), as the face does
        agent_learning_rate=1e-3,  # AdamW's decay, lr * 0.01 * p, above float32's rounding of p
        num_train_epochs=1, logging_steps=1, eval_interval=0, report_to="none", seed=0,
    )  # fmt: skip
    values.update(overrides)
    trainer = MAGRPOTrainer(
        agents=agents,
        tokenizer=tokenizer,
        reward_func=joint_score,
        external_transition=feedback,
        train_dataset=[{"prompt": "Count to three."}],
        args=MAGRPOConfig(**values),
    )
    recorded = Recorded(trainer)
    trainer.add_callback(recorded)
    trainer.train()
    assert trainer.state.global_step == 1 and recorded.grads is not None
    # torch's AdamW, every parameter decayed (the Trainer would exempt biases and norms)
    assert type(trainer.optimizer.optimizer if hasattr(trainer.optimizer, "optimizer") else trainer.optimizer) is (
        torch.optim.AdamW
    )
    groups = trainer.optimizer.param_groups
    assert {g["weight_decay"] for g in groups if g["params"]} == {0.01}
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in trainer.model.parameters())
    return before, trainer.last_rollout, recorded.grads, [list(agent.parameters()) for agent in trainer.agents]


def comlrl_sequence(node, agent: int, k: int, pad_token_id: int) -> tuple[list[int], list[int]]:
    """The prompt and completion tokens CoMLRL's loss reads (magrpo.py:1258-1270, 1663-1672): the node's K completions
    come from one `generate` call, so each runs to the longest, padded after its end."""
    longest = max(len(ids) for ids in node.completion_ids[agent])
    completion = node.completion_ids[agent][k]
    return node.prompt_ids[agent][k], completion + [pad_token_id] * (longest - len(completion))


def comlrl_update(model, tree, agent: int, pad_token_id: int, lr: float, tokens: str, mode="mean", normalise=True):
    """CoMLRL 1.4.3's update of one agent over the tree's nodes, as one batch (`_update_from_samples`,
    magrpo.py:1573-1588: each node's loss over the number of nodes, one `AdamW(params, lr)` step, magrpo.py:330-335):
    a node's loss is the mean over its completions of ``-advantage * (sum of the completion's token log-probs)`` at
    temperature 1 (`_compute_loss_with_gradients`, magrpo.py:1606-1700). Returns the gradient; `model` is stepped.

    `tokens` says which log-probs are summed: ``"comlrl"``, those CoMLRL's loss reads, the node's padded sequence
    (`comlrl_sequence`) but its last token (its logits, ``logits[P - 1 : -1]``, have one row fewer than the completion
    has tokens, and the loop skips the token without one, magrpo.py:1670-1684); ``"own"``, every token of the
    completion, up to and including its end, as TRL's completion mask reads them."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    optimizer.zero_grad()
    returns = comlrl_returns(tree)
    for node_id, node in enumerate(tree.nodes):
        choices = [tree.joint_actions[a].choice for a in node.joint_actions]
        per_completion = [returns[node_id][choices.index(c)] for c in sorted(choices, key=lambda c: c[agent])]
        advantages = comlrl_advantages(per_completion, mode, normalise)
        node_loss = 0.0
        for k, advantage in enumerate(advantages):
            if tokens == "comlrl":
                prompt, completion = comlrl_sequence(node, agent, k, pad_token_id)
            else:
                prompt, completion = node.prompt_ids[agent][k], node.completion_ids[agent][k]
            input_ids = torch.tensor([prompt + completion[:-1]])
            logits = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), use_cache=False).logits
            logps = torch.log_softmax(logits[0, len(prompt) - 1 :], dim=-1)
            logps = logps.gather(1, torch.tensor(completion)[:, None])
            node_loss = node_loss - advantage * (logps[:-1] if tokens == "comlrl" else logps).sum()
        (node_loss / len(advantages) / len(tree.nodes)).backward()
    grads = [p.grad.detach().clone() for p in model.parameters()]
    optimizer.step()
    return grads


@pytest.mark.parametrize("max_new_tokens", [4, 16])
def test_one_update_equals_comlrls(tmp_path, tokenizer, max_new_tokens):
    """With 16 new tokens, some completions end before the limit (on EOS), and the loss reads them up to it."""
    before, tree, face_grads, face_after = one_face_update(tmp_path, tokenizer, max_new_tokens=max_new_tokens)
    assert len(tree.nodes) == 4 and {node.turn for node in tree.nodes} == {1, 2}  # 2 turns ran
    lengths = {len(ids) for node in tree.nodes for agent in range(2) for ids in node.completion_ids[agent]}
    assert (min(lengths) < max_new_tokens) == (max_new_tokens == 16), lengths
    for agent, model in enumerate(before):
        grads = comlrl_update(model, tree, agent, tokenizer.pad_token_id, lr=1e-3, tokens="own")
        scale = max(g.abs().max() for g in grads)
        for name, got, expected in zip(
            [n for n, _ in model.named_parameters()], face_grads[agent], grads, strict=True
        ):
            assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5 * scale), (agent, name)
        names = [n for n, _ in model.named_parameters()]
        for name, got, expected in zip(names, face_after[agent], model.parameters(), strict=True):
            # Adam's first step is lr * g / (|g| + 1e-8): float noise in a near-zero g moves it by up to ~4e-3 * lr;
            # weight decay moves a norm weight (1.0) by lr * 0.01
            assert torch.allclose(got, expected, rtol=0, atol=5e-3 * 1e-3), (agent, name, (got - expected).abs().max())


@pytest.mark.slow  # about 30 s: a second interpreter imports torch, transformers and CoMLRL
def test_the_reference_is_comlrls_own_update(tmp_path, tokenizer):
    """CoMLRL 1.4.3's own `_update_from_samples` (and its `AdamW`s, built by its `MAGRPOTrainer.__init__`), run on the
    face's completions with the reference's returns, gives the gradient and the parameters of the reference and of the
    face."""
    if not COMLRL_PYTHON.exists():
        pytest.skip(
            f"a Python with CoMLRL 1.4.3 ({COMLRL_PYTHON}) is missing: run `python tests/comlrl_contract/"
            "run_comlrl_tests.py --mode stock` once (it makes it), or set COMLRL_CONTRACT_PYTHON"
        )
    before, tree, face_grads, face_after = one_face_update(tmp_path, tokenizer)
    returns, nodes = comlrl_returns(tree), []
    for node_id, node in enumerate(tree.nodes):
        choices = [tree.joint_actions[a].choice for a in node.joint_actions]
        entry = {"turn": node.turn - 1, "prompt": [], "completions": [], "returns": []}
        for agent in range(2):
            assert all(ids == node.prompt_ids[agent][0] for ids in node.prompt_ids[agent])  # CoMLRL: one prompt a node
            sequences = [comlrl_sequence(node, agent, k, tokenizer.pad_token_id)[1] for k in range(len(choices))]
            entry["prompt"].append(node.prompt_ids[agent][0])
            entry["completions"].append(sequences)
            entry["returns"].append(
                [returns[node_id][choices.index(c)] for c in sorted(choices, key=lambda c: c[agent])]
            )
        nodes.append(entry)
    config = dict(
        num_agents=2, num_turns=2, num_generations=3, discount=0.9, max_new_tokens=4, agent_learning_rate=1e-3,
        rollout_buffer_size=4, early_termination_threshold=None, advantage_mode="mean", advantage_normalization=True,
    )  # fmt: skip
    (tmp_path / "update.json").write_text(json.dumps({"config": config, "nodes": nodes}))
    for i, model in enumerate(before):
        model.save_pretrained(tmp_path / f"agent_{i}")
        tokenizer.save_pretrained(tmp_path / f"agent_{i}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run(
        [str(COMLRL_PYTHON), str(ONE_UPDATE), str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for agent, model in enumerate(before):
        comlrl_after = torch.load(tmp_path / f"after_{agent}.pt")
        comlrl_grads = torch.load(tmp_path / f"grads_{agent}.pt")
        own = copy.deepcopy(model)  # the same update on every token of each completion: the face's
        reference_grads = comlrl_update(model, tree, agent, tokenizer.pad_token_id, lr=1e-3, tokens="comlrl")
        own_grads = comlrl_update(own, tree, agent, tokenizer.pad_token_id, lr=1e-3, tokens="own")
        names = [n for n, _ in model.named_parameters()]
        scale = max(g.abs().max() for g in reference_grads)
        for name, reference in zip(names, reference_grads, strict=True):
            assert torch.allclose(reference, comlrl_grads[name], rtol=1e-4, atol=1e-5 * scale), (agent, name)
        for name, reference in zip(names, model.parameters(), strict=True):
            assert torch.allclose(reference, comlrl_after[name], rtol=0, atol=3e-3 * 1e-3), (agent, name)
        # what remains: CoMLRL's loss leaves each completion's last token out (and, for a completion shorter than its
        # node's longest, reads padding): the face's gradient and parameters differ from CoMLRL's by that term only
        assert all(
            torch.allclose(f, o, rtol=1e-4, atol=1e-5 * scale)
            for f, o in zip(face_grads[agent], own_grads, strict=True)
        )
        flat = lambda tensors: torch.cat([t.flatten() for t in tensors])  # noqa: E731
        gradient = (flat(face_grads[agent]) - flat(comlrl_grads[n] for n in names)).norm() / flat(
            reference_grads
        ).norm()
        step = (flat(face_after[agent]) - flat(comlrl_after[n] for n in names)).abs().max()
        # the last of 4 tokens is a large share (measured 0.57 and 0.49): docs/from_comlrl.md gives the sizes
        assert gradient > 0.05 and step > 1e-4, (agent, gradient, step)


@pytest.mark.parametrize("normalise", [True, False], ids=["normalised", "not-normalised"])
def test_cross_mode_credits_the_mean_where_comlrl_sums(normalise):
    """A remaining difference (docs/from_comlrl.md): in `cross` mode CoMLRL credits each completion with the sum of
    the returns of the K**(N-1) joint answers it is part of (magrpo.py:1071-1083), the core with their mean. With
    normalisation on the advantages are the same; off, the face's are CoMLRL's over K**(N-1)."""
    choices = [(0, 0), (0, 1), (1, 0), (1, 1)]  # K = 2, N = 2: each completion is in 2 joint answers
    returns = [1.0, 4.0, 0.5, 2.0]
    sums = [[sum(r for c, r in zip(choices, returns, strict=True) if c[a] == k) for k in range(2)] for a in range(2)]
    got = face_advantages(completion_returns(choices, returns, 2, 2)[None], "mean", normalise)[0]
    for agent in range(2):
        expected = comlrl_advantages(sums[agent], "mean", normalise) / (1 if normalise else 2)
        assert torch.allclose(got[agent], expected), (agent, got[agent], expected)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), True, "1"])
def test_a_bad_logprob_temperature_is_refused_naming_it(tmp_path, value):
    from trl_multiagent import MAGRPOConfig as TRLFaceConfig

    with pytest.raises(ValueError, match=r"logprob_temperature must be a finite number > 0 or None, got"):
        TRLFaceConfig(output_dir=str(tmp_path), report_to="none", logprob_temperature=value)


def test_the_trl_face_keeps_trls_log_prob_temperature_and_discount(tmp_path):
    from trl_multiagent import MAGRPOConfig as TRLFaceConfig

    config = TRLFaceConfig(output_dir=str(tmp_path), report_to="none", temperature=0.7, discount=0.9)
    assert (config.logprob_temperature, config.update_temperature, config.discount) == (None, 0.7, 0.9)
    assert (config.loss_type, config.max_grad_norm, config.weight_decay, config.scale_rewards) == (
        "dapo",
        1.0,
        0.0,
        "group",
    )
