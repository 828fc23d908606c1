"""Runs CoMLRL's own test suite offline: its tests that use the classes under test (`MAGRPOConfig`/`MAGRPOTrainer`,
CoMLRL's REINFORCE family and its actor-critic trainers IAC/MAAC, `CLASS_MODULES`), against CoMLRL's classes ("stock") and with trl_multiagent's CoMLRL face
swapped in ("swapped"), and compares the two runs test by test.

    python tests/comlrl_contract/run_comlrl_tests.py [SDIST_OR_DIR] --mode stock|swapped|both
        [--subset all|ci|listed] [--face MODULE] [--python PY] [--workdir DIR] [--list-edits] [-- extra pytest args]

SDIST_OR_DIR is CoMLRL's sdist (`comlrl-1.4.3.tar.gz`), or a folder holding its `tests/` (an unpacked sdist or a
checkout), or its `tests/` folder itself. Without it, the sdist is downloaded once with
`pip download --no-deps --no-binary :all: comlrl==1.4.3` into `WORKDIR/sdist/`.

What it does:
1. the tests run under a Python that has CoMLRL itself (its test files import CoMLRL's other trainers and helpers in
   both modes): `WORKDIR/venv`, made once with `python -m venv --system-site-packages` and
   `pip install --no-deps comlrl==VERSION`, so that the shared environment is untouched (or `--python PY`);
2. for each mode, copies the tests to `WORKDIR/run-MODE/tests/` and makes one edit per file that imports the classes
   (`--list-edits` prints each): the names of the classes it imports are imported again from `_magrpo_under_test`,
   a module the harness writes, which re-exports CoMLRL's classes (stock) or the face's (swapped);
3. runs pytest there on the tests that use the classes (selection_plugin.py reads which), with the Hub offline,
   and writes each test's outcome and where it failed (exception type, test-file line) to `WORKDIR/results/`;
4. compares the runs with the reviewed list `expected_swap_failures.txt` (beside this file): a swapped failure the
   list does not name makes the command exit 1; listed tests that now pass are printed, to be pruned.

Exit status: 0 when every failure is accounted for; 1 for unlisted failures; 2 for a usage or set-up error.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from trl_multiagent.demo.contract import OFFLINE_ENVIRONMENT as ENVIRONMENT
from trl_multiagent.demo.contract import (
    UsageError,
    compare,
    finish_run,
    load_expected,
    print_report,
    say,
    versions,
    where,
)


HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PLUGINS = {  # file copied into the run folder -> its name there (loaded with -p)
    HERE.parent / "trl_contract" / "pytest_plugin.py": "_comlrl_contract_results",
    HERE / "selection_plugin.py": "_comlrl_contract_selection",
}
EXPECTED_FILE = HERE / "expected_swap_failures.txt"
DEFAULT_WORKDIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "trl_multiagent" / "comlrl_contract"
COMLRL_VERSION = "1.4.3"
DEFAULT_FACE = "trl_multiagent.comlrl"

# The classes under test (MAGRPO, CoMLRL's REINFORCE family and its actor-critic trainers, each with its CoMLRL
# module), and the module the edited test files import them from (written by the harness). The centralized adapter's names are swapped with them
# (`CentralizedMAGRPOTrainer` catches its own parse error) but select no test through a subclass of the test files.
CLASS_MODULES = {
    "comlrl.trainers.reinforce": (
        "MAGRPOConfig",
        "MAGRPOTrainer",
        "MAREINFORCEConfig",
        "MAREINFORCETrainer",
        "MARLOOConfig",
        "MARLOOTrainer",
        "MAReMaxConfig",
        "MAReMaxTrainer",
        "CentralizedMAGRPOConfig",
        "CentralizedMAGRPOTrainer",
    ),
    "comlrl.trainers.preference": ("TaggedCentralizedComparatorAdapter", "CentralizedComparatorParseError"),
    "comlrl.trainers.actor_critic": ("IACConfig", "IACTrainer", "MAACConfig", "MAACTrainer"),
}
CLASS_NAMES = tuple(name for names in CLASS_MODULES.values() for name in names)
UNDER_TEST = "_magrpo_under_test"
STOCK_MODULE = "comlrl (" + ", ".join(CLASS_MODULES) + ")"


def under_test_source(mode: str, face: str) -> str:
    """The module the edited tests import the classes from: CoMLRL's (stock) or the face's (swapped)."""
    imports = (
        [f"from {module} import {', '.join(names)}" for module, names in CLASS_MODULES.items()]
        if mode == "stock"
        else [f"from {face} import {', '.join(CLASS_NAMES)}"]
    )
    return (
        f'"""Written by comlrl_contract/run_comlrl_tests.py ({mode}): the classes the edited tests use."""\n\n'
        + "\n".join(imports)
        + f"\n\n\n__all__ = {list(CLASS_NAMES)!r}\n"
    )


PYTEST_INI = """[pytest]
# Written by comlrl_contract/run_comlrl_tests.py: this folder is the rootdir, not the trl_multiagent repo.
addopts = -p _comlrl_contract_results -p _comlrl_contract_selection -p no:cacheprovider -rfE
"""


# The reviewed list's kinds: a test that passes on CoMLRL and fails swapped is listed as reaching a CoMLRL private
# hook, as one whose passing would mean no longer being a GRPOTrainer, or as using an option the face refuses because
# it is not built yet (IAC's value head on the actor, the actor-critics' reference KL); one that fails on CoMLRL too,
# as stock.
SWAP_KINDS = ("private", "not-grpo", "not-built")

# `--subset ci`: the public-behaviour tests, one id a line (README.md): each passes on CoMLRL and with the face
# swapped in; tests/test_comlrl_contract.py asserts each one's outcome.
CI_SUBSET_FILE = HERE / "ci_subset.txt"


def read_ids(path: Path) -> list[str]:
    """The test ids of a list file: one a line, without "tests/"; `#` starts a comment line."""
    lines = (line.strip() for line in path.read_text(encoding="utf-8").splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def import_edit(path: Path) -> tuple[str, str] | None:
    """The one edit to a test file that imports the classes from CoMLRL's trainers: after its last such import
    statement, on the same line (line numbers are kept, so both modes' failures point at the same lines),
    `; from _magrpo_under_test import ...` rebinds the names it imported. Returns (new text, the edit in words)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text, str(path))
    statements, bound = [], {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("comlrl.trainers"):
            names = [alias for alias in node.names if alias.name in CLASS_NAMES]
            if names:
                statements.append(node)
                bound.update({alias.asname or alias.name: alias.name for alias in names})
    if not statements:
        return None
    last = statements[-1]
    names = ", ".join(name if bound_as == name else f"{name} as {bound_as}" for bound_as, name in bound.items())
    addition = f"; from {UNDER_TEST} import {names}"
    lines = text.splitlines(keepends=True)
    line = lines[last.end_lineno - 1]
    cut = len(line.encode("utf-8")[: last.end_col_offset].decode("utf-8"))
    lines[last.end_lineno - 1] = line[:cut] + addition + line[cut:]
    statement = ast.get_source_segment(text, last).replace("\n", " ")
    statement = re.sub(r"\s+", " ", statement).replace("( ", "(").replace(", )", ")")
    return "".join(lines), f"tests/{path.name}:{last.end_lineno}: `{statement}` + `{addition}`"


def unpack_sdist(source: Path, workdir: Path) -> Path:
    """The folder holding CoMLRL's `tests/` (and `comlrl/`), from an sdist, an unpacked sdist or its tests/ folder."""
    if source.is_file():
        if not source.name.endswith(".tar.gz"):
            raise UsageError(f"{source} is neither a folder nor an sdist (.tar.gz)")
        target = workdir / "source"
        root = target / source.name.removesuffix(".tar.gz")
        if not (root / "tests").is_dir():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            with tarfile.open(source) as archive:
                archive.extractall(target, filter="data")
        source = root
    if source.is_dir() and (source / "tests").is_dir():
        source = source / "tests"
    if not (source / "conftest.py").exists() or not list(source.glob("test_*.py")):
        raise UsageError(f"{source} holds no CoMLRL tests (conftest.py and test_*.py): give the sdist or its folder")
    return source


def download_sdist(workdir: Path) -> Path:
    folder = workdir / "sdist"
    sdist = folder / f"comlrl-{COMLRL_VERSION}.tar.gz"
    if not sdist.exists():
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        command += [f"comlrl=={COMLRL_VERSION}", "-d", str(folder)]
        say(f"run_comlrl_tests: {' '.join(command)}")
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0 or not sdist.exists():
            raise UsageError(f"could not download CoMLRL's sdist ({' '.join(command)}): {done.stderr[-2000:]}")
    return sdist


def tests_python(workdir: Path, given: Path | None) -> Path:
    """The interpreter the tests run under: one that imports CoMLRL COMLRL_VERSION (the venv, made once)."""
    python = given or workdir / "venv" / "bin" / "python"
    if given is None and not python.exists():
        say(f"run_comlrl_tests: making {python.parent.parent} (system site-packages + comlrl=={COMLRL_VERSION})")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(python.parent.parent)], check=True)
        install = [str(python), "-m", "pip", "install", "--no-deps", f"comlrl=={COMLRL_VERSION}"]
        done = subprocess.run(install, capture_output=True, text=True)
        if done.returncode != 0:
            raise UsageError(f"{' '.join(install)} failed: {done.stderr[-2000:]}")
    probe = "import importlib.metadata as m, comlrl.trainers.reinforce; print(m.version('comlrl'))"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(
            f"{python} cannot import CoMLRL's trainers (a dependency missing? install it with {python} -m pip install "
            f"--no-deps NAME):\n{done.stderr[-2000:]}"
        )
    if done.stdout.strip() != COMLRL_VERSION:
        raise UsageError(
            f"{python} has comlrl {done.stdout.strip()}, the harness runs CoMLRL {COMLRL_VERSION}'s tests"
        )
    return python


