"""benchmarks/credit/run.py --smoke: every method, control and mechanism check ends in results.json with numbers, and
results.md has the table rows; plus the report's comparison rule on hand-made intervals."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest


# The benchmark runs end to end in fresh processes (about a minute and a half on 2 cores): the slow stage.
pytestmark = pytest.mark.slow

CREDIT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "credit")
METHODS = ["untrained", "single_policy", "defaults", "branching_best", "scale_agent", "alpha_0.7", "agent_lr"]


def finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("credit")
    run = subprocess.run(
        [sys.executable, os.path.join(CREDIT, "run.py"), "--smoke", "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return out, json.loads((out / "results.json").read_text()), (out / "results.md").read_text()


def test_every_method_has_held_out_numbers_over_its_seeds(smoke):
    _, results, _ = smoke
    seeds = results["meta"]["seeds"]
    assert seeds == [0] and results["meta"]["steps"] == 2
    skipped = results["skipped"]
    assert set(results["methods"]) | set(skipped) == set(METHODS)
    assert set(skipped) <= {"agent_lr"}  # the only optional method (when the trainer refuses per-agent rates)
    assert set(results["held_out_prompts"]).isdisjoint(results["training_prompts"])
    for name, entry in results["methods"].items():
        assert entry["seeds"] == seeds, name
        for turn in ("1", "2"):
            held = entry["held_out"][turn]
            assert held["n"] == len(seeds) and finite(held["mean"]) and 0.0 <= held["mean"] <= 1.0, (name, turn)
        if name == "untrained":
            assert entry["optimizer_steps"] == [0] and entry["sampled_tokens"]["mean"] == 0
            continue
        assert entry["optimizer_steps"] == [2] * len(seeds), name  # matched budgets: the same steps for every method
        assert finite(entry["sampled_tokens"]["mean"]) and entry["sampled_tokens"]["mean"] > 0, name
        assert len(entry["curve"]["step"]) == 2 and all(finite(v) for v in entry["curve"]["1"]), name
        assert finite(entry["train_turn1_last_quarter"]["mean"]) and finite(entry["grad_norm_median"]["mean"])
    methods = results["methods"]
    # alpha 0.7: every joint answer carried each agent's own reward, as credit_task defines it
    assert methods["alpha_0.7"]["own_rewards_match"] == [True] * len(seeds)
    if "agent_lr" in methods:  # the optimizer held the two agents' rates
        assert methods["agent_lr"]["optimizer_rates"] == [[0.0005, 0.001]] * len(seeds)
    # best-only branching samples fewer tokens in the same steps (one continued joint answer per node, not K)
    assert methods["branching_best"]["sampled_tokens"]["mean"] < methods["defaults"]["sampled_tokens"]["mean"]
    assert finite(results["matched_tokens"]["defaults_turn1_at_same_tokens"]["mean"])
    for name in set(methods) - {"defaults"}:
        for line in results["comparisons"][name].values():
            assert line.startswith(("higher than defaults", "lower than defaults", "not distinguishable from"))


def test_controls_have_numbers(smoke):
    _, results, _ = smoke
    controls = results["controls"]
    assert set(controls) == {"role_swap", "best_of_n", "best_of_n_base_model"}
    for name, control in controls.items():
        for turn in ("1", "2"):
            assert control[turn]["n"] == 1 and finite(control[turn]["mean"]), (name, turn)
        assert control["sampled_tokens"]["mean"] > 0
    team_tokens = results["methods"]["defaults"]["eval_sampled_tokens"]["mean"]
    for name in ("best_of_n", "best_of_n_base_model"):
        assert controls[name]["N"][0] >= 1
        # equal inference budget: within about one sample's tokens of the team's evaluation
        assert abs(controls[name]["sampled_tokens"]["mean"] - team_tokens) <= 0.25 * team_tokens


def test_mechanism_checks_show_the_scales_and_the_token_counts(smoke):
    _, results, _ = smoke
    mech = results["mechanisms"]
    scales = mech["reward_scales"]
    assert set(scales) == {"batch", "agent"}
    for mode in scales:
        for key in ("agent_0_max", "agent_0_median", "agent_1_max", "agent_1_median", "ratio_median_1_over_0"):
            assert scales[mode][key]["n"] == 1 and finite(scales[mode][key]["mean"]) and scales[mode][key]["mean"] > 0
    # one std over both agents leaves agent 1's 100x larger rewards in its gradients; its own std removes them
    assert scales["batch"]["ratio_median_1_over_0"]["mean"] > 5.0
    assert 0.2 < scales["agent"]["ratio_median_1_over_0"]["mean"] < 5.0
    branching = mech["branching_T3"]
    assert branching["all"]["optimizer_steps"] == branching["best"]["optimizer_steps"] == [2]
    assert branching["best"]["tokens_per_step"]["mean"] < branching["all"]["tokens_per_step"]["mean"] / 3
    for mode in ("all", "best"):
        assert finite(branching[mode]["turn1_reward"]["mean"])


def test_markdown_has_the_tables_and_the_plots_exist(smoke):
    out, results, text = smoke
    for name in results["methods"]:
        assert f"| {name} | " in text, name
    assert (
        "| method | held-out turn 1 | held-out turn 2 | sampled tokens (training) | optimizer steps | seeds |" in text
    )
    assert (
        "| role swap (defaults team, seats exchanged) |" in text and "| best-of-N, base model in every seat |" in text
    )
    assert "| batch |" in text and "| agent |" in text and "| all |" in text and "| best |" in text
    assert "os.getloadavg() before" in text and "Command: `python benchmarks/credit/run.py --smoke" in text
    for png in ("reward_vs_steps.png", "reward_vs_tokens.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def rerun(out, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, os.path.join(CREDIT, "run.py"), "--smoke", "--out", str(out), *args],
        capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=600,
    )  # fmt: skip


def test_resume_keeps_the_runs_done_and_runs_the_rest(smoke, tmp_path):
    """`--resume` after an interruption: the runs in partial_results.json are kept as they are (a marker value in one
    of them reaches the report), the missing one runs, and the report covers every method."""
    out, _, _ = smoke
    partial = json.loads((out / "partial_results.json").read_text())
    by_method = {r.get("method"): r for r in partial["results"]}
    by_method["scale_agent"]["eval"]["team"]["turns"]["1"] = 0.123456  # no rollout gives this: proves it was kept
    partial["results"] = [r for r in partial["results"] if r.get("method") != "untrained"]  # the cheapest run to redo
    (tmp_path / "partial_results.json").write_text(json.dumps(partial))
    run = rerun(tmp_path, "--resume")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "--resume: 7 of 8 runs already done" in run.stdout
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["methods"]["scale_agent"]["held_out"]["1"]["mean"] == 0.123456
    assert results["methods"]["untrained"]["optimizer_steps"] == [0]  # the missing run ran
    assert finite(results["methods"]["untrained"]["held_out"]["2"]["mean"])
    assert results["meta"]["resumed"] == 7


def test_resume_refuses_other_settings(smoke, tmp_path):
    """A partial file from a run with other settings would break the matched budgets: refused, and left as it was."""
    out, _, _ = smoke
    shutil.copy(out / "partial_results.json", tmp_path / "partial_results.json")
    before = (tmp_path / "partial_results.json").read_text()
    run = rerun(tmp_path, "--resume", "--steps", "3")
    assert run.returncode != 0
    assert "credit/run.py --resume:" in run.stderr and "'steps': 2" in run.stderr and "'steps': 3" in run.stderr
    assert (tmp_path / "partial_results.json").read_text() == before
    assert not (tmp_path / "results.json").exists()


def test_comparison_lines_follow_the_intervals(monkeypatch):
    monkeypatch.syspath_prepend(CREDIT)  # the benchmark's modules import each other as scripts in one folder do
    import credit_report as report

    def iv(mean, hw):
        return {"mean": mean, "half_width": hw, "low": mean - hw, "high": mean + hw}

    assert report.compare(iv(0.8, 0.05), iv(0.5, 0.05)) == "higher than defaults (intervals do not overlap)"
    assert report.compare(iv(0.4, 0.05), iv(0.5, 0.02)) == "lower than defaults (intervals do not overlap)"
    assert report.compare(iv(0.56, 0.05), iv(0.5, 0.05)) == "not distinguishable from defaults (intervals overlap)"
    assert report.compare(iv(0.9, float("nan")), iv(0.5, 0.05)).startswith("not distinguishable")
