"""benchmarks/team_vs_single: the tasks' rewards by hand, the learning-rate rule, the verdict, and the command at
smoke size (a tiny random model), run in two parts into one results folder and merged."""

import glob
import json
import math
import os

import pytest

from benchmarks.team_vs_single import __main__ as command
from benchmarks.team_vs_single import report, sides, tasks


def test_writing_reward_checks_both_parts_and_how_they_relate():
    # length ratio 30/10 = 3 (in [2, 3]), the keyword in both, part 1 one line: every check passes
    assert tasks.writing_reward("dragon  ab", "x" * 24 + "dragon", "dragon") == pytest.approx(1.0)
    # ratio 1: length exp(-1); keyword in part 2 only: 0.5; format ok
    assert tasks.writing_reward("abcdef", "dragon", "dragon") == pytest.approx((math.exp(-1) + 0.5 + 1) / 3)
    # part 1 on two lines: the format check fails
    assert tasks.writing_reward("drag\non", "x" * 20, "dragon") == pytest.approx((1.0 + 0.0 + 0.0) / 3)
    # the single agent's completion without the marker: part 2 is empty (ratio 0: exp(-2)), and the format fails
    part_1, part_2 = tasks.split_parts("A dragon who cannot fly")
    assert part_2 == "" and tasks.writing_reward(part_1, part_2, "dragon") == pytest.approx((math.exp(-2) + 0.5) / 3)


def test_each_writer_of_the_team_is_asked_for_its_own_part():
    row = {"keyword": "dragon", "topic": "a dragon who cannot fly"}
    messages = [formatter(row) for formatter in sides.writing_formatters()]
    assert messages == [[{"role": "user", "content": tasks.writing_part_prompt(row, part)}] for part in (0, 1)]
    assert messages[0] != messages[1]


def test_arithmetic_answer_and_questions():
    assert tasks.arithmetic_correct("36 + 1 = 37", 37) == 1.0  # the number after '=' (not the first operand)
    assert tasks.arithmetic_correct("37", 37) == 1.0 and tasks.arithmetic_correct("It is 38.", 37) == 0.0
    task = tasks.arithmetic_task("add_2digit_1digit", 12)
    assert len(task.held_out_rows) == 32 and len(task.train_rows) == 256
    assert not {r["question"] for r in task.held_out_rows} & {r["question"] for r in task.train_rows}
    for row in task.held_out_rows:
        a, b = (int(x) for x in row["question"].removeprefix("What is ").removesuffix("?").split(" + "))
        assert 10 <= a <= 99 and 1 <= b <= 9 and row["answer"] == a + b
    with pytest.raises(ValueError, match="add_1digit.*81 distinct questions"):
        tasks.arithmetic_questions("add_1digit", 100, seed=0)


def test_learning_rate_rule_takes_the_best_last_quarter(tmp_path):
    def curve(rewards):  # 8 reward calls of 10 tokens each: the last quarter is the last 3 (tokens >= 60)
        return [{"tokens": 10 * (i + 1), "turn": 1, "reward": r} for i, r in enumerate(rewards)]

    tries = {1e-3: [0.9] * 5 + [0.2, 0.2, 0.2], 3e-3: [0.0] * 5 + [0.5, 0.6, 0.7]}
    for lr, rewards in tries.items():
        command.write_json(command.lr_try_path(str(tmp_path), "writing", "team", lr, 100),
                           {"learning_rate": lr, "curve": curve(rewards)})  # fmt: skip
    lr, scored = command.chosen_learning_rate(str(tmp_path), "writing", "team", [3e-3, 1e-3], 100)
    assert lr == 3e-3 and scored == [(1e-3, pytest.approx(0.2)), (3e-3, pytest.approx(0.6))]
    # only the rates asked for count: a try at another rate in the folder is not a candidate
    command.write_json(command.lr_try_path(str(tmp_path), "writing", "team", 1e-2, 100),
                       {"learning_rate": 1e-2, "curve": curve([1.0] * 8)})  # fmt: skip
    assert command.chosen_learning_rate(str(tmp_path), "writing", "team", [1e-3, 3e-3], 100)[0] == 3e-3


