"""benchmarks/learning_curve.py: the recorder both trainers are measured with, the statistics, and the smoke run."""

import collections
import os
import subprocess
import sys

# benchmarks/ is on the import path through `pythonpath` in pyproject.toml's [tool.pytest.ini_options]
import learning_curve as lc
import pytest

from trl_multiagent.demo.testing import make_tokenizer


BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")


def test_recorder_times_turns_and_parents(tmp_path):
    recorder = lc.RewardRecorder(str(tmp_path / "r.jsonl"), budget_s=60)
    reward, transition = recorder.reward(), recorder.transition(lc.length_feedback)
    assert reward(["a"], ["bb"], prompts=[["p"], ["p"]]) == [pytest.approx(1.0)]  # before start(): not recorded
    recorder.start()
    first = ["x" * 10, "x" * 10]  # agent 2 / agent 1 = 1.0 for both joint answers -> exp(-1)
    second = ["y" * 10, "y" * 25]  # 1.0 and 2.5 -> exp(-1), 1.0
    turn1 = reward(first, second, prompts=[["Task"] * 2, ["Task"] * 2])
    children = [transition("Task", [a, b], 2) for a, b in zip(first, second, strict=True)]
    turn2 = reward(["z" * 4, "z" * 4], ["z" * 8, "z" * 4],
                   prompts=[[c[0] for c in children], [c[1] for c in children]])  # fmt: skip
    recorder.file.close()
    lines = lc.read_records(str(tmp_path / "r.jsonl"))
    assert [line["turn"] for line in lines] == [1, 1, 2, 2]
    assert [line["reward"] for line in lines] == pytest.approx(turn1 + turn2)
    assert [line["parent"] for line in lines[2:]] == pytest.approx(turn1)  # each child names its own parent
    # CoMLRL's convention (one joint answer, its agents' prompts) finds the same parent
    recorder.file = open(tmp_path / "c.jsonl", "w")
    reward(["z" * 4], ["z" * 8], prompts=list(children[1]))
    recorder.file.close()
    assert lc.read_records(str(tmp_path / "c.jsonl"))[0]["parent"] == pytest.approx(turn1[1])


def test_recorder_stops_the_run_past_the_budget(tmp_path):
    recorder = lc.RewardRecorder(str(tmp_path / "r.jsonl"), budget_s=0.0)
    reward = recorder.reward()
    recorder.start()
    with pytest.raises(lc.BudgetReached):
        reward(["a"], ["bb"], prompts=[["p"], ["p"]])


def test_summary_over_seeds_by_hand():
    def run(first, last):  # 100 s budget: answers at t=10 (first quarter), 50 (middle), 90 (last quarter)
        return [{"t": 10, "turn": 1, "reward": first}, {"t": 50, "turn": 1, "reward": 0.0},
                {"t": 90, "turn": 1, "reward": last}, {"t": 90, "turn": 2, "reward": last + 0.1, "parent": last}]  # fmt: skip

    s = lc.summarize([run(0.3, 0.5), run(0.3, 0.7), run(0.4, 0.7)], budget_s=100, target=0.6, bins=4)
    assert s[1]["first"][0] == pytest.approx(1 / 3) and s[1]["last"][0] == pytest.approx(0.633333)
    diff, se = s[1]["diff"]  # per-seed differences 0.2, 0.4, 0.3: mean 0.3, SE 0.1 / sqrt(3)
    assert diff == pytest.approx(0.3) and se == pytest.approx(0.1 / 3**0.5) and s[1]["learns"]
    assert s[1]["time_to_target"] == pytest.approx(87.5)  # the last of 4 bins, centred at 87.5 s
    assert s["second_turn_value"][0] == pytest.approx(0.1)
    assert not lc.summarize([run(0.3, 0.5), run(0.5, 0.3)], 100, 0.6, 4)[1]["learns"]


@pytest.mark.slow  # about 40 s on 2 cores: a smoke run of the benchmark, in a fresh process
def test_smoke_run_writes_records_table_and_plot(tmp_path):
    out = subprocess.run(
        [sys.executable, os.path.join(BENCH, "learning_curve.py"), "--smoke", "--trainers", "ours", "--seeds", "0",
         "1", "--out", str(tmp_path)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    table = (tmp_path / "learning_curve.md").read_text()
    assert "| ours | 1 |" in table and "| ours | 2 |" in table
    assert (tmp_path / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for seed in (0, 1):
        records = lc.read_records(str(tmp_path / "records" / f"ours_seed{seed}.jsonl"))
        assert records == sorted(records, key=lambda r: r["t"])
        # one prompt per step: each turn-1 reward call scores one node's K=4 joint answers
        nodes = collections.defaultdict(list)
        for r in records:
            if r["turn"] == 1:
                nodes[r["t"]].append(r["reward"])
        turn2_times = [r["t"] for r in records if r["turn"] == 2]
        cut = max(nodes)  # the run stopped at this call if no turn-2 answer came after it
        expected = sum(
            4 * len(rewards)
            for t, rewards in nodes.items()
            if sum(rewards) / len(rewards) <= 0.9 and (t != cut or any(t2 > cut for t2 in turn2_times))
        )
        # early termination at 0.9 on the node's mean reward: a node at or below it grows K children per joint answer
        assert len(turn2_times) == expected
        children = collections.Counter(r["parent"] for r in records if r["turn"] == 2)
        turn1 = {reward for rewards in nodes.values() for reward in rewards}
        assert set(children) <= turn1 and all(count % 4 == 0 for count in children.values())


def test_pad_token_is_moved_out_of_the_chat_template():
    tokenizer = make_tokenizer()
    # a template that writes the pad token as its end of turn, as SmolLM2's does with <|im_end|>
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}<pad>{% endfor %}"
    lc.pad_outside_chat_template(tokenizer)
    sample = tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    assert tokenizer.pad_token in ("<s>", "</s>") and tokenizer.pad_token not in sample
    tokenizer.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    tokenizer.pad_token = "<pad>"
    lc.pad_outside_chat_template(tokenizer)  # not in the template: left alone
    assert tokenizer.pad_token == "<pad>"
