"""Runs TRL's own GRPOTrainer test file offline, against stock `GRPOTrainer` and with our classes swapped in.

    python tests/trl_contract/run_trl_tests.py PATH --mode stock|swapped|both [--subset all|ci|listed] [--workdir DIR]
        [--parallel] [--list-edits] [-- extra pytest args]

PATH is the folder that holds TRL's `test_grpo_trainer.py` and its helpers (`testing_utils.py`, `conftest.py`,
`__init__.py`, `data/`), e.g. `shared/trl_tests/tests` or a TRL checkout's `tests/`. TRL's `scripts/` folder
(`--scripts`, default `PATH/../scripts`) supplies the zen dataset's generator and the remote-code model's sources.

What it does:
1. builds, once, the tiny models and the zen dataset that the tests load from the Hub (offline_assets.py), cached in
   `WORKDIR/assets/` (rebuilt when TRL, transformers or the builder change, or with --rebuild-assets);
2. for each mode, copies the test files into `WORKDIR/run-MODE/tests/`, applies the edits listed in `EDITS` (and only
   those; `--list-edits` prints them), and runs pytest there with the Hub offline (HF_HUB_OFFLINE=1);
3. prints each test's outcome and writes them as JSON (`WORKDIR/results/MODE.json`, and `summary.json`);
4. compares them with the reviewed list `expected_swap_failures.txt` (beside this file): with `--mode both`, the
   swap-only failures (pass on stock, fail swapped) that the list does not name make the command exit 1; so does,
   with `--mode swapped`, a failure named in neither of the list's kinds. Listed tests that now pass are printed, so
   that the list is pruned.

The swap (`--mode swapped`): the test file's `GRPOConfig`/`GRPOTrainer` are `trl_multiagent.MAGRPOConfig` with
`num_agents=1` as its default, and `trl_multiagent.MAGRPOTrainer` (one agent also when a test passes no `args`).

Exit status: 0 when every failure is accounted for; 1 for unlisted failures; 2 for a usage or set-up error.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from offline_assets import ORG, SUBSTITUTIONS, build_assets, say


HERE = Path(__file__).resolve().parent
EXPECTED_FILE = HERE / "expected_swap_failures.txt"
DEFAULT_WORKDIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trl_multiagent" / "trl_contract"
TEST_FILE = "test_grpo_trainer.py"
REQUIRED_HELPERS = ("testing_utils.py", "conftest.py", "__init__.py")

# The one text edit made to TRL's test file: the classes under test come from a module the harness writes.
IMPORT_LINE = "from trl import GRPOConfig, GRPOTrainer"
IMPORT_REPLACEMENT = "from ._trainer_under_test import GRPOConfig, GRPOTrainer"

UNDER_TEST = {
    "stock": '''"""Written by trl_contract/run_trl_tests.py: stock TRL, the classes the test file imports unedited."""

from trl import GRPOConfig, GRPOTrainer


__all__ = ["GRPOConfig", "GRPOTrainer"]
''',
    "swapped": '''"""Written by trl_contract/run_trl_tests.py: trl_multiagent's classes under TRL's names, one agent."""

from dataclasses import dataclass, field

from trl_multiagent import MAGRPOConfig, MAGRPOTrainer


@dataclass
class GRPOConfig(MAGRPOConfig):
    """MAGRPOConfig whose `num_agents` defaults to 1: a team of one agent, which is what a GRPOTrainer trains."""

    num_agents: int | None = field(default=1)


class GRPOTrainer(MAGRPOTrainer):
    """MAGRPOTrainer; with no `args` (TRL then makes a default GRPOConfig) it is given `num_agents=1`."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("args") is None and kwargs.get("num_agents") is None:
            kwargs["num_agents"] = 1
        super().__init__(*args, **kwargs)