def test_one_command_runs_the_tries_it_needs_then_the_part_at_the_chosen_rate(tmp_path):
    results = str(tmp_path)
    # a try at 3e-2 already in the folder, with a last-quarter reward no smoke try reaches: the rule must pick it over
    # the try at 1e-3 that the command runs (a rule taking the first, lowest or worst rate picks 1e-3)
    best = command.lr_try_path(results, "writing", "team", 3e-2, 100)
    curve = [{"tokens": 4 * (i + 1), "turn": 1, "reward": 1.0} for i in range(4)]
    command.write_json(best, {"task": "writing", "side": "team", "seed": 100, "learning_rate": 3e-2, "steps": 4,
                              "generated_tokens": 16, "train_s": 1.0, "curve": curve})  # fmt: skip
    argv = ["--smoke", "--results", results, "--tasks", "writing", "--sides", "team", "--seeds", "0",
            "--lr_tries", "1e-3", "3e-2"]  # fmt: skip
    command.main(argv)
    with open(best) as f:
        assert json.load(f)["curve"] == curve  # the existing try was not rerun
    with open(command.lr_try_path(results, "writing", "team", 1e-3, 100)) as f:
        ran = json.load(f)
    # the try ran on the tries' seed to a third of the part's budget, and never saw the held-out rows
    assert ran["seed"] == 100 and ran["generated_tokens"] >= command.SIZES["smoke"]["token_budget"]["writing"] // 3
    assert ran["steps"] < 4 and "before" not in ran and "after" not in ran
    assert report.last_quarter_reward(ran["curve"]) < 1.0
    with open(f"{results}/writing/team/seed0.json") as f:
        part = json.load(f)
    assert part["learning_rate"] == 3e-2
    assert (
        f"1e-3: {report.last_quarter_reward(ran['curve']):.3f}".replace("1e-3", "0.001") in part["learning_rate_rule"]
    )
    assert part["machine"] == command.machine() and "torch" in part["versions"]
    text = open(f"{results}/report.md").read()
    assert "Learning-rate tries" in text and "1.000 (4, 1)" in text and "learning rate: highest last-quarter" in text
    # run again, even with --overwrite: the tries are kept (a part rerun must not move the rate of the other seeds)
    stamps = {p: os.path.getmtime(p) for p in glob.glob(f"{results}/writing/lr_tries/**/*.json", recursive=True)}
    command.main([*argv, "--overwrite"])
    assert stamps == {
        p: os.path.getmtime(p) for p in glob.glob(f"{results}/writing/lr_tries/**/*.json", recursive=True)
    }
    # a part at a rate set by hand does not merge with the rule's parts
    with pytest.raises(SystemExit, match=r"learning_rate: recorded 'auto, tries 0.001, 0.03', now '0.001 \(--lr\)'"):
        command.main([*argv[:-3], "--lr", "1e-3", "--seeds", "1"])
    # tries at another rate join the folder (evidence beside the rule), and leave the rule's record as it was
    command.main([*argv[:-3], "--tries_only", "--lr_tries", "1e-2"])
    assert os.path.exists(command.lr_try_path(results, "writing", "team", 1e-2, 100))
    with open(f"{results}/writing/settings.json") as f:
        assert json.load(f)["learning_rate"] == "auto, tries 0.001, 0.03"


def test_sides_of_no_selected_task_are_refused(tmp_path):
    with pytest.raises(SystemExit, match=r"--sides \['tema'\] are not sides of the tasks selected"):
        command.main(["--smoke", "--results", str(tmp_path), "--sides", "tema"])
    with pytest.raises(SystemExit, match="revise"):  # a side of the arithmetic task only, with writing alone
        command.main(["--smoke", "--results", str(tmp_path), "--tasks", "writing", "--sides", "revise"])
    assert os.listdir(tmp_path) == []  # refused before any settings or report is written


def test_verdict_over_seeds_and_for_one_seed():
    def side(means):
        results = [{"seed": s, "after": {"final": [m - 0.1, m + 0.1]}} for s, m in enumerate(means)]
        per_seed = [report.seed_score(r["after"]["final"]) for r in results]
        return results, {"after": {"over_seeds": {"final": report.over_seeds([s["mean"] for s in per_seed])}}}

    team, single = side([0.8, 0.82, 0.78]), side([0.5, 0.52, 0.48])
    out = report.compare(team[0], single[0], team[1], single[1])
    # difference 0.3; SE sqrt(0.02^2/3 * 2) = 0.01633; t(0.975, 2) = 4.303
    assert out["difference"] == pytest.approx(0.3) and out["ci95"] == pytest.approx(4.3027 * 0.016330, rel=1e-3)
    assert out["verdict"] == "the team wins"
    # beside it, each seed's difference paired over the rows both sides answered
    assert [(c["seed"], c["difference"], c["rows"]) for c in out["per_seed"]] == [
        (s, pytest.approx(0.3), 2) for s in range(3)
    ]
    close = side([0.51, 0.49, 0.53])
    assert report.compare(close[0], single[0], close[1], single[1])["verdict"] == "within the noise"
    one_team, one_single = side([0.2]), side([0.6])
    out = report.compare(one_team[0], one_single[0], one_team[1], one_single[1])
    assert out["verdict"] == "the team loses" and "one seed (0) only" in out["basis"]


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
    """The command twice into one folder: the writing task on seeds 0 and 1, then the arithmetic task on seed 0."""
    results = str(tmp_path_factory.mktemp("team_vs_single"))
    command.main(["--smoke", "--lr", "1e-3", "--results", results, "--tasks", "writing", "--seeds", "0", "1"])
    command.main(["--smoke", "--lr", "1e-3", "--results", results, "--tasks", "arithmetic", "--seeds", "0"])
    return results


