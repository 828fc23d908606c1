"""Pytest plugin that the harness copies into each run folder (as `_trl_contract_plugin.py`, loaded by `-p`).

It does two things, and nothing else:
- skips the tests named in the `TRL_CONTRACT_SKIPS` file (JSON: node-id prefix -> reason), before they run, so that
  they are counted as skipped with the harness's reason;
- records each test's outcome (passed, failed, error, skipped, xfailed, xpassed), its duration and, for failures,
  where it failed (the exception's type and the last line of the test's own file in the traceback: the harness
  compares these between stock and swapped), the exception line and the end of the traceback, in the JSON file
  `TRL_CONTRACT_RESULTS` (rewritten after each test, so that a run cut short still leaves what it did).
"""

import json
import os
import time

import pytest


_results = {}
_skips = {}


def _id(nodeid):
    return nodeid[len("tests/") :] if nodeid.startswith("tests/") else nodeid


def pytest_configure(config):
    path = os.environ.get("TRL_CONTRACT_SKIPS")
    if path:
        with open(path) as f:
            _skips.update(json.load(f))


def pytest_collection_modifyitems(config, items):
    for item in items:
        test_id = _id(item.nodeid)
        for prefix, reason in _skips.items():
            if test_id.startswith(prefix):
                item.add_marker(pytest.mark.skip(reason=f"trl_contract: {reason}"))
                break


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not report.failed:
        return
    # Where the test failed, in its own file: the deepest traceback frame whose file is the test's (stock and
    # swapped run the same file, whose one edit keeps the line count, so the lines compare).
    test_file = str(item.path)
    lines = [entry.lineno + 1 for entry in call.excinfo.traceback if str(entry.path) == test_file]
    entry = _results.setdefault(_id(report.nodeid), {"outcome": None, "duration": 0.0})
    entry.setdefault(
        "failure",
        {  # the first failure (a teardown error after a failed call keeps the call's)
            "when": call.when,
            "exception": call.excinfo.type.__name__,
            "test_line": lines[-1] if lines else None,
        },
    )


def _message(report):
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.strip().splitlines()[0][:500] if crash.message.strip() else ""
    if isinstance(report.longrepr, tuple):  # skips: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).strip().splitlines()[-1][:500] if report.longrepr else ""


def pytest_collectreport(report):
    if report.failed:
        _results[_id(report.nodeid)] = {"outcome": "collect-error", "duration": 0.0, "message": _message(report)}
        _write()


def pytest_runtest_logreport(report):
    test_id = _id(report.nodeid)
    entry = _results.setdefault(test_id, {"outcome": None, "duration": 0.0})
    entry["duration"] = round(entry["duration"] + report.duration, 2)
    xfail = hasattr(report, "wasxfail")
    if report.when == "setup":
        if report.skipped:
            entry["outcome"], entry["message"] = "skipped", _message(report)
        elif report.failed:
            entry["outcome"], entry["message"] = "error", _message(report)
    elif report.when == "call":
        if xfail:
            entry["outcome"] = "xfailed" if report.skipped else "xpassed"
            entry["message"] = str(report.wasxfail)
        elif report.skipped:
            entry["outcome"], entry["message"] = "skipped", _message(report)
        else:
            entry["outcome"] = report.outcome
            if report.failed:
                entry["message"] = _message(report)
    elif report.when == "teardown" and report.failed and entry["outcome"] != "failed":
        entry["outcome"], entry["message"] = "error", "teardown: " + _message(report)
    if report.failed:
        entry["traceback"] = "\n".join(report.longreprtext.splitlines()[-150:])
    if report.when == "teardown":
        _write()


def _write():
    path = os.environ.get("TRL_CONTRACT_RESULTS")
    if not path:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"written": time.strftime("%Y-%m-%d %H:%M:%S"), "tests": _results}, f, indent=1)
    os.replace(tmp, path)


def pytest_sessionfinish(session, exitstatus):
    _write()