__all__ = ["GRPOConfig", "GRPOTrainer"]
''',
}

# Tests skipped by the harness (node-id prefix, without "tests/" -> reason). Tests that need a GPU, vLLM,
# liger-kernel, bitsandbytes or a newer transformers are skipped by TRL's own markers, not here.
SKIPS = {
    f"{TEST_FILE}::TestGRPOTrainerVLM::": "needs the tiny vision-language models, their image processors and the "
    "zen-image datasets from the Hub, which are not rebuilt offline",
}

# `from trl.import_utils import (a, b, ...)` in the copied helpers: an availability check that the installed TRL lacks
# (the test files may be older or newer than it) is defined in the copied file instead, from the package's presence.
IMPORT_UTILS_BLOCK = re.compile(
    r"^from trl\.import_utils import \(([^)]*)\)|^from trl\.import_utils import ([^\n(]+)$", re.M
)


def patch_missing_availability_checks(path: Path) -> list[str]:
    """Drops from `from trl.import_utils import ...` the `is_X_available` names the installed TRL lacks, and defines
    each in the file as `importlib.util.find_spec("X") is not None`. Returns the names (the edits made)."""
    import_utils = importlib.import_module("trl.import_utils")
    text = path.read_text(encoding="utf-8")
    missing: list[str] = []

    def rewrite(match: re.Match) -> str:
        names = [n.strip() for n in (match.group(1) or match.group(2)).replace("\n", ",").split(",") if n.strip()]
        absent = [n for n in names if not hasattr(import_utils, n)]
        bad = [n for n in absent if not re.fullmatch(r"is_\w+_available", n)]
        if bad:
            raise UsageError(
                f"{path.name} imports {', '.join(bad)} from trl.import_utils, which the installed TRL lacks"
            )
        missing.extend(absent)
        kept = [n for n in names if n not in absent]
        lines = [f"from trl.import_utils import ({', '.join(kept)})"] if kept else []
        lines += [
            f"def {n}():  # trl_contract: not in the installed trl.import_utils\n"
            f"    return __import__('importlib.util').util.find_spec({n[3:-10]!r}) is not None\n"
            for n in absent
        ]
        return "\n".join(lines)

    new = IMPORT_UTILS_BLOCK.sub(rewrite, text)
    if missing:
        path.write_text(new, encoding="utf-8")
    return missing


PYTEST_INI = """[pytest]
# Written by trl_contract/run_trl_tests.py: this folder is the rootdir, not the trl_multiagent repo.
markers =
    slow: TRL's slow tests (need an accelerator)
    low_priority: TRL's low-priority tests
addopts = -p _trl_contract_plugin -p no:cacheprovider -rfE
"""

ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
}

EDITS = [
    f"tests/{TEST_FILE}: `{IMPORT_LINE}` -> `{IMPORT_REPLACEMENT}` (the one text edit; both modes, so that both run "
    "the same file)",
    "tests/_trainer_under_test.py (new): stock: re-exports trl.GRPOConfig/GRPOTrainer; swapped: GRPOConfig = a "
    "MAGRPOConfig subclass whose num_agents defaults to 1, GRPOTrainer = a MAGRPOTrainer subclass that passes "
    "num_agents=1 when no args are given",
    f"run folder: `{ORG}/` links to the offline models and datasets (offline_assets.py), and the tests run from that "
    f"folder, so the ids `{ORG}/tiny-*` and `{ORG}/zen` resolve as local paths: no id is rewritten",
    "run folder: pytest.ini (rootdir here, markers slow/low_priority, -p _trl_contract_plugin, no cache) and "
    "_trl_contract_plugin.py (pytest_plugin.py: applies SKIPS, writes each outcome to JSON)",
    "skipped: " + "; ".join(f"{prefix}* ({reason})" for prefix, reason in SKIPS.items()),
    "environment: " + ", ".join(f"{k}={v}" for k, v in ENVIRONMENT.items()) + ", HF_HOME=WORKDIR/hf_home, "
    "OMP_NUM_THREADS=1 unless set",
    "helpers: an `is_X_available` that a copied file imports from trl.import_utils and the installed TRL lacks "
    "(with TRL 1.16: testing_utils.py's is_joblib_available) is removed from that import and defined in the file as "
    "`importlib.util.find_spec('X') is not None` (printed when made, recorded in MODE.json)",
    "copied: the other top-level .py files of PATH that are not tests (testing_utils.py, conftest.py, "
    "testing_constants.py, __init__.py) and data/, unedited but for edit 7",
    *(f"offline assets: {line}" for line in SUBSTITUTIONS),
]

# `--subset ci`: 42 tests that pass on both stock and swapped, in about 4 minutes on 2 cores (chosen from a full
# `--mode both` run, README.md): the helpers' unit tests, construction and argument checks, evaluation, and a few
# short training runs (plain, delta clipping, an iterable dataset, reward aggregation). Ids without "tests/".
CI_SUBSET = [
    f"{TEST_FILE}::TestGetHighEntropyMask::test_compute_entropy_mask_0",
    f"{TEST_FILE}::TestGetHighEntropyMask::test_compute_entropy_mask_1",
    f"{TEST_FILE}::TestGetHighEntropyMask::test_compute_entropy_mask_lower_threshold",
    f"{TEST_FILE}::TestGetHighEntropyMask::test_compute_entropy_threshold_0",
    f"{TEST_FILE}::TestGetHighEntropyMask::test_compute_entropy_threshold_1",
    f"{TEST_FILE}::TestGetHighEntropyMask::test_compute_entropy_all_masked",
    f"{TEST_FILE}::TestGRPORolloutDispatch::test_generate_rollout_func_raises_when_required_keys_are_missing",
    f"{TEST_FILE}::TestTransformersContinuousBatchingContract::test_generation_output_has_logprobs_field",
    f"{TEST_FILE}::TestTransformersContinuousBatchingContract::test_generation_output_logprobs_accepts_floats",
    f"{TEST_FILE}::TestTransformersContinuousBatchingContract::test_continuous_batching_config_has_return_logprobs",
    f"{TEST_FILE}::TestTransformersContinuousBatchingContract::test_generate_batch_accepts_continuous_batching_config",
    f"{TEST_FILE}::TestGRPOTrainer::test_init_minimal",
    f"{TEST_FILE}::TestGRPOTrainer::test_init_with_eval_dataset[none]",
    f"{TEST_FILE}::TestGRPOTrainer::test_init_with_eval_dataset[dataset]",
    f"{TEST_FILE}::TestGRPOTrainer::test_init_with_eval_dataset[iterable_dataset]",
    f"{TEST_FILE}::TestGRPOTrainer::test_init_with_eval_dataset[dict_of_dataset]",
    f"{TEST_FILE}::TestGRPOTrainer::test_init_with_eval_dataset[dict_of_iterable_dataset]",
    f"{TEST_FILE}::TestGRPOTrainer::test_iterable_dataset_requires_dispatch_batches_false",
    f"{TEST_FILE}::TestGRPOTrainer::test_iterable_dataset_forces_num_workers_zero",
    f"{TEST_FILE}::TestGRPOTrainer::test_iterable_eval_keeps_map_style_train_workers",
    f"{TEST_FILE}::TestGRPOTrainer::test_evaluate_with_eval_dataset[dataset]",
    f"{TEST_FILE}::TestGRPOTrainer::test_evaluate_with_eval_dataset[dataset_dict]",
    f"{TEST_FILE}::TestGRPOTrainer::test_evaluate_with_eval_dataset[iterable_dataset]",
    f"{TEST_FILE}::TestGRPOTrainer::test_evaluate_with_eval_dataset[dict_of_dataset]",
    f"{TEST_FILE}::TestGRPOTrainer::test_get_off_policy_mask",
    f"{TEST_FILE}::TestGRPOTrainer::test_get_off_policy_mask_padding",
    f"{TEST_FILE}::TestGRPOTrainer::test_warning_raised_sequence_level_with_token_summed_loss[grpo]",
    f"{TEST_FILE}::TestGRPOTrainer::test_warning_raised_sequence_level_with_token_summed_loss[bnpo]",
    f"{TEST_FILE}::TestGRPOTrainer::test_warning_raised_sequence_level_with_token_summed_loss[dr_grpo]",
    f"{TEST_FILE}::TestGRPOTrainer::test_warning_raised_sequence_level_with_token_summed_loss[dapo]",
    f"{TEST_FILE}::TestGRPOTrainer::test_warning_raised_sequence_level_with_token_summed_loss[cispo]",
    f"{TEST_FILE}::TestGRPOTrainer::test_dataset_required_without_environment",
    f"{TEST_FILE}::TestGRPOTrainer::test_environment_owned_data_requires_max_steps",
    f"{TEST_FILE}::TestGRPOTrainer::test_environment_owned_reward_mixed_environments",
    f"{TEST_FILE}::TestGRPOTrainer::test_mismatched_reward_processing_classes_length",
    f"{TEST_FILE}::TestGRPOTrainer::test_correct_reward_processing_classes_list",
    f"{TEST_FILE}::TestGRPOTrainer::test_single_reward_model_with_single_processing_class",
    f"{TEST_FILE}::TestGRPOTrainer::test_train[trl-internal-testing/tiny-Qwen2ForCausalLM-2.5]",
    f"{TEST_FILE}::TestGRPOTrainer::test_train_delta_clipping[False]",
    f"{TEST_FILE}::TestGRPOTrainer::test_train_with_iterable_dataset",
    f"{TEST_FILE}::TestGRPOTrainer::test_train_normalize_then_sum_aggregation",
    f"{TEST_FILE}::TestGRPOTrainer::test_reward_metric_reflects_reward_weights[normalize_then_sum]",
]

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
FAILED = ("failed", "error")


class UsageError(Exception):
    pass


def check_tests_dir(path: Path) -> None:
    if not path.is_dir():
        raise UsageError(f"PATH {path} is not a folder (it must hold TRL's {TEST_FILE} and its helpers)")
    missing = [name for name in (TEST_FILE, *REQUIRED_HELPERS) if not (path / name).exists()]
    if missing:
        raise UsageError(
            f"PATH {path} lacks {', '.join(missing)}: give the folder that holds TRL's {TEST_FILE} and its helpers "
            "(e.g. shared/trl_tests/tests, or a TRL checkout's tests/)"
        )


def prepare_run_dir(tests_dir: Path, run_dir: Path, mode: str, assets_root: Path, plugin: Path) -> dict:
    """A fresh run folder: the copied tests with the listed edits, the plugin, pytest.ini and the assets link."""
    shutil.rmtree(run_dir, ignore_errors=True)
    target = run_dir / "tests"
    target.mkdir(parents=True)
    for source in tests_dir.iterdir():
        if (
            source.is_file()
            and source.suffix == ".py"
            and (not source.name.startswith("test_") or source.name == TEST_FILE)
        ):
            shutil.copy(source, target / source.name)
    if (tests_dir / "data").is_dir():
        shutil.copytree(tests_dir / "data", target / "data")
    text = (target / TEST_FILE).read_text(encoding="utf-8")
    if text.count(IMPORT_LINE) != 1:
        raise UsageError(
            f"{tests_dir / TEST_FILE}: expected the line `{IMPORT_LINE}` once (found {text.count(IMPORT_LINE)}); "
            "this TRL version imports its classes differently, and IMPORT_LINE in run_trl_tests.py must follow it"
        )
    (target / TEST_FILE).write_text(text.replace(IMPORT_LINE, IMPORT_REPLACEMENT), encoding="utf-8")
    (target / "_trainer_under_test.py").write_text(UNDER_TEST[mode], encoding="utf-8")
    shutil.copy(plugin, run_dir / "_trl_contract_plugin.py")
    (run_dir / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
    (run_dir / ORG).symlink_to(assets_root / ORG, target_is_directory=True)
    patched = {}
    for helper in sorted(target.glob("*.py")):
        names = patch_missing_availability_checks(helper)
        if names:
            patched[helper.name] = names
    return patched


def pytest_command(selection: list[str], extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *selection, *extra]


def start_run(mode, tests_dir, workdir, assets_root, selection, extra) -> tuple[subprocess.Popen, dict]:
    run_dir = workdir / f"run-{mode}"
    results_dir = workdir / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    patched = prepare_run_dir(tests_dir, run_dir, mode, assets_root, HERE / "pytest_plugin.py")
    for name, names in patched.items():
        say(f"run_trl_tests: [{mode}] tests/{name}: {', '.join(names)} defined locally (not in the installed TRL)")
    skips_file = run_dir / "skips.json"
    skips_file.write_text(json.dumps(SKIPS, indent=1))
    raw = results_dir / f"{mode}.raw.json"
    raw.unlink(missing_ok=True)
    env = {
        **os.environ,
        **ENVIRONMENT,
        "HF_HOME": str(workdir / "hf_home"),
        "TRL_CONTRACT_RESULTS": str(raw),
        "TRL_CONTRACT_SKIPS": str(skips_file),
    }
    env.setdefault("OMP_NUM_THREADS", "1")
    command = pytest_command(selection, extra)
    log = open(results_dir / f"{mode}.log", "w")  # closed by finish_run
    shown = (
        " ".join(command) if len(selection) <= 3 else " ".join([*command[:3], f"<{len(selection)} test ids>", *extra])
    )
    say(f"run_trl_tests: [{mode}] {shown}  (in {run_dir}; log {log.name})")
    process = subprocess.Popen(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    return process, {
        "mode": mode,
        "patched": patched,
        "raw": raw,
        "log": log,
        "command": command,
        "run_dir": run_dir,
        "start": time.time(),
    }


def finish_run(process: subprocess.Popen, info: dict, selection_ids: list[str] | None) -> dict:
    returncode = process.wait()
    info["log"].close()
    wall = round(info.get("end", time.time()) - info["start"], 1)
    if not info["raw"].exists():
        tail = Path(info["log"].name).read_text(errors="replace")[-3000:]
        raise UsageError(f"[{info['mode']}] pytest wrote no results (exit {returncode}); its log ends:\n{tail}")
    tests = json.loads(info["raw"].read_text())["tests"]
    collect_errors = {i: t for i, t in tests.items() if t["outcome"] == "collect-error"}
    if collect_errors or returncode not in (0, 1):
        tail = Path(info["log"].name).read_text(errors="replace")[-3000:]
        raise UsageError(
            f"[{info['mode']}] pytest exited {returncode}"
            + (f", collection errors in {', '.join(collect_errors)}" if collect_errors else "")
            + f"; its log ({info['log'].name}) ends:\n{tail}"
        )
    if selection_ids is not None:
        for test_id in selection_ids:  # a listed CI test that pytest did not collect is a failure, not a silence
            tests.setdefault(test_id, {"outcome": "error", "duration": 0.0, "message": "not collected"})
    counts = {outcome: sum(1 for t in tests.values() if t["outcome"] == outcome) for outcome in OUTCOMES}
    counts["total"] = len(tests)
    counts["ran"] = counts["total"] - counts["skipped"]
    return {
        "mode": info["mode"],
        "command": " ".join(info["command"]),
        "run_dir": str(info["run_dir"]),
        "pytest_exit": returncode,
        "availability_checks_defined_locally": info["patched"],
        "wall_seconds": wall,
        "counts": counts,
        "tests": tests,
    }


def load_expected(path: Path) -> dict[str, dict]:
    """The reviewed list: `[swap-only: CAUSE]` / `[stock: CAUSE]` headers, then `TEST_ID -- REASON` lines."""
    expected, kind, cause = {}, None, None
    if not path.exists():
        return expected
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            kind, _, cause = line[1:-1].partition(":")
            kind, cause = kind.strip(), cause.strip()
            if kind not in ("swap-only", "stock"):
                raise UsageError(f"{path}:{number}: a header is [swap-only: CAUSE] or [stock: CAUSE], not {line}")
            continue
        test_id, sep, reason = line.partition(" -- ")
        if not sep or kind is None:
            raise UsageError(f"{path}:{number}: expected `TEST_ID -- REASON` under a [swap-only: ...] header: {line}")
        expected[test_id.strip()] = {"kind": kind, "cause": cause, "reason": reason.strip()}
    return expected


def compare(results: dict[str, dict], expected: dict[str, dict]) -> dict:
    stock, swapped = results.get("stock"), results.get("swapped")
    report: dict = {}
    if swapped is None:
        return report
    failing = {i for i, t in swapped["tests"].items() if t["outcome"] in FAILED}
    if stock is not None:
        stock_failing = {i for i, t in stock["tests"].items() if t["outcome"] in FAILED}
        stock_passing = {i for i, t in stock["tests"].items() if t["outcome"] == "passed"}
        swap_only = sorted(failing & stock_passing)
        report["swap_only_failures"] = swap_only
        report["failing_on_both"] = sorted(failing & stock_failing)
        report["stock_only_failures"] = sorted(stock_failing - failing)
        report["listed"] = [i for i in swap_only if expected.get(i, {}).get("kind") == "swap-only"]
        report["unlisted"] = [i for i in swap_only if expected.get(i, {}).get("kind") != "swap-only"]
        report["listed_swap_only_failing_on_stock"] = sorted(
            i for i, e in expected.items() if e["kind"] == "swap-only" and i in stock_failing
        )
        report["stock_list_drift"] = sorted(
            i for i, e in expected.items() if e["kind"] == "stock" and i in stock["tests"] and i not in stock_failing
        )
        report["stock_failures_unlisted"] = sorted(
            i for i in stock_failing if expected.get(i, {}).get("kind") != "stock"
        )
    else:  # swapped alone: a failure is accounted for when the list names it, as swap-only or as failing on stock
        report["listed"] = sorted(i for i in failing if i in expected)
        report["unlisted"] = sorted(i for i in failing if i not in expected)
    # A listed test that passes swapped: the list is out of date (a fix landed): prune it.
    report["listed_now_passing"] = sorted(
        i for i in expected if swapped["tests"].get(i, {}).get("outcome") in ("passed", "xpassed")
    )
    return report


def print_report(results: dict[str, dict], report: dict, expected: dict[str, dict]) -> None:
    modes = [m for m in ("stock", "swapped") if m in results]
    ids = sorted({i for m in modes for i in results[m]["tests"]})
    say("")
    say("  ".join(f"{m:>8}" for m in modes) + "  test")
    for test_id in ids:
        outcomes = [results[m]["tests"].get(test_id, {}).get("outcome", "-") for m in modes]
        say("  ".join(f"{o:>8}" for o in outcomes) + f"  {test_id}")
    say("")
    for mode in modes:
        c = results[mode]["counts"]
        say(
            f"{mode}: {c['total']} tests, {c['ran']} ran on CPU: {c['passed']} passed, {c['failed']} failed, "
            f"{c['error']} errors, {c['xfailed']} xfailed, {c['xpassed']} xpassed; {c['skipped']} skipped "
            f"({results[mode]['wall_seconds']} s)"
        )
    if not report:
        return

    def show(title, items, with_reason=False):
        say(f"{title}: {len(items)}")
        for test_id in items:
            message = results["swapped"]["tests"].get(test_id, {}).get("message", "")
            entry = expected.get(test_id)
            detail = f"[{entry['cause']}] {entry['reason']}" if with_reason and entry else message[:200]
            say(f"    {test_id}  {detail}")

    if "swap_only_failures" in report:
        say(f"swap-only failures (pass on stock, fail swapped): {len(report['swap_only_failures'])}")
        show("  listed (expected, with a reason)", report["listed"], with_reason=True)
        show("  UNLISTED (add them to expected_swap_failures.txt with a reason, or fix them)", report["unlisted"])
        show("failing on both (not the swap's doing)", report["failing_on_both"])
        show("failing on stock only", report["stock_only_failures"])
        if report["stock_failures_unlisted"]:
            show("stock failures the list does not name as [stock: ...]", report["stock_failures_unlisted"])
        if report["stock_list_drift"]:
            show("listed as failing on stock, but no longer fail there (prune them)", report["stock_list_drift"])
        if report["listed_swap_only_failing_on_stock"]:
            show(
                "listed as swap-only, but failing on stock too (move them to a [stock: ...] section)",
                report["listed_swap_only_failing_on_stock"],
            )
    else:
        show("listed failures", report["listed"], with_reason=True)
        show("UNLISTED failures", report["unlisted"])
    if report["listed_now_passing"]:
        show("listed but now passing (prune them from expected_swap_failures.txt)", report["listed_now_passing"])


def versions() -> dict:
    """What was tested: the libraries' versions, and trl_multiagent's commit and whether its files had edits."""
    import importlib.metadata as metadata

    found = {}
    for name in ("trl", "transformers", "torch", "datasets", "peft", "trl_multiagent"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    spec = importlib.util.find_spec("trl_multiagent")
    if spec is not None and spec.origin:
        package = Path(spec.origin).parent
        found["trl_multiagent_path"] = str(package)
        git = ["git", "-C", str(package.parent)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0:
            dirty = subprocess.run([*git, "status", "--porcelain", "--", package.name], capture_output=True, text=True)
            found["trl_multiagent_commit"] = head.stdout.strip()
            found["trl_multiagent_uncommitted_files"] = len(dirty.stdout.splitlines())
    return found


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(
        prog="run_trl_tests.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("path", nargs="?", type=Path, help=f"folder with TRL's {TEST_FILE} and its helpers")
    parser.add_argument("--mode", choices=("stock", "swapped", "both"), default="both")
    parser.add_argument(
        "--subset",
        choices=("all", "ci", "listed"),
        default="all",
        help="ci: the CI_SUBSET tests only; listed: the tests named in the list (--expected), to check fixes",
    )
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"default {DEFAULT_WORKDIR}")
    parser.add_argument("--scripts", type=Path, help="TRL's scripts/ folder (default PATH/../scripts)")
    parser.add_argument("--expected", type=Path, default=EXPECTED_FILE, help="the reviewed list of failures")
    parser.add_argument("--json", type=Path, help="also write the summary here (default WORKDIR/results/summary.json)")
    parser.add_argument("--parallel", action="store_true", help="--mode both: run the two modes at once (2 processes)")
    parser.add_argument("--rebuild-assets", action="store_true", help="rebuild the offline models and datasets")
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="run nothing: compare WORKDIR/results/MODE.json of an earlier run with the list (after editing it)",
    )
    parser.add_argument("--list-edits", action="store_true", help="print the edits the harness makes, and exit")
    return parser.parse_args(argv), extra


def main(argv: list[str]) -> int:
    args, extra = parse_args(argv)
    if args.list_edits:
        say("Edits that run_trl_tests.py makes to TRL's test files and their environment (nothing else changes):")
        for number, edit in enumerate(EDITS, 1):
            say(f"  {number}. {edit}")
        return 0
    if args.path is None:
        raise UsageError(f"give PATH, the folder with TRL's {TEST_FILE} (e.g. shared/trl_tests/tests)")
    tests_dir = args.path.resolve()
    check_tests_dir(tests_dir)
    scripts_dir = (args.scripts or tests_dir.parent / "scripts").resolve()
    workdir = args.workdir.resolve()
    if HERE.parent in workdir.parents or workdir == HERE.parent:
        raise UsageError(f"--workdir {workdir} is inside the repo's tests/: choose a folder outside it")
    expected = load_expected(args.expected)
    if args.subset == "ci" and not CI_SUBSET:
        raise UsageError("CI_SUBSET in run_trl_tests.py is empty")
    if args.subset == "listed" and not expected:
        raise UsageError(f"--subset listed: {args.expected} names no test")
    selection_ids = {"ci": list(CI_SUBSET), "listed": list(expected), "all": None}[args.subset]
    selection = [f"tests/{i}" for i in selection_ids] if selection_ids else [f"tests/{TEST_FILE}"]

    tested = versions()  # before the runs: trl_multiagent's files may change while they go on
    if not args.from_results:
        assets_root = build_assets(workdir / "assets", scripts_dir, rebuild=args.rebuild_assets)
    modes = ["stock", "swapped"] if args.mode == "both" else [args.mode]
    results: dict[str, dict] = {}
    if args.from_results:
        for mode in modes:
            path = workdir / "results" / f"{mode}.json"
            if not path.exists():
                raise UsageError(f"--from-results: {path} does not exist (run --mode {mode} first)")
            results[mode] = json.loads(path.read_text())
            tested = results[mode].get("versions", tested)
    elif args.parallel and len(modes) == 2:
        started = [start_run(m, tests_dir, workdir, assets_root, selection, extra) for m in modes]
        while any(process.poll() is None for process, _ in started):
            for process, info in started:
                if process.poll() is not None:
                    info.setdefault("end", time.time())
            time.sleep(2)
        for process, info in started:
            results[info["mode"]] = finish_run(process, info, selection_ids)
    else:
        for mode in modes:
            process, info = start_run(mode, tests_dir, workdir, assets_root, selection, extra)
            results[mode] = finish_run(process, info, selection_ids)
    for mode, result in results.items():
        result["versions"] = tested
        (workdir / "results" / f"{mode}.json").write_text(json.dumps(result, indent=1))
    report = compare(results, expected)
    print_report(results, report, expected)

    origin = tests_dir.parent / "ORIGIN"
    summary = {
        "tests_dir": str(tests_dir),
        "origin": origin.read_text().strip() if origin.exists() else None,
        "mode": args.mode,
        "subset": args.subset,
        "versions": tested,
        "counts": {m: r["counts"] for m, r in results.items()},
        "wall_seconds": {m: r["wall_seconds"] for m, r in results.items()},
        "commands": {m: r["command"] for m, r in results.items()},
        **report,
        "outcomes": {m: {i: t["outcome"] for i, t in r["tests"].items()} for m, r in results.items()},
    }
    for path in {workdir / "results" / "summary.json", *([args.json] if args.json else [])}:
        path.write_text(json.dumps(summary, indent=1))
    say(f"\nrun_trl_tests: results in {workdir / 'results'} (summary.json, MODE.json with tracebacks, MODE.log)")
    if report.get("unlisted"):
        say(f"run_trl_tests: FAILED: {len(report['unlisted'])} unlisted failures")
        return 1
    say("run_trl_tests: OK: every failure is accounted for")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as error:
        sys.stderr.write(f"run_trl_tests: error: {error}\n")
        sys.exit(2)