def test_smoke_parts_merge_into_one_report(smoke_results):
    with open(f"{smoke_results}/summary.json") as f:
        summary = json.load(f)
    assert list(summary) == ["writing", "arithmetic"]
    assert list(summary["writing"]["sides"]) == ["single", "team"]
    assert list(summary["arithmetic"]["sides"]) == ["single", "revise", "team"]
    text = open(f"{smoke_results}/report.md").read()
    for heading in ("## writing", "## arithmetic", "team vs single agent", "team vs one agent over two turns"):
        assert heading in text
    for task in ("writing", "arithmetic"):
        assert open(f"{smoke_results}/{task}.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    # the merged numbers are the parts' numbers: each side's mean over seeds is the mean of its seeds' row means
    parts = report.read_parts(smoke_results)
    for task, by_side in parts.items():
        for side, results in by_side.items():
            seed_means = [sum(r["after"]["final"]) / len(r["after"]["final"]) for r in results]
            merged = summary[task]["sides"][side]["after"]["over_seeds"]["final"]
            assert merged["mean"] == pytest.approx(sum(seed_means) / len(seed_means))
            assert merged["seeds"] == len(results) == (2 if task == "writing" else 1)
    # the verdicts compare the merged scores, trained and untrained: over seeds for writing (2 seeds a side)
    writing = summary["writing"]["sides"]
    for phase in ("after", "before"):
        comparison = summary["writing"]["team_vs_single"][phase]
        difference = (
            writing["team"][phase]["over_seeds"]["final"]["mean"]
            - writing["single"][phase]["over_seeds"]["final"]["mean"]
        )
        assert comparison["difference"] == pytest.approx(difference) and comparison["basis"].startswith("over seeds")
    assert set(summary["arithmetic"]) >= {"team_vs_single", "team_vs_revise"}


def test_smoke_budgets_and_evaluation_counts(smoke_results):
    per_part = {"writing": command.SIZES["smoke"]["writing_tokens"],
                "arithmetic": command.SIZES["smoke"]["arithmetic_tokens"]}  # fmt: skip
    held_out = {"writing": 16, "arithmetic": 32}
    for task, by_side in report.read_parts(smoke_results).items():
        step_caps = set()
        for side, results in by_side.items():
            agents, turns = sides.agents_and_turns(task, side)
            cap = sides.completion_tokens(task, side, per_part[task])
            budget = command.SIZES["smoke"]["token_budget"][task]
            for r in results:
                assert r["token_budget"] == budget and r["learning_rate"] == 1e-3
                assert 0 < r["train_cpu_s"] and 0 < r["train_s"]
                # training stopped after the first step that reached the budget: one reward call per turn and step
                assert len(r["curve"]) == r["steps"] * turns
                assert r["generated_tokens"] == r["curve"][-1]["tokens"] >= budget
                if r["steps"] > 1:
                    assert r["curve"][-turns - 1]["tokens"] < budget
                # a step never writes more than its completions' caps: 2 prompts x K = 4 per agent and turn
                first_step = r["curve"][turns - 1]["tokens"]
                assert first_step <= sides.PROMPTS_PER_STEP * sides.NUM_GENERATIONS * agents * turns * cap
                for phase in ("before", "after"):
                    assert all(len(values) == held_out[task] for values in r[phase].values())
                    assert all(0.0 <= v <= 1.0 for values in r[phase].values() for v in values)
            if turns == 1:
                step_caps.add(sides.PROMPTS_PER_STEP * sides.NUM_GENERATIONS * agents * cap)
        if task == "writing":  # the single agent's 2T tokens per completion match the team's two parts of T
            assert step_caps == {2 * sides.PROMPTS_PER_STEP * sides.NUM_GENERATIONS * per_part["writing"]}


def test_smoke_part_is_not_rerun_and_other_settings_are_refused(smoke_results):
    path = f"{smoke_results}/writing/team/seed0.json"
    before = open(path).read()
    command.main(["--smoke", "--lr", "1e-3", "--results", smoke_results, "--tasks", "writing", "--seeds", "0"])
    assert open(path).read() == before  # the existing part was skipped, not retrained
    with pytest.raises(SystemExit, match="token_budget: recorded 48, now 96"):
        command.main(["--smoke", "--lr", "1e-3", "--results", smoke_results, "--tasks", "writing",
                      "--token_budget", "96"])  # fmt: skip
