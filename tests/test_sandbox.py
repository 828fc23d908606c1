"""recipes/sandbox.py: hostile programs fail within their limits; neither the test process nor the host is touched."""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

# recipes/ is on the import path through `pythonpath` in pyproject.toml's [tool.pytest.ini_options]
import sandbox
from sandbox import SandboxUnavailable, check_sandbox, run_python, sandbox_backend


needs_bwrap = pytest.mark.usefixtures("bubblewrap")  # skips without bubblewrap (tests/conftest.py)

TIMEOUT = 1.5
SLACK = 3.0  # start-up and tear-down on a busy 2-core machine


def run(code, **kwargs):
    kwargs.setdefault("timeout_s", TIMEOUT)
    kwargs.setdefault("memory_mb", 256)
    start = time.perf_counter()
    result = run_python(code, **kwargs)
    assert time.perf_counter() - start < kwargs["timeout_s"] + SLACK, result
    assert result.status in sandbox.STATUSES
    assert result.passed == (result.status == "passed")
    return result


def failure(code, **kwargs):
    result = run(code, **kwargs)
    assert not result.passed, result
    assert result.status != "error", result  # the sandbox itself worked; the program failed
    return result


def leftover_sandbox_dirs():
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("magrpo-sandbox-")}


@needs_bwrap
def test_passing_program():
    before = leftover_sandbox_dirs()
    result = run("def check(f):\n    assert f(2) == 4\n\ncheck(lambda x: x * x)\nprint('done')\n")
    assert result.passed and result.status == "passed", result
    assert result.stdout.strip() == "done"
    assert result.backend == "bwrap"
    assert leftover_sandbox_dirs() <= before  # the host-side temp dir is removed


@needs_bwrap
def test_failing_program_reports_the_assertion():
    result = failure("def check(f):\n    assert f(2) == 5, 'f(2) should be 5'\n\ncheck(lambda x: x * x)\n")
    assert result.status == "failed"
    assert result.exception == "AssertionError" and result.message == "f(2) should be 5"
    assert result.frames[-1] == (2, "assert f(2) == 5, 'f(2) should be 5'")
    assert "AssertionError" in result.detail and "assert f(2) == 5" in result.detail


@needs_bwrap
@pytest.mark.parametrize("code", ["while True:\n    pass\n", "import time\ntime.sleep(1000)\n"], ids=["busy", "sleep"])
def test_infinite_loop_times_out(code):
    result = failure(code)
    assert result.status == "timeout", result
    assert TIMEOUT <= result.duration_s < TIMEOUT + SLACK


@needs_bwrap
def test_huge_allocation_fails_fast():
    result = failure("x = bytearray(8 * 1024**3)\nprint('allocated')\n")
    assert result.status == "crashed" and result.exception == "MemoryError", result
    assert "allocated" not in result.stdout
    assert result.duration_s < TIMEOUT


EXITS = {
    "os._exit": "import os; os._exit(0)",
    "sys.exit": "import sys; sys.exit(0)",
    "SystemExit": "raise SystemExit",
    "SIGKILL": "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
}


@needs_bwrap
@pytest.mark.parametrize("exit_call", list(EXITS.values()), ids=list(EXITS))
def test_exiting_before_the_tests_is_not_a_pass(exit_call):
    code = f"def check(f):\n    assert f(1) == 2\n\n{exit_call}\ncheck(lambda x: x)\n"
    result = failure(code)
    assert result.status in ("failed", "crashed"), result


@needs_bwrap
def test_printing_a_fake_marker_is_not_a_pass():
    result = failure("import os\nprint('passed')\nos.write(1, b'ok started\\nok {\"ok\": true}\\n')\nos._exit(0)\n")
    assert result.status == "failed", result


