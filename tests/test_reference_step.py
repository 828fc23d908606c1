"""examples/magrpo_step.py, the algorithm in one page, takes MAGRPOTrainer's step: two tiny agents, two turns, the
same completions (the reference replays the trainer's), the same loss and the same weights after one SGD step."""

import importlib.util
import os
import sys

import pytest
import torch
from conftest import SEED_PROMPTS, assert_same_sgd_step
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model


REFERENCE = os.path.join(os.path.dirname(__file__), "..", "examples", "magrpo_step.py")
SEEDS = (1, 2)  # one tiny model per agent


@pytest.fixture(scope="module")
def reference():
    spec = importlib.util.spec_from_file_location("magrpo_step", REFERENCE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module's annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def trained_trainer(reference, tokenizer, tmp_path):
    """MAGRPOTrainer after one SGD step with the reference's settings, task and sizes."""

    def reward(completions1, completions2):
        return [reference.joint_reward(a, b) for a, b in zip(completions1, completions2, strict=True)]

    def feedback(prompt, agent_completions, num_agents, **history):
        return reference.transition(prompt, agent_completions)

    args = MAGRPOConfig(
        output_dir=str(tmp_path),
        num_generations=reference.NUM_GENERATIONS,
        num_turns=reference.NUM_TURNS,
        early_termination_threshold=None,
        discount=reference.DISCOUNT,
        epsilon=reference.EPSILON,
        temperature=reference.TEMPERATURE,
        max_completion_length=reference.MAX_NEW_TOKENS,
        per_device_train_batch_size=2 * reference.NUM_GENERATIONS,  # two prompts' trees
        learning_rate=0.5,  # large, so that every weight visibly moves
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,  # no clipping: the step is -lr * gradient
        max_steps=1,
        logging_steps=1,
        report_to="none",
        seed=7,
        use_cpu=True,
        bf16=False,
    )
    # the reference implements the defaults; the test fails loudly if one of them changes
    assert (args.loss_type, args.scale_rewards, args.advantage_baseline, args.joint_mode) == (
        "dapo",
        "group",
        "mean",
        "aligned",
    )
    assert (args.beta, args.num_iterations, args.team_reward_weight, args.branching) == (0.0, 1, 1.0, "all")
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, seed=s) for s in SEEDS], processing_class=tokenizer, reward_funcs=reward,
        external_transition=feedback, train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS}), args=args,
    )  # fmt: skip
    trainer.train()
    return trainer


def replay(tree):
    """The trainer's completions, as the reference's `sample(agent, prompt)`: by each node's prompt."""
    by_prompt = {(i, node.prompts[i]): node.completion_ids[i] for node in tree.nodes for i in range(len(SEEDS))}
    assert len(by_prompt) == len(tree.nodes) * len(SEEDS)  # every node's prompts differ: the replay is unambiguous
    return lambda agent, prompt: by_prompt[agent, prompt]


def test_the_reference_step_is_the_trainers_step(reference, tokenizer, tmp_path):
    trainer = trained_trainer(reference, tokenizer, tmp_path)
    tree = trainer.last_rollout
    roots = [node.prompts[0] for node in tree.nodes if node.parent is None]

    agents = [make_model(tokenizer, seed=s) for s in SEEDS]
    before = [{k: v.clone() for k, v in agent.state_dict().items()} for agent in agents]
    optimizer = torch.optim.SGD([p for agent in agents for p in agent.parameters()], lr=0.5)
    loss, nodes = reference.magrpo_step(agents, [tokenizer] * len(SEEDS), roots, optimizer, sample=replay(tree))

    # the same tree: 2 roots and 4 children each, and the same joint rewards
    assert len(nodes) == len(tree.nodes) == 10
    rewards = sorted(r for node in nodes for r in node.rewards)
    assert rewards == pytest.approx(sorted(a.reward for a in tree.joint_actions), abs=1e-12)
    assert len(set(rewards)) > 2  # rewards that differ: the advantages are not all zero

    logged = trainer.state.log_history[0]["loss"]
    torch.testing.assert_close(loss, torch.tensor(logged), rtol=0, atol=1e-6)
    for i, agent in enumerate(agents):  # every weight took the same step (and more than ten tensors moved)
        assert_same_sgd_step(before[i], trainer.team.agent(i), agent)
