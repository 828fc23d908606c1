"""Runs TRL's own GRPOTrainer test file offline, against stock `GRPOTrainer` and with our classes swapped in.

    python tests/trl_contract/run_trl_tests.py PATH --mode stock|swapped|both [--subset all|ci|listed] [--workdir DIR]
        [--record-stock] [--activation-checkpointing ours|trl] [--parallel] [--list-edits] [-- extra pytest args]

PATH is the folder that holds TRL's `test_grpo_trainer.py` and its helpers (`testing_utils.py`, `conftest.py`,
`__init__.py`, `data/`), e.g. `shared/trl_tests/tests` or a TRL checkout's `tests/`. TRL's `scripts/` folder
(`--scripts`, default `PATH/../scripts`) supplies the zen dataset's generator and the remote-code model's sources.

What it does:
1. builds, once, the tiny models and the zen dataset that the tests load from the Hub (offline_assets.py), cached in
   `WORKDIR/assets/` (rebuilt when TRL, transformers or the builder change, or with --rebuild-assets);
2. for each mode, copies the test files into `WORKDIR/run-MODE/tests/`, applies the edits listed in `EDITS` (and only
   those; `--list-edits` prints them), and runs pytest there with the Hub offline (HF_HUB_OFFLINE=1);
3. prints each test's outcome and, for a failure, where it failed (the exception's type and the line of TRL's test
   file), and writes them as JSON (`WORKDIR/results/MODE.json`, and `summary.json`);
4. compares the swapped run with the stock side, test by test, outcome and place: the stock run of `--mode both`, or
   else the recorded stock run committed beside this file (`stock_outcomes.json`, written by `--record-stock`, which
   runs stock and records each test's outcome and failure place with the versions; a record of another TRL version
   is refused until it is refreshed). A test that fails here and passes on stock, fails on both at another place
   (exception or line), or fails on stock and passes here, must be named in the reviewed list
   `expected_swap_failures.txt` (beside this file) under its kind, with a reason; any that is not makes the command
   exit 1. Listed tests whose kind no longer matches are printed, so that the list is kept true.

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

from trl_multiagent.demo.contract import FAILED, OUTCOMES, UsageError, finish_run
from trl_multiagent.demo.contract import OFFLINE_ENVIRONMENT as ENVIRONMENT


HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]  # the checkout whose trl_multiagent the swapped run tests (on PYTHONPATH, before any install)
EXPECTED_FILE = HERE / "expected_swap_failures.txt"
STOCK_RECORD = HERE / "stock_outcomes.json"
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
{checkpointing}

class GRPOTrainer(MAGRPOTrainer):
    """MAGRPOTrainer; with no `args` (TRL then makes a default GRPOConfig) it is given `num_agents=1`."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("args") is None and kwargs.get("num_agents") is None:
            kwargs["num_agents"] = 1
        super().__init__(*args, **kwargs)


