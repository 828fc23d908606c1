"""The library-independent parts of a contract harness, which runs another library's own tests once against that
library's trainer ("stock") and once with ours swapped in ("swapped"), and compares the two runs test by test against
a reviewed list of expected failures: reading the list, reading one run's results (written by
tests/trl_contract/pytest_plugin.py, copied into each run folder), comparing the runs (outcomes, and where each test
failed), printing the report, and recording what was tested. tests/comlrl_contract/run_comlrl_tests.py uses it;
tests/trl_contract/run_trl_tests.py predates it and keeps its own comparison. Each harness keeps its own edits,
selection and command line."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
FAILED = ("failed", "error")
# What every harness sets in the processes it runs: offline (no Hub), no tokenizer threads, W&B off.
OFFLINE_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "WANDB_MODE": "disabled",
}


class UsageError(Exception):
    """A usage or set-up error: the harness exits 2."""


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def load_expected(path: Path, swap_kinds: tuple[str, ...], stock_kind: str = "stock") -> dict[str, dict]:
    """The reviewed list: `[KIND: CAUSE]` headers, then `TEST_ID -- REASON` lines. A KIND in `swap_kinds` names a
    test that passes on stock and fails swapped; `stock_kind` one that fails on stock too."""
    expected, kind, cause = {}, None, None
    if not path.exists():
        return expected
    kinds = (*swap_kinds, stock_kind)
    headers = " or ".join(f"[{k}: CAUSE]" for k in kinds)
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            kind, _, cause = line[1:-1].partition(":")
            kind, cause = kind.strip(), cause.strip()
            if kind not in kinds:
                raise UsageError(f"{path}:{number}: a header is {headers}, not {line}")
            continue
        test_id, sep, reason = line.partition(" -- ")
        if not sep or kind is None:
            raise UsageError(f"{path}:{number}: expected `TEST_ID -- REASON` under a {headers} header: {line}")
        if test_id.strip() in expected:
            raise UsageError(f"{path}:{number}: {test_id.strip()} is listed twice")
        expected[test_id.strip()] = {
            "kind": kind,
            "cause": cause,
            "reason": reason.strip(),
            "stock": kind == stock_kind,
        }
    return expected


def finish_run(process: subprocess.Popen, info: dict, selection_ids: list[str] | None) -> dict:
    """Waits for one mode's pytest and reads its results (the plugin's JSON), refusing a run that did not finish."""
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
        for test_id in selection_ids:  # a selected test that pytest did not collect is a failure, not a silence
            tests.setdefault(test_id, {"outcome": "error", "duration": 0.0, "message": "not collected"})
    counts = {outcome: sum(1 for t in tests.values() if t["outcome"] == outcome) for outcome in OUTCOMES}
    counts["total"] = len(tests)
    counts["ran"] = counts["total"] - counts["skipped"]
    return {
        "mode": info["mode"],
        "command": " ".join(info["command"]),
        "run_dir": str(info["run_dir"]),
        "pytest_exit": returncode,
        "wall_seconds": wall,
        "counts": counts,
        "tests": tests,
        **info.get("extra", {}),
    }


def where(test_id: str, result: dict) -> str:
    """Where a failed test failed, as the results plugin records it: `ExceptionType at test_file.py:line` (the deepest
    line of the test's own file in the traceback; the same line in both modes, which run the same edited file)."""
    failure = result.get("failure") or {}
    return f"{failure.get('exception', '?')} at {test_id.split('::')[0]}:{failure.get('test_line') or '?'}"


def compare(results: dict[str, dict], expected: dict[str, dict]) -> dict:
    """Test by test: the swapped failures, split into listed and unlisted; with stock, the swap-only ones, those that
    fail on both (and whether at the same place), and the list's drift (listed tests that now pass, or that the
    stock run contradicts)."""
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
        report["failing_on_both_elsewhere"] = sorted(
            i for i in failing & stock_failing if where(i, stock["tests"][i]) != where(i, swapped["tests"][i])
        )
        report["stock_only_failures"] = sorted(stock_failing - failing)
        report["listed"] = [i for i in swap_only if i in expected and not expected[i]["stock"]]
        report["unlisted"] = [i for i in swap_only if i not in expected or expected[i]["stock"]]
        report["listed_swap_only_failing_on_stock"] = sorted(
            i for i, e in expected.items() if not e["stock"] and i in stock_failing
        )
        report["stock_list_drift"] = sorted(
            i for i, e in expected.items() if e["stock"] and i in stock["tests"] and i not in stock_failing
        )
        report["stock_failures_unlisted"] = sorted(i for i in stock_failing if not expected.get(i, {}).get("stock"))
    else:  # swapped alone: a failure is accounted for when the list names it, as swap-only or as failing on stock
        report["listed"] = sorted(i for i in failing if i in expected)
        report["unlisted"] = sorted(i for i in failing if i not in expected)
    # A listed test that passes swapped: the list is out of date (a fix landed): prune it.
    report["listed_now_passing"] = sorted(
        i for i in expected if swapped["tests"].get(i, {}).get("outcome") in ("passed", "xpassed")
    )
    return report


def print_report(results: dict[str, dict], report: dict, expected: dict[str, dict], list_name: str) -> None:
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
            f"{mode}: {c['total']} tests, {c['ran']} ran: {c['passed']} passed, {c['failed']} failed, "
            f"{c['error']} errors, {c['xfailed']} xfailed, {c['xpassed']} xpassed; {c['skipped']} skipped "
            f"({results[mode]['wall_seconds']} s)"
        )
    if not report:
        return

    def show(title, items, with_reason=False):
        say(f"{title}: {len(items)}")
        for test_id in items:
            result = results["swapped"]["tests"].get(test_id, {})
            entry = expected.get(test_id)
            if with_reason and entry:
                detail = f"[{entry['kind']}: {entry['cause']}] {entry['reason']}"
            else:
                detail = f"{where(test_id, result)}: {result.get('message', '')[:200]}"
            say(f"    {test_id}  {detail}")

    if "swap_only_failures" in report:
        say(f"swap-only failures (pass on stock, fail swapped): {len(report['swap_only_failures'])}")
        show("  listed (expected, with a reason)", report["listed"], with_reason=True)
        show(f"  UNLISTED (add them to {list_name} with a reason, or fix them)", report["unlisted"])
        show("failing on both (not the swap's doing)", report["failing_on_both"])
        if report["failing_on_both_elsewhere"]:
            say(f"  of which fail at another place swapped: {len(report['failing_on_both_elsewhere'])}")
            for test_id in report["failing_on_both_elsewhere"]:
                say(
                    f"    {test_id}  stock: {where(test_id, results['stock']['tests'][test_id])}; "
                    f"swapped: {where(test_id, results['swapped']['tests'][test_id])}"
                )
        show("failing on stock only", report["stock_only_failures"])
        if report["stock_failures_unlisted"]:
            show("stock failures the list does not name as failing on stock", report["stock_failures_unlisted"])
        if report["stock_list_drift"]:
            show("listed as failing on stock, but no longer fail there (prune them)", report["stock_list_drift"])
        if report["listed_swap_only_failing_on_stock"]:
            show(
                "listed as swap-only, but failing on stock too (move them)",
                report["listed_swap_only_failing_on_stock"],
            )
    else:
        show("listed failures", report["listed"], with_reason=True)
        show("UNLISTED failures", report["unlisted"])
    if report["listed_now_passing"]:
        show(f"listed but now passing (prune them from {list_name})", report["listed_now_passing"])


