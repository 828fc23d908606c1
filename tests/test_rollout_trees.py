"""`log_rollout_trees`: the recorded tree of a step holds the returns and advantages the update used, and its layout."""

import statistics

import pytest
import torch
from conftest import SEED_PROMPTS, length_feedback
from datasets import Dataset

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer
from trl_multiagent.demo.testing import make_model
from trl_multiagent.trees import FORMAT_VERSION, read_step, step_files
from trl_multiagent.trees.record import clip
from trl_multiagent.trees.wandb_table import tree_table_rows


def length_reward(completions1, completions2):
    """A hand-built reward: agent 1's length minus agent 0's, in hundreds of characters."""
    return [(len(b) - len(a)) / 100 for a, b in zip(completions1, completions2, strict=True)]


class KeepsBatches(MAGRPOTrainer):
    """The trainer, keeping each step's training batches: the advantages the update used."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.used = getattr(self, "used", []) + [[b["advantages"].clone() for b in out["agents"]]]
        return out


def train(tmp_path, tokenizer, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), num_turns=2, num_generations=4, per_device_train_batch_size=8,
        max_new_tokens=8, max_steps=2, logging_steps=1, report_to="none", seed=0,
        early_termination_threshold=None, log_rollout_trees=True,
    )  # fmt: skip
    values.update(overrides)
    trainer = KeepsBatches(
        model=[make_model(tokenizer, seed=i) for i in range(2)],
        processing_class=tokenizer,
        reward_funcs=length_reward,
        external_transition=length_feedback,
        train_dataset=Dataset.from_dict({"prompt": SEED_PROMPTS[:4]}),
        args=MAGRPOConfig(**values),
    )
    trainer.train()
    return trainer


def test_recorded_returns_and_advantages_are_the_ones_the_update_used(tmp_path, tokenizer):
    trainer = train(tmp_path, tokenizer)
    files = step_files(trainer.args.output_dir)
    assert list(files) == [1, 2]
    for step, used in zip(files, trainer.used, strict=True):
        document = read_step(files[step])
        assert document["format_version"] == FORMAT_VERSION and document["step"] == step
        assert len(document["prompts"]) == 2  # 8 rows / K=4
        recorded = {}  # (turn, row, node) -> per agent, the advantages: sorted, the update's row order
        for prompt in document["prompts"]:
            nodes = prompt["nodes"]
            assert [n["turn"] for n in nodes] == [1, 2, 2, 2, 2]  # no early end, every branch continues
            for node in nodes:
                for action in node["actions"]:
                    texts = [node["agents"][i]["completions"][k]["text"] for i, k in enumerate(action["choice"])]
                    # the reward, recomputed from the recorded texts (8 tokens are far below the clip)
                    assert action["reward"] == pytest.approx(length_reward([texts[0]], [texts[1]])[0])
                    assert action["rewards"]["length_reward"] == pytest.approx(action["reward"])
                    # return = reward + mean return of the child node's joint actions (discount 1)
                    child = [] if action["child"] is None else nodes[action["child"]]["actions"]
                    future = statistics.mean(c["return"] for c in child) if child else 0.0
                    assert action["return"] == pytest.approx(action["reward"] + future)
                for agent in node["agents"]:
                    returns = [c["return"] for c in agent["completions"]]
                    assert returns == pytest.approx([a["return"] for a in node["actions"]])  # aligned: k-th action
                    mean, std = statistics.mean(returns), torch.tensor(returns).std().item()
                    expected = [(r - mean) / (std + 1e-4) for r in returns]  # GRPO's group advantage, by hand
                    got = [c["advantage"] for c in agent["completions"]]
                    assert got == pytest.approx(expected, abs=1e-5)
                    recorded.setdefault((node["turn"], prompt["row"], node["id"]), []).append(got)
        for i in range(2):
            in_tree_order = [a for key in sorted(recorded) for a in recorded[key][i]]
            assert in_tree_order == pytest.approx(used[i].tolist(), abs=1e-6)  # what the loss got
            assert sum(abs(a) > 0.1 for a in in_tree_order) > 10  # far from zero: the check compares something


def test_layout_flags_and_table(tmp_path, tokenizer):
    trainer = train(tmp_path, tokenizer, max_steps=1, branching="best", early_termination_threshold=0.0)
    document = read_step(step_files(trainer.args.output_dir)[1])
    nodes = [n for p in document["prompts"] for n in p["nodes"]]
    roots = [n for n in nodes if n["turn"] == 1]
    for root in roots:
        mean = statistics.mean(a["reward"] for a in root["actions"])
        assert root["terminated"] == (mean > 0.0)
        if not root["terminated"]:  # "best": one joint action continues, the three others are pruned
            assert (
                sum(a["pruned"] for a in root["actions"]) == 3
                and sum(a["child"] is not None for a in root["actions"]) == 1
            )
    agent = nodes[0]["agents"][0]
    assert agent["prompt"].startswith("Describe") or agent["prompt"] in SEED_PROMPTS
    assert agent["prompt_tokens"] > 0
    for c in agent["completions"]:
        assert c["truncated"] == (c["tokens"] >= 8)
    columns, rows = tree_table_rows(document)
    assert len(rows) == sum(len(n["actions"]) for n in nodes)
    ids = {row[columns.index("id")] for row in rows}
    parents = [row[columns.index("parent")] for row in rows]
    assert all(p == "" or p in ids for p in parents) and any(p for p in parents) == any(n["turn"] == 2 for n in nodes)


def test_long_texts_are_cut_in_the_middle():
    text = "TASK " + "x" * 5000 + " FEEDBACK"
    cut = clip(text, 100)
    assert cut.startswith("TASK ") and cut.endswith(" FEEDBACK") and "…[4914 characters cut]…" in cut
    assert len(cut) - len("…[4914 characters cut]…") == 100


def test_every_n_steps(tmp_path, tokenizer):
    trainer = train(tmp_path, tokenizer, max_steps=3, rollout_trees_steps=2, num_turns=1)
    assert list(step_files(trainer.args.output_dir)) == [2]


def test_a_bad_setting_is_named(tmp_path):
    with pytest.raises(ValueError, match="rollout_trees_steps must be >= 1"):
        MAGRPOConfig(output_dir=str(tmp_path), rollout_trees_steps=0)


def test_wandb_gets_each_step_as_a_table_with_a_parent_column(tmp_path, tokenizer, monkeypatch):
    """report_to="wandb", offline: the run's files hold one `rollout_tree` table per recorded step, whose rows are
    the recorded joint actions."""
    pytest.importorskip("wandb")
    import glob
    import json

    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    # wandb keeps its first settings (WANDB_DIR included) for the process: start afresh, as a new process would
    wandb.teardown()
    trainer = train(tmp_path, tokenizer, report_to="wandb", run_name="trees")
    wandb.finish()
    tables = sorted(
        glob.glob(
            str(tmp_path / "wandb" / "offline-run-*" / "files" / "media" / "table" / "rollout_tree_*.table.json")
        )
    )
    assert len(tables) == 2  # steps 1 and 2
    logged_tables = [json.loads(open(path).read()) for path in tables]
    by_step = {t["data"][0][t["columns"].index("step")]: t for t in logged_tables}
    assert sorted(by_step) == [1, 2]
    for step, logged in by_step.items():
        columns, rows = tree_table_rows(read_step(step_files(trainer.args.output_dir)[step]))
        assert logged["columns"] == columns and "parent" in columns
        assert len(logged["data"]) == len(rows) == 2 * (4 + 4 * 4)  # 2 prompts, 4 + 16 joint actions each
        ret = columns.index("return")
        assert [r[ret] for r in logged["data"]] == pytest.approx([r[ret] for r in rows])
        # the steps are told apart by the `step` column
        assert {r[columns.index("step")] for r in logged["data"]} == {step}


def test_tool_calls_their_results_and_the_worlds_reward_are_recorded(tmp_path, monkeypatch):
    """A team acting on a shared notebook (tests/test_tools.py's scripted agents): each completion's calls, its failed
    calls, TRL's messages with the tool results, and the environment's `get_reward` column, per joint action."""
    from test_tools import COMMON, PROMPTS, Notebook, notebook_script, script_ours

    from trl_multiagent.demo.testing import make_tool_tokenizer

    tokenizer = make_tool_tokenizer()
    script_ours(monkeypatch, tokenizer, notebook_script)
    trainer = MAGRPOTrainer(
        model=[make_model(tokenizer, max_positions=2048, seed=s) for s in (1, 2)], processing_class=tokenizer,
        reward_funcs=lambda c0, c1, environments: [0.0] * len(c0), environment_factory=Notebook,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS, "secret": ["alpha", "beta"]}),
        args=MAGRPOConfig(output_dir=str(tmp_path), reward_weights=[1.0, 2.0], log_rollout_trees=True, **COMMON),
    )  # fmt: skip
    trainer.train()
    document = read_step(step_files(str(tmp_path))[1])
    nodes = [n for p in document["prompts"] for n in p["nodes"]]
    completions = [c for n in nodes for a in n["agents"] for c in a["completions"]]
    assert all(c["tool_calls"] == 1 for c in completions)
    assert sum(c["tool_failures"] for c in completions) == 2  # `explode` in sample 3, as the metrics count it
    readers = [c for n in nodes for c in n["agents"][1]["completions"]]
    tool_results = [m["content"] for m in readers[0]["messages"] if m["role"] == "tool"]
    assert tool_results == ["alpha"]  # agent 1 read what agent 0 wrote in the same joint action
    notebook = [a["rewards"]["Notebook"] for n in nodes for a in n["actions"]]
    assert statistics.mean(notebook) == pytest.approx(3 / 8)  # the world's get_reward, as logged
    assert trainer.state.log_history[0]["turn_1/rewards/Notebook/mean"] == pytest.approx(3 / 8)