__all__ = ["GRPOConfig", "GRPOTrainer"]
''',
}

# `--activation-checkpointing trl`: the swapped config takes GRPOConfig's own default (True), where MAGRPOConfig's
# turns it off on a CPU, so that the path runs under TRL's tests too.
TRL_CHECKPOINTING_FIELD = """    # trl_contract --activation-checkpointing trl: GRPOConfig's default, not MAGRPOConfig's (off on a CPU)
    gradient_checkpointing: bool | None = field(default=True)
"""


def under_test(mode: str, activation_checkpointing: str) -> str:
    """The `_trainer_under_test.py` of a mode."""
    if mode == "stock":
        return UNDER_TEST["stock"]
    return UNDER_TEST["swapped"].replace(
        "{checkpointing}", TRL_CHECKPOINTING_FIELD if activation_checkpointing == "trl" else ""
    )


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


EDITS = [
    f"tests/{TEST_FILE}: `{IMPORT_LINE}` -> `{IMPORT_REPLACEMENT}` (the one text edit; both modes, so that both run "
    "the same file)",
    "tests/_trainer_under_test.py (new): stock: re-exports trl.GRPOConfig/GRPOTrainer; swapped: GRPOConfig = a "
    "MAGRPOConfig subclass whose num_agents defaults to 1 (and, with --activation-checkpointing trl, whose "
    "gradient_checkpointing defaults to True, GRPOConfig's), GRPOTrainer = a MAGRPOTrainer subclass that passes "
    "num_agents=1 when no args are given",
    f"run folder: `{ORG}/` links to the offline models and datasets (offline_assets.py), and the tests run from that "
    f"folder, so the ids `{ORG}/tiny-*` and `{ORG}/zen` resolve as local paths: no id is rewritten",
    "run folder: pytest.ini (rootdir here, markers slow/low_priority, -p _trl_contract_plugin, no cache) and "
    "_trl_contract_plugin.py (pytest_plugin.py: applies SKIPS, writes each outcome to JSON)",
    "skipped: " + "; ".join(f"{prefix}* ({reason})" for prefix, reason in SKIPS.items()),
    "environment: " + ", ".join(f"{k}={v}" for k, v in ENVIRONMENT.items()) + ", HF_HOME=WORKDIR/hf_home, "
    "OMP_NUM_THREADS=1 unless set, PYTHONPATH=this repo first (the swapped run tests this checkout's trl_multiagent)",
    "helpers: an `is_X_available` that a copied file imports from trl.import_utils and the installed TRL lacks "
    "(with TRL 1.16: testing_utils.py's is_joblib_available) is removed from that import and defined in the file as "
    "`importlib.util.find_spec('X') is not None` (printed when made, recorded in MODE.json)",
    "copied: the other top-level .py files of PATH that are not tests (testing_utils.py, conftest.py, "
    "testing_constants.py, __init__.py) and data/, unedited but for edit 7",
    *(f"offline assets: {line}" for line in SUBSTITUTIONS),
]

# `--subset ci`: the tests of `ci_subset.txt` (beside this file; `read_ci_subset`), each with the outcome it must have
# swapped; tests/test_trl_contract.py runs them in the repo's suite and asserts each.
CI_SUBSET_FILE = HERE / "ci_subset.txt"


def read_ci_subset(path: Path = CI_SUBSET_FILE) -> dict[str, dict]:
    """`OUTCOME TEST_ID  # AREA` lines (ids without "tests/"): {test id: {"outcome", "area"}}."""
    subset = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line, _, area = raw.partition("#")
        if not line.strip():
            continue
        outcome, _, test_id = line.strip().partition(" ")
        if outcome not in ("passed", "failed", "skipped") or not test_id.strip():
            raise UsageError(
                f"{path}:{number}: expected `OUTCOME TEST_ID  # AREA`, OUTCOME passed/failed/skipped: {raw}"
            )
        subset[test_id.strip()] = {"outcome": outcome, "area": area.strip()}
    return subset


def check_tests_dir(path: Path) -> None:
    if not path.is_dir():
        raise UsageError(f"PATH {path} is not a folder (it must hold TRL's {TEST_FILE} and its helpers)")
    missing = [name for name in (TEST_FILE, *REQUIRED_HELPERS) if not (path / name).exists()]
    if missing:
        raise UsageError(
            f"PATH {path} lacks {', '.join(missing)}: give the folder that holds TRL's {TEST_FILE} and its helpers "
            "(e.g. shared/trl_tests/tests, or a TRL checkout's tests/)"
        )


def prepare_run_dir(
    tests_dir: Path, run_dir: Path, mode: str, assets_root: Path, plugin: Path, activation_checkpointing: str = "ours"
) -> dict:
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
    (target / "_trainer_under_test.py").write_text(under_test(mode, activation_checkpointing), encoding="utf-8")
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


def start_run(
    mode, tests_dir, workdir, assets_root, selection, extra, activation_checkpointing="ours"
) -> tuple[subprocess.Popen, dict]:
    run_dir = workdir / f"run-{mode}"
    results_dir = workdir / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    plugin = HERE / "pytest_plugin.py"
    patched = prepare_run_dir(tests_dir, run_dir, mode, assets_root, plugin, activation_checkpointing)
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
        # the swapped run tests this checkout's trl_multiagent, whichever one is installed
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
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
        "extra": {
            "activation_checkpointing": activation_checkpointing if mode == "swapped" else "stock",
            "availability_checks_defined_locally": patched,
        },  # fmt: skip
        "raw": raw,
        "log": log,
        "command": command,
        "run_dir": run_dir,
        "start": time.time(),
    }


# The reviewed list's kinds: what a listed test does, stock against swapped (its header `[KIND: CAUSE]`).
KINDS = {
    "swap-only": "passes (or does not run) on stock, fails swapped",
    "stock": "fails on both, at the same place (exception type and test-file line)",
    "elsewhere": "fails on both, at different places: a different failure",
    "stock-only": "fails on stock, passes swapped",
}


def load_expected(path: Path) -> dict[str, dict]:
    """The reviewed list: `[KIND: CAUSE]` headers (`KINDS`), then `TEST_ID -- REASON` lines."""
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
            if kind not in KINDS:
                raise UsageError(f"{path}:{number}: a header is [KIND: CAUSE], KIND one of {list(KINDS)}; not {line}")
            continue
        test_id, sep, reason = line.partition(" -- ")
        if not sep or kind is None:
            raise UsageError(f"{path}:{number}: expected `TEST_ID -- REASON` under a [KIND: CAUSE] header: {line}")
        expected[test_id.strip()] = {"kind": kind, "cause": cause, "reason": reason.strip()}
    return expected


def place(entry: dict | None) -> str | None:
    """Where a failed test failed: `ExceptionType at line N` (N: the deepest line of TRL's test file in the
    traceback), or None for a test that did not fail."""
    if not entry or entry.get("outcome") not in FAILED:
        return None
    failure = entry.get("failure") or {}
    return f"{failure.get('exception', '?')} at line {failure.get('test_line', '?')}"


def classify(stock: dict | None, swapped: dict) -> str | None:
    """The kind (`KINDS`) of one test's pair of outcomes; "unrecorded" without a stock outcome; None when nothing
    differs from stock's pass (or skip) and there is no failure."""
    failed = swapped["outcome"] in FAILED
    if stock is None:
        return "unrecorded" if failed else None
    stock_failed = stock["outcome"] in FAILED
    if stock_failed and failed:
        return "stock" if place(stock) == place(swapped) else "elsewhere"
    if stock_failed:
        return "stock-only" if swapped["outcome"] == "passed" else None
    return "swap-only" if failed else None


def compare(stock_tests: dict[str, dict] | None, swapped_tests: dict[str, dict], expected: dict[str, dict]) -> dict:
    """Each swapped test against its stock outcome (`classify`), and against the list: `unlisted` holds the tests of a
    kind the list does not give them (they make the run fail), `drift` the listed tests whose kind changed."""
    stock_tests = stock_tests or {}
    report: dict = {kind: [] for kind in (*KINDS, "unrecorded")}
    report.update(unlisted=[], drift=[])
    report["without_stock_outcome"] = sorted(set(swapped_tests) - set(stock_tests))
    for test_id, entry in sorted(swapped_tests.items()):
        kind = classify(stock_tests.get(test_id), entry)
        listed = expected.get(test_id, {}).get("kind")
        if kind is not None:
            report[kind].append(test_id)
        if kind == "unrecorded":  # no stock outcome to compare with: accounted for when the list names it at all
            if listed is None:
                report["unlisted"].append(test_id)
        elif kind is not None and listed != kind:
            report["unlisted"].append(test_id)
        if listed is not None and kind not in (listed, "unrecorded"):
            report["drift"].append(test_id)
    return report


def print_report(results: dict[str, dict], stock_tests: dict | None, report: dict, expected: dict) -> None:
    swapped = results["swapped"]["tests"] if "swapped" in results else {}
    stock_tests = stock_tests or {}
    say("")
    say(f"{'stock':>28}  {'swapped':>28}  test")
    for test_id in sorted(set(swapped) | (set(stock_tests) if not swapped else set())):
        cells = []
        for entry in (stock_tests.get(test_id), swapped.get(test_id)):
            outcome = entry["outcome"] if entry else "-"
            cells.append(f"{outcome}{' (' + place(entry) + ')' if place(entry) else ''}")
        say(f"{cells[0]:>28}  {cells[1]:>28}  {test_id}")
    say("")
    for mode, result in results.items():
        c = result["counts"]
        say(
            f"{mode}: {c['total']} tests, {c['ran']} ran on CPU: {c['passed']} passed, {c['failed']} failed, "
            f"{c['error']} errors, {c['xfailed']} xfailed, {c['xpassed']} xpassed; {c['skipped']} skipped "
            f"({result['wall_seconds']} s)"
        )
    if not swapped:
        return
    for kind in (*KINDS, "unrecorded"):
        meaning = KINDS.get(kind, "no stock outcome recorded for it (--record-stock)")
        say(f"{kind} ({meaning}): {len(report[kind])}")
        for test_id in report[kind]:
            entry = expected.get(test_id)
            where = f"stock: {place(stock_tests.get(test_id)) or '-'}; swapped: {place(swapped[test_id]) or '-'}"
            why = f"[{entry['kind']}: {entry['cause']}] {entry['reason']}" if entry else "NOT IN THE LIST"
            say(f"    {test_id}  ({where})  {why}")
    if report["without_stock_outcome"]:
        say(
            f"swapped tests with no stock outcome to compare with (not in the record): {len(report['without_stock_outcome'])}"
        )
    if report["drift"]:
        say(f"listed under another kind than what happened (move or prune them in the list): {len(report['drift'])}")
        for test_id in report["drift"]:
            say(f"    {test_id}  listed [{expected[test_id]['kind']}]")
    if report["unlisted"]:
        say(f"UNLISTED (add each to expected_swap_failures.txt under its kind, with a reason, or fix it): "
            f"{len(report['unlisted'])}")  # fmt: skip
        for test_id in report["unlisted"]:
            say(f"    {test_id}  {swapped[test_id].get('message', '')[:200]}")


def read_stock_record(path: Path, installed: dict) -> dict:
    """The recorded stock run (`--record-stock`): refused when it was recorded with another TRL than the installed."""
    if not path.exists():
        raise UsageError(f"no stock record at {path}: run `--mode both`, or record stock once with --record-stock")
    record = json.loads(path.read_text())
    if record["versions"].get("trl") != installed.get("trl"):
        raise UsageError(
            f"the stock record {path} is of TRL {record['versions'].get('trl')}, the installed TRL is "
            f"{installed.get('trl')}: record it again (`--record-stock`, the whole file: 30-40 minutes on 2 cores)"
        )
    return record


def write_stock_record(path: Path, stock: dict, tested: dict, tests_dir: Path, origin: str | None) -> None:
    """Record a stock run: each test's outcome and failure place, merged into the record of the same TRL (a partial
    run, `-- -k ...`, updates the tests it ran)."""
    record = {"tests": {}}
    if path.exists():
        old = json.loads(path.read_text())
        if old["versions"].get("trl") == tested.get("trl"):
            record = old
    record.update(
        versions={k: tested.get(k) for k in ("trl", "transformers", "torch", "datasets", "peft")},
        test_file=origin or str(tests_dir),
    )
    # what each recording ran: a whole-file run, or a selection (`-- -k ...`, a subset, a run cut short)
    record.setdefault("runs", []).append(
        {
            "recorded": time.strftime("%Y-%m-%d"),
            "command": stock.get("command") or "--from-results: the tests an unfinished run had done",
            "tests": len(stock["tests"]),
        }
    )
    for test_id, entry in stock["tests"].items():
        kept = {"outcome": entry["outcome"]}
        if entry["outcome"] in FAILED:
            kept["failure"] = entry.get("failure")
            kept["message"] = entry.get("message", "")[:300]
        record["tests"][test_id] = kept
    record["tests"] = dict(sorted(record["tests"].items()))
    path.write_text(json.dumps(record, indent=1) + "\n")


def versions() -> dict:
    """What was tested: the libraries' versions, and trl_multiagent's commit and whether its files had edits."""
    import importlib.metadata as metadata

    found = {}
    for name in ("trl", "transformers", "torch", "datasets", "peft", "trl_multiagent"):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    package = REPO / "trl_multiagent"  # what the swapped run imports (PYTHONPATH)
    if package.is_dir():
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
        help="ci: the tests of ci_subset.txt, each checked against its stated outcome; listed: the tests named in the "
        "list (--expected), to check fixes",
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
    parser.add_argument(
        "--record-stock",
        action="store_true",
        help=f"run stock and record each test's outcome and failure place in --stock-record (default {STOCK_RECORD.name},"
        " committed): the stock side of later swapped runs; refresh it when TRL changes",
    )
    parser.add_argument("--stock-record", type=Path, default=STOCK_RECORD, help="the recorded stock run")
    parser.add_argument(
        "--activation-checkpointing",
        choices=("ours", "trl"),
        default="ours",
        help="swapped: MAGRPOConfig's default (off on a CPU), or GRPOConfig's own (True), so that TRL's tests run the "
        "checkpointed path too",
    )
    args = parser.parse_args(argv)
    if args.record_stock and args.mode not in ("stock", "both"):
        parser.error("--record-stock runs stock: use it with --mode stock (or both)")
    return args, extra


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
    ci_subset = read_ci_subset() if args.subset == "ci" else {}
    if args.subset == "listed" and not expected:
        raise UsageError(f"--subset listed: {args.expected} names no test")
    selection_ids = {"ci": list(ci_subset), "listed": list(expected), "all": None}[args.subset]
    selection = [f"tests/{i}" for i in selection_ids] if selection_ids else [f"tests/{TEST_FILE}"]

    tested = versions()  # before the runs: trl_multiagent's files may change while they go on
    # swapped alone compares with the recorded stock run: refused before any run when it is missing or stale
    stock_record = read_stock_record(args.stock_record, tested) if args.mode == "swapped" else None
    if not args.from_results:
        assets_root = build_assets(workdir / "assets", scripts_dir, rebuild=args.rebuild_assets)
    modes = ["stock", "swapped"] if args.mode == "both" else [args.mode]
    results: dict[str, dict] = {}
    if args.from_results:
        for mode in modes:
            path, raw = workdir / "results" / f"{mode}.json", workdir / "results" / f"{mode}.raw.json"
            if path.exists():
                results[mode] = json.loads(path.read_text())
                tested = results[mode].get("versions", tested)
            elif raw.exists():  # a run cut short, or still going: the tests it finished (the plugin's file)
                say(f"run_trl_tests: [{mode}] {path.name} is missing; reading the tests that {raw.name} holds")
                tests = json.loads(raw.read_text())["tests"]
                counts = {outcome: sum(1 for t in tests.values() if t["outcome"] == outcome) for outcome in OUTCOMES}
                counts.update(total=len(tests), ran=len(tests) - counts["skipped"])
                results[mode] = {"mode": mode, "command": None, "wall_seconds": None, "counts": counts, "tests": tests}
            else:
                raise UsageError(f"--from-results: {path} does not exist (run --mode {mode} first)")
    elif args.parallel and len(modes) == 2:
        started = [
            start_run(m, tests_dir, workdir, assets_root, selection, extra, args.activation_checkpointing)
            for m in modes
        ]
        while any(process.poll() is None for process, _ in started):
            for process, info in started:
                if process.poll() is not None:
                    info.setdefault("end", time.time())
            time.sleep(2)
        for process, info in started:
            results[info["mode"]] = finish_run(process, info, selection_ids)
    else:
        for mode in modes:
            process, info = start_run(
                mode, tests_dir, workdir, assets_root, selection, extra, args.activation_checkpointing
            )
            results[mode] = finish_run(process, info, selection_ids)
    for mode, result in results.items():
        result["versions"] = tested
        if not args.from_results:  # an earlier run's files stay as that run wrote them
            (workdir / "results" / f"{mode}.json").write_text(json.dumps(result, indent=1))
    origin_file = tests_dir.parent / "ORIGIN"
    origin = origin_file.read_text().strip() if origin_file.exists() else None
    if args.record_stock:
        write_stock_record(args.stock_record, results["stock"], tested, tests_dir, origin)
        say(f"run_trl_tests: recorded {len(results['stock']['tests'])} stock outcomes in {args.stock_record}")
    # the stock side: this run's, else the record's (swapped alone)
    if "stock" in results:
        stock_tests, stock_source = results["stock"]["tests"], "this run"
    elif stock_record is not None:
        stock_tests, stock_source = stock_record["tests"], str(args.stock_record)
    else:
        stock_tests, stock_source = None, None
    report = compare(stock_tests, results["swapped"]["tests"], expected) if "swapped" in results else {}
    if ci_subset and "swapped" in results:  # each CI test's outcome, as ci_subset.txt states it
        report["ci_mismatches"] = sorted(
            f"{i}: {results['swapped']['tests'].get(i, {}).get('outcome')}, not {want['outcome']}"
            for i, want in ci_subset.items()
            if results["swapped"]["tests"].get(i, {}).get("outcome") != want["outcome"]
        )
    print_report(results, stock_tests, report, expected)
    if report:
        say(f"(stock side: {stock_source})")

    summary = {
        "tests_dir": str(tests_dir),
        "origin": origin,
        "mode": args.mode,
        "subset": args.subset,
        "activation_checkpointing": args.activation_checkpointing,
        "stock_side": stock_source,
        "versions": tested,
        "counts": {m: r["counts"] for m, r in results.items()},
        "wall_seconds": {m: r["wall_seconds"] for m, r in results.items()},
        "commands": {m: r["command"] for m, r in results.items()},
        **report,
        "outcomes": {m: {i: t["outcome"] for i, t in r["tests"].items()} for m, r in results.items()},
        "places": {m: {i: place(t) for i, t in r["tests"].items() if place(t)} for m, r in results.items()},
    }
    for path in {workdir / "results" / "summary.json", *([args.json] if args.json else [])}:
        path.write_text(json.dumps(summary, indent=1))
    say(f"\nrun_trl_tests: results in {workdir / 'results'} (summary.json, MODE.json with tracebacks, MODE.log)")
    if report.get("unlisted") or report.get("ci_mismatches"):
        for mismatch in report.get("ci_mismatches", []):
            say(f"    ci_subset.txt: {mismatch}")
        say(
            f"run_trl_tests: FAILED: {len(report['unlisted'])} tests differ from stock and are not in the list; "
            f"{len(report.get('ci_mismatches', []))} CI tests have another outcome than ci_subset.txt states"
        )
        return 1
    say("run_trl_tests: OK: every difference from stock is accounted for")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as error:
        sys.stderr.write(f"run_trl_tests: error: {error}\n")
        sys.exit(2)