@pytest.fixture
def host_targets(tmp_path_factory):
    """Files and folders on the host that sandboxed code tries to write or delete."""
    victim_dir = Path(tempfile.mkdtemp(prefix="magrpo-victim-", dir="/tmp"))
    victim = victim_dir / "victim.txt"
    victim.write_text("original")
    token = secrets.token_hex(6)
    repo_probe = Path(__file__).resolve().parent / f"sandbox-probe-{token}.txt"
    prefix_probe = Path(sys.base_prefix) / f"sandbox-probe-{token}.txt"
    etc_probe = Path("/etc") / f"sandbox-probe-{token}.txt"
    targets = {
        "overwrite": (f"open({str(victim)!r}, 'w').write('pwned')", victim),
        "append": (f"open({str(victim)!r}, 'a').write('pwned')", victim),
        "delete": (f"import os; os.remove({str(victim)!r})", victim),
        "create_in_tmp_dir": (f"open({str(victim_dir / 'new.txt')!r}, 'w').write('pwned')", victim_dir / "new.txt"),
        "create_in_repo": (f"open({str(repo_probe)!r}, 'w').write('pwned')", repo_probe),
        "create_in_python_prefix": (f"open({str(prefix_probe)!r}, 'w').write('pwned')", prefix_probe),
        "create_in_etc": (f"open({str(etc_probe)!r}, 'w').write('pwned')", etc_probe),
    }
    yield targets, victim, victim_dir
    shutil.rmtree(victim_dir, ignore_errors=True)
    for probe in (repo_probe, prefix_probe, etc_probe):
        probe.unlink(missing_ok=True)


@needs_bwrap
@pytest.mark.parametrize(
    "target",
    [
        "overwrite",
        "append",
        "delete",
        "create_in_tmp_dir",
        "create_in_repo",
        "create_in_python_prefix",
        "create_in_etc",
    ],
)
def test_writes_outside_the_sandbox_fail(host_targets, target):
    targets, victim, victim_dir = host_targets
    code, path = targets[target]
    result = failure(code + "\n")
    assert result.status == "failed" and result.exception in ("FileNotFoundError", "OSError", "PermissionError"), (
        result
    )
    assert victim.read_text() == "original"
    assert sorted(p.name for p in victim_dir.iterdir()) == ["victim.txt"]
    if path != victim:
        assert not path.exists()


@needs_bwrap
def test_writing_inside_the_sandbox_works_and_vanishes():
    code = "import os\nopen('scratch.txt', 'w').write('x' * 1000)\nassert os.path.getsize('scratch.txt') == 1000\n"
    assert run(code).passed
    assert run("import os\nassert not os.path.exists('scratch.txt')\n").passed  # a fresh /tmp every time


@needs_bwrap
def test_secrets_in_the_environment_are_not_inherited(monkeypatch):
    secret = "s3cr3t-" + secrets.token_hex(8)
    monkeypatch.setenv("SECRET", secret)
    monkeypatch.setenv("HF_TOKEN", secret)
    code = (
        "import glob, os\n"
        f"secret = {secret[:7]!r}\n"  # the prefix only: the full value must not appear in the program either
        "found = [k for k, v in os.environ.items() if secret in v]\n"
        "for path in glob.glob('/proc/*/environ'):\n"
        "    try:\n"
        "        data = open(path, 'rb').read().decode(errors='replace')\n"
        "    except OSError:\n"
        "        continue\n"
        "    if secret in data:\n"
        "        found.append(path)\n"
        "print('environment:', dict(os.environ), 'found:', found)\n"
        "assert not found, found\n"
        "print(os.environ['SECRET'])\n"
    )
    result = failure(code)
    assert result.exception == "KeyError", result
    for text in (result.stdout, result.stderr, result.detail, result.message):
        assert secret not in text
    assert "found: []" in result.stdout


@needs_bwrap
def test_no_network_not_even_loopback():
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.3)
        port = server.getsockname()[1]
        code = (
            "import socket\n"
            f"conn = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "conn.sendall(b'exfiltrated')\n"
        )
        result = failure(code)
        assert result.exception in ("ConnectionRefusedError", "OSError", "TimeoutError"), result
        with pytest.raises(TimeoutError):
            server.accept()  # nothing reached the server


@needs_bwrap
def test_no_network_to_the_outside():
    result = failure("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)\n")
    assert result.exception in ("OSError", "ConnectionRefusedError", "TimeoutError"), result


def _processes_with(marker: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
    return found


@needs_bwrap
@pytest.mark.parametrize("then", ["exit", "hang"])
def test_no_process_outlives_the_run(then):
    marker = "sandbox-orphan-" + secrets.token_hex(6)
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(100)', {marker!r}],\n"
        "                 start_new_session=True)\n" + ("while True:\n    time.sleep(0.1)\n" if then == "hang" else "")
    )
    result = run(code)
    assert result.status == ("passed" if then == "exit" else "timeout"), result
    time.sleep(0.2)
    assert _processes_with(marker) == []