def edits(tests_dir: Path) -> list[str]:
    """Everything the harness changes, in words (`--list-edits`)."""
    listed = [edit for path in sorted(tests_dir.glob("*.py")) if (edit := import_edit(path))]
    return [
        *(f"{described} (the one text edit to this file; both modes)" for _, described in listed),
        f"tests/{UNDER_TEST}.py (new): stock: CoMLRL's {', '.join(CLASS_NAMES)} (from "
        f"{' and '.join(CLASS_MODULES)}); swapped: the same names `from FACE import ...` (--face, default "
        f"{DEFAULT_FACE})",
        "run folder: pytest.ini (rootdir here, -p the two plugins, no cache), _comlrl_contract_results.py "
        "(trl_contract/pytest_plugin.py: each outcome, exception type and test-file line to JSON) and "
        "_comlrl_contract_selection.py (selection_plugin.py: deselects the tests that do not use the classes)",
        "environment: " + ", ".join(f"{k}={v}" for k, v in ENVIRONMENT.items()) + ", HF_HOME=WORKDIR/hf_home, "
        f"OMP_NUM_THREADS=1 unless set, PYTHONPATH={REPO} (the trl_multiagent of this checkout is the one tested)",
        "copied unedited: every other file of tests/",
    ]


def prepare_run_dir(tests_dir: Path, run_dir: Path, mode: str, face: str) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
    shutil.copytree(tests_dir, run_dir / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    for path in sorted((run_dir / "tests").glob("*.py")):
        edit = import_edit(path)
        if edit:
            path.write_text(edit[0], encoding="utf-8")
    (run_dir / "tests" / f"{UNDER_TEST}.py").write_text(under_test_source(mode, face))
    for source, name in PLUGINS.items():
        shutil.copy(source, run_dir / f"{name}.py")
    (run_dir / "pytest.ini").write_text(PYTEST_INI)


def start_run(mode, tests_dir, workdir, python, face, selection, extra) -> tuple[subprocess.Popen, dict]:
    run_dir = workdir / f"run-{mode}"
    results_dir = workdir / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    prepare_run_dir(tests_dir, run_dir, mode, face)
    raw = results_dir / f"{mode}.raw.json"
    selected = results_dir / f"{mode}.selected.json"
    for stale in (raw, selected):
        stale.unlink(missing_ok=True)
    env = {
        **os.environ,
        **ENVIRONMENT,
        "HF_HOME": str(workdir / "hf_home"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "TRL_CONTRACT_RESULTS": str(raw),
        "COMLRL_CONTRACT_SELECTED": str(selected),
    }
    env.pop("TRL_CONTRACT_SKIPS", None)
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [str(python), "-m", "pytest", *selection, *extra]
    log = open(results_dir / f"{mode}.log", "w")  # closed by finish_run
    shown = " ".join(command) if len(selection) <= 3 else " ".join([*command[:3], f"<{len(selection)} ids>", *extra])
    say(f"run_comlrl_tests: [{mode}] {shown}  (in {run_dir}; log {log.name})")
    process = subprocess.Popen(command, cwd=run_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    info = {"mode": mode, "raw": raw, "log": log, "command": command, "run_dir": run_dir, "start": time.time()}
    info["selected_file"] = selected
    info["extra"] = {"face": STOCK_MODULE if mode == "stock" else face}
    return process, info


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        argv, extra = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    parser = argparse.ArgumentParser(
        prog="run_comlrl_tests.py", description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("source", nargs="?", type=Path, help="CoMLRL's sdist, or a folder with its tests/")
    parser.add_argument("--mode", choices=("stock", "swapped", "both"), default="both")
    parser.add_argument(
        "--subset",
        choices=("all", "ci", "listed"),
        default="all",
        help="ci: the tests of ci_subset.txt only; listed: the tests named in the list (--expected), to check fixes",
    )
    parser.add_argument("--face", default=DEFAULT_FACE, help=f"the module swapped in (default {DEFAULT_FACE})")
    parser.add_argument("--python", type=Path, help="the interpreter with CoMLRL installed (default WORKDIR/venv)")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR, help=f"default {DEFAULT_WORKDIR}")
    parser.add_argument("--expected", type=Path, default=EXPECTED_FILE, help="the reviewed list of failures")
    parser.add_argument("--json", type=Path, help="also write the summary here (default WORKDIR/results/summary.json)")
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="run nothing: compare WORKDIR/results/MODE.json of an earlier run with the list (after editing it)",
    )
    parser.add_argument("--list-edits", action="store_true", help="print the edits the harness makes, and exit")
    return parser.parse_args(argv), extra


def main(argv: list[str]) -> int:
    args, extra = parse_args(argv)
    workdir = args.workdir.resolve()
    if workdir == REPO or REPO in workdir.parents:
        raise UsageError(f"--workdir {workdir} is inside the repo: choose a folder outside it")
    tests_dir = unpack_sdist((args.source or download_sdist(workdir)).resolve(), workdir)
    if args.list_edits:
        say(f"Edits that run_comlrl_tests.py makes to CoMLRL's tests ({tests_dir}) and their environment:")
        for number, edit in enumerate(edits(tests_dir), 1):
            say(f"  {number}. {edit}")
        return 0
    expected = load_expected(args.expected, swap_kinds=SWAP_KINDS)
    ci_subset = read_ids(CI_SUBSET_FILE)
    if args.subset == "ci" and not ci_subset:
        raise UsageError(f"{CI_SUBSET_FILE} names no test")
    if args.subset == "listed" and not expected:
        raise UsageError(f"--subset listed: {args.expected} names no test")
    selection_ids = {"ci": ci_subset, "listed": list(expected), "all": None}[args.subset]
    selection = [f"tests/{i}" for i in selection_ids] if selection_ids else ["tests"]
    modes = ["stock", "swapped"] if args.mode == "both" else [args.mode]

    results: dict[str, dict] = {}
    if args.from_results:
        for mode in modes:
            path = workdir / "results" / f"{mode}.json"
            if not path.exists():
                raise UsageError(f"--from-results: {path} does not exist (run --mode {mode} first)")
            results[mode] = json.loads(path.read_text())
    else:
        python = tests_python(workdir, args.python)
        tested = versions(("comlrl", "trl", "transformers", "torch", "datasets", "trl_multiagent"), str(python))
        for mode in modes:
            process, info = start_run(mode, tests_dir, workdir, python, args.face, selection, extra)
            results[mode] = finish_run(process, info, selection_ids)
            results[mode]["selected"] = json.loads(info["selected_file"].read_text())
            results[mode]["versions"] = tested
            (workdir / "results" / f"{mode}.json").write_text(json.dumps(results[mode], indent=1))
    if len(results) == 2 and results["stock"]["selected"] != results["swapped"]["selected"]:
        differ = sorted(set(results["stock"]["selected"]) ^ set(results["swapped"]["selected"]))
        raise UsageError(f"the two modes selected different tests ({len(differ)}): {', '.join(differ[:10])}")
    report = compare(results, expected)
    print_report(results, report, expected, EXPECTED_FILE.name)

    summary = {
        "tests_dir": str(tests_dir),
        "mode": args.mode,
        "subset": args.subset,
        "face": args.face,
        "versions": next(iter(results.values())).get("versions"),
        "counts": {m: r["counts"] for m, r in results.items()},
        "wall_seconds": {m: r["wall_seconds"] for m, r in results.items()},
        "commands": {m: r["command"] for m, r in results.items()},
        **report,
        "outcomes": {m: {i: t["outcome"] for i, t in r["tests"].items()} for m, r in results.items()},
        "where": {m: {i: where(i, t) for i, t in r["tests"].items() if "failure" in t} for m, r in results.items()},
    }
    for path in {workdir / "results" / "summary.json", *([args.json] if args.json else [])}:
        path.write_text(json.dumps(summary, indent=1))
    say(f"\nrun_comlrl_tests: results in {workdir / 'results'} (summary.json, MODE.json with tracebacks, MODE.log)")
    if report.get("unlisted"):
        say(f"run_comlrl_tests: FAILED: {len(report['unlisted'])} unlisted failures")
        return 1
    say("run_comlrl_tests: OK: every failure is accounted for")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except UsageError as error:
        sys.stderr.write(f"run_comlrl_tests: error: {error}\n")
        sys.exit(2)
