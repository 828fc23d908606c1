"""A team on an environment that draws its own start (TRL lets `reset` do so: each completion gets its own world and
its own observation): each joint action's first prompts hold its own world's observation, generated as K prompts x 1
sample, trained as one group; a seeded reset still shares one prompt (1 prompt x K samples). Real trainer, real tiny
model, real generation (the server-backed case, with OpenSpiel's tiny Hanabi dealt on a real server, is in
tests/test_openenv.py)."""

import math
import random

import pytest
import torch
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model, make_tool_tokenizer
from trl_multiagent.generation import TransformersGenerator
from trl_multiagent.trees import read_step, step_files


class Deal:
    """Deals a card from its own generator, as a game server does: seeded from the row's `seed`, or not at all."""

    def reset(self, seed=None, **row) -> str:
        self.card = random.Random(seed).randrange(10**6)
        return f" Your card is {self.card}."

    def get_reward(self) -> float:
        return float(self.card % 3)


def distinct_characters(completions_0, completions_1, **kwargs):  # varies within a group, so that a step learns
    return [float(len(set(a + b))) for a, b in zip(completions_0, completions_1, strict=True)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-chat-model")
    tokenizer = make_tool_tokenizer()
    make_model(tokenizer, seed=0, max_positions=2048).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("seeded", [False, True])
def test_each_joint_action_prompts_with_its_own_worlds_observation_and_a_seeded_one_shares_one(
    model_dir, tmp_path, monkeypatch, seeded
):
    tokenizer, k = make_tool_tokenizer(), 4
    sampled = []  # each batched call of the real sampler: (agent, prompts, samples of each)
    real_sample = TransformersGenerator._sample

    def counted(self, agent, prompt_ids, num_generations, greedy):
        sampled.append((agent, len(prompt_ids), num_generations))
        return real_sample(self, agent, prompt_ids, num_generations, greedy)

    monkeypatch.setattr(TransformersGenerator, "_sample", counted)
    rows = {
        "prompt": [[{"role": "user", "content": f"Guess {x}."}] for x in "ab"],
        "seed": [3, 4] if seeded else [None] * 2,
    }
    trainer = MAGRPOTrainer(
        model=model_dir, num_agents=2, processing_class=tokenizer, reward_funcs=distinct_characters,
        environment_factory=Deal, train_dataset=Dataset.from_dict(rows),
        args=MAGRPOConfig(
            output_dir=str(tmp_path), num_generations=k, per_device_train_batch_size=2 * k, max_completion_length=8,
            max_steps=1, logging_steps=1, report_to="none", save_strategy="no", shuffle_dataset=False, seed=0,
            learning_rate=0.1, early_termination_threshold=None, use_cpu=True, log_rollout_trees=True,
        ),
    )  # fmt: skip
    before = [p.detach().clone() for p in trainer.team.agent(0).parameters()]
    trainer.train()
    tree, batches = trainer.last_rollout, trainer._buffered_inputs[0]
    written = {0: [], 1: []}  # per agent, each completion with the prompt it was written for
    for node, question in zip(tree.nodes, ["Guess a.", "Guess b."], strict=True):
        cards = [tree.joint_actions[a].environment.card for a in node.joint_actions]
        assert (len(set(cards)) == 1) == seeded  # unseeded: four deals (of a million cards) differ
        assert (node.own_prompts is None) == seeded
        for agent in range(2):
            # the prompt completion k was written for (recorded in the tree) holds its own world's card
            prompts = [node.prompt(agent, c)[-1]["content"] for c in range(k)]
            assert prompts == [f"{question} Your card is {card}." for card in cards]
            texts = [tokenizer.decode(ids) for ids in node.prompt_ids[agent]]
            assert all(f"user\n{p}<|im_end|>" in t for p, t in zip(prompts, texts, strict=True))
            written[agent] += [(t, tuple(ids)) for t, ids in zip(texts, node.completion_ids[agent], strict=True)]
    for agent, batch in enumerate(batches):  # the rows the loss trained on pair each completion with its own prompt
        prompts = [ids[mask.bool()] for ids, mask in zip(batch["prompt_ids"], batch["prompt_mask"], strict=True)]
        completions = [
            ids[mask.bool()] for ids, mask in zip(batch["completion_ids"], batch["completion_mask"], strict=True)
        ]
        trained = [(tokenizer.decode(p), tuple(c.tolist())) for p, c in zip(prompts, completions, strict=True)]
        assert sorted(trained) == sorted(written[agent])
    # the recorded tree (log_rollout_trees): each completion's own prompt where the joint actions' prompts differ
    (document,) = [read_step(path) for path in step_files(trainer.args.output_dir).values()]
    for recorded, node in zip(document["prompts"], tree.nodes, strict=True):
        for agent, entry in enumerate(recorded["nodes"][0]["agents"]):
            own = [c.get("prompt") for c in entry["completions"]]
            if seeded:
                assert own == [None] * k and entry["prompt"].endswith(node.prompts[agent][-1]["content"])
            else:
                assert [p.rsplit("user: ", 1)[-1] for p in own] == [
                    node.prompt(agent, c)[-1]["content"] for c in range(k)
                ]
    # one batched call per agent: K prompts x 1 sample (unseeded), or 1 prompt x K samples (seeded)
    assert sampled == ([(0, 2, k), (1, 2, k)] if seeded else [(0, 2 * k, 1), (1, 2 * k, 1)])
    log = trainer.state.log_history[0]
    assert log["turn_1/rewards/Deal/mean"] == pytest.approx(
        sum(tree.joint_actions[a].environment.card % 3 for a in range(len(tree.joint_actions))) / (2 * k)
    )
    assert math.isfinite(log["loss"])
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.team.agent(0).parameters(), strict=True))