@needs_bwrap
def test_output_flood_is_capped():
    result = failure("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", file_size_mb=4)
    assert result.status == "crashed" and "output limit" in result.detail, result
    assert len(result.stdout) <= 70_000


@needs_bwrap
def test_file_size_limit():
    result = failure("open('big.bin', 'wb').write(b'x' * (32 * 1024 * 1024))\n", file_size_mb=4)
    assert result.exception == "OSError" and "File too large" in result.message, result


@needs_bwrap
def test_syntax_error_is_a_failure():
    result = failure("def f(:\n    pass\n")
    assert result.exception == "SyntaxError" and result.frames[-1][0] == 1, result


@needs_bwrap
def test_runs_in_parallel_threads():
    programs = ["assert True\n", "assert False\n", "while True: pass\n", "x = bytearray(8 * 1024**3)\n"] * 2
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda code: run_python(code, timeout_s=1.0, memory_mb=256), programs))
    assert [r.status for r in results] == ["passed", "failed", "timeout", "crashed"] * 2
    assert time.perf_counter() - start < 2 * 1.0 + 2 * SLACK


@needs_bwrap
def test_check_sandbox():
    assert check_sandbox() == "bwrap"


def test_missing_bubblewrap_is_refused_clearly(monkeypatch):
    monkeypatch.delenv("MAGRPO_SANDBOX", raising=False)
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        sandbox_backend()
    with pytest.raises(SandboxUnavailable):
        check_sandbox()
    result = run_python("assert True\n")
    assert not result.passed and result.status == "error" and "bubblewrap" in result.detail


def test_unknown_backend():
    with pytest.raises(ValueError, match="bwrap"):
        sandbox_backend("docker")


@pytest.mark.skipif(
    shutil.which("unshare") is None or os.geteuid() != 0, reason="the unshare fallback is tried as root"
)
def test_unshare_fallback_isolates_network_environment_and_time(monkeypatch):
    monkeypatch.setenv("SECRET", "s3cr3t-value")
    assert run("assert 1 + 1 == 2\n", backend="unshare").passed
    assert run("import os\nassert 'SECRET' not in os.environ\n", backend="unshare").passed
    assert failure("while True: pass\n", backend="unshare").status == "timeout"
    assert failure("import os; os._exit(0)\n", backend="unshare").status == "failed"
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        result = failure(
            f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n", backend="unshare"
        )
        assert result.exception in ("ConnectionRefusedError", "OSError"), result


def path_without_bwrap(tmp_path) -> str:
    """This PATH with every folder holding `bwrap` replaced by a folder of links to its other programs."""
    links, folders = tmp_path / "bin", []
    links.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if folder and os.path.exists(os.path.join(folder, "bwrap")):
            for name in os.listdir(folder):
                if name != "bwrap" and not (links / name).exists():
                    (links / name).symlink_to(os.path.join(folder, name))
            folder = str(links)
        folders.append(folder)
    return os.pathsep.join(dict.fromkeys(folders))


@pytest.mark.slow  # a run of its own, kept out of the default suite for time (docs/tests.md, "The default suite")
def test_without_bubblewrap_the_sandbox_tests_skip_with_one_summary_line(tmp_path):
    """The README's test command on a machine without bubblewrap: the sandbox tests skip and the run passes."""
    env = {k: v for k, v in os.environ.items() if k != "TRL_MULTIAGENT_REQUIRE_SANDBOX_TESTS"}
    env["PATH"] = path_without_bwrap(tmp_path)
    root = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_sandbox.py"]
    done = subprocess.run(
        [*command, "-k", "not without_bubblewrap"], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:]
    summary = [line for line in done.stdout.splitlines() if "sandbox tests skipped" in line]
    assert len(summary) == 1 and "apt-get install -y bubblewrap" in summary[0], summary
    skipped = int(summary[0].split()[0])
    assert skipped >= 20 and f" {skipped} skipped" in done.stdout.splitlines()[-1]  # every skip is a sandbox one
    assert "error" not in done.stdout.splitlines()[-1]
    required = subprocess.run(  # CI's setting: missing bubblewrap fails them
        [*command, "-k", "test_passing_program"],
        cwd=root,
        env={**env, "TRL_MULTIAGENT_REQUIRE_SANDBOX_TESTS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert required.returncode == 1 and "1 error" in required.stdout and "REQUIRE_SANDBOX_TESTS=1" in required.stdout