def versions(packages: tuple[str, ...], python: str = sys.executable) -> dict:
    """What was tested, as seen by `python` (the interpreter the tests run under): the packages' versions, and
    trl_multiagent's path, commit and whether its files had edits."""
    probe = (
        "import importlib.metadata as m, importlib.util as u, json, sys\n"
        "found = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try: found[name] = m.version(name)\n"
        "    except m.PackageNotFoundError: found[name] = None\n"
        "spec = u.find_spec('trl_multiagent')\n"
        "found['trl_multiagent_path'] = spec.origin if spec else None\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run([python, "-c", probe, *packages], capture_output=True, text=True)
    if done.returncode != 0:
        raise UsageError(f"{python} could not report the versions it tests: {done.stderr[-2000:]}")
    found = json.loads(done.stdout)
    if found.get("trl_multiagent_path"):
        package = Path(found["trl_multiagent_path"]).parent
        git = ["git", "-C", str(package.parent)]
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        if head.returncode == 0:
            dirty = subprocess.run([*git, "status", "--porcelain", "--", package.name], capture_output=True, text=True)
            found["trl_multiagent_commit"] = head.stdout.strip()
            found["trl_multiagent_uncommitted_files"] = len(dirty.stdout.splitlines())
    return found


__all__ = [
    "FAILED",
    "OUTCOMES",
    "UsageError",
    "compare",
    "finish_run",
    "load_expected",
    "print_report",
    "say",
    "versions",
    "where",
]
