"""Run untrusted Python (model-written code) in a separate, isolated process, for code rewards.

    from sandbox import run_python

    result = run_python("assert 1 + 1 == 2", timeout_s=5, memory_mb=512)
    result.passed, result.status, result.detail   # True, "passed", "the program ran to the end"

Each call starts a fresh process tree and waits for it; it never raises for anything the code does, and it never hangs
longer than `timeout_s` (plus about a second to tear the sandbox down).

Isolation (the default backend, `"bwrap"`, Debian's `bubblewrap` package):

- **Filesystem.** A new, empty root: `/usr` (and `/bin`, `/lib`, `/lib64` as links) plus the running interpreter's
  install prefix are bound read-only; `/proc` and `/dev` are fresh minimal ones; `/tmp` (also the working directory and
  `HOME`) is a new tmpfs of `file_size_mb` that disappears with the process, and the only writable place. The program
  and a small runner are bound read-only at `/sandbox`. Nothing else of the host is visible (not `/etc`, `/root`,
  `/home`, the host's `/tmp`, the repository), and nothing on the host can be written.
- **Namespaces.** `--unshare-all`: new user, pid, network (only a down loopback: no connection leaves, not even to
  127.0.0.1), ipc, uts and cgroup namespaces; uid/gid 65534 inside with every capability dropped, and no nested user
  namespaces (`--disable-userns`). `--die-with-parent` and the pid namespace make every process of the tree die with
  it: on a timeout, or if the trainer itself dies.
- **Environment.** bwrap itself starts with a minimal environment and `--clearenv` empties the program's: only
  `PATH`, `HOME` and `LANG` are set, so the trainer's secrets (tokens, keys) are not inherited, not even through
  `/proc/1/environ` (bwrap's reaper, pid 1 inside). Python runs with `-I -S -B` (isolated mode, standard library
  only, no bytecode writes).
- **Resources** (`prlimit`; each process of the tree inherits the limits): CPU seconds (`ceil(timeout_s) + 1`),
  address space (`memory_mb`), size of any file written, including the captured stdout/stderr (`file_size_mb`), open
  files, no core dumps; plus a wall-clock timeout in the parent, which kills the whole tree.

Limits: bubblewrap is namespaces on the host kernel, not a virtual machine. A kernel bug can still be an escape, and
the number of processes is bounded only by the timeout and the pid namespace: RLIMIT_NPROC is not enforced for root,
which is what the sandboxed uid maps to when the trainer runs as root. Isolation is not anti-cheating either: code runs
in the same interpreter as the harness, so a deliberately adversarial program can tamper with checks that run
in-process (see `passed` below).

How "passed" is decided: the runner execs the program; only if it returns normally does the runner print a line with a
random per-run nonce (after the whole program, so after any `check()` call at its end). `passed` needs that line and
exit status 0. A program that calls `os._exit(0)`, `sys.exit(0)` or is killed before the end does not pass. The nonce is
not in the program's text or environment; only frame introspection of the runner could find it.

Fallback: `backend="unshare"` (util-linux `unshare --net --pid --fork`, plus the same rlimits, clean environment and
timeout) isolates the network, the environment and the processes, but NOT the filesystem: the code runs as the
trainer's user in a temporary working directory and can write wherever that user can. It is used only when asked for
(argument, or `MAGRPO_SANDBOX=unshare`); without bubblewrap, the default backend refuses with an explanation.
"""

from __future__ import annotations

import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass


__all__ = ["SandboxResult", "SandboxUnavailable", "check_sandbox", "run_python", "sandbox_backend"]

STATUSES = ("passed", "failed", "timeout", "crashed", "error")
_TAIL_BYTES = 64 * 1024
_KILL_GRACE_S = 2.0

# The runner execs the program and reports how it ended on a line that starts with the per-run nonce. It receives the
# nonce on stdin (then stdin is /dev/null) and the program's path as argv[1].
RUNNER = r"""
import json, os, sys, traceback


def _main():
    nonce = sys.stdin.readline().strip()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(os.devnull)
    path = sys.argv[1]

    def report(result):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        os.write(1, ("\n" + nonce + " " + json.dumps(result) + "\n").encode())

    os.write(1, (nonce + " started\n").encode())
    with open(path, encoding="utf-8") as f:
        source = f.read()
    namespace = {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__}
    try:
        exec(compile(source, path, "exec"), namespace)
    except BaseException as err:
        try:
            message = str(err)[:2000]
        except BaseException:
            message = "<unprintable message>"
        try:
            notes = [str(n)[:2000] for n in (getattr(err, "__notes__", None) or [])][:5]
        except BaseException:
            notes = []
        try:
            frames = [[fr.lineno, (fr.line or "")[:300]] for fr in traceback.extract_tb(err.__traceback__)
                      if fr.filename == path][-10:]
        except BaseException:
            frames = []
        try:
            if isinstance(err, SyntaxError) and err.filename == path:
                frames.append([err.lineno or 0, (err.text or "").strip()[:300]])
        except BaseException:
            pass
        report({"ok": False, "type": type(err).__name__, "message": message, "notes": notes, "frames": frames})
        os._exit(1)
    report({"ok": True})
    os._exit(0)


_main()
"""


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be set up on this machine."""


@dataclass(frozen=True)
class SandboxResult:
    """How one program ended.

    status: "passed" (ran to the end), "failed" (raised, or exited before the end), "timeout" (wall-clock or CPU time
    limit), "crashed" (killed by a signal, or out of memory), "error" (the sandbox itself could not run the program).
    """

    passed: bool
    status: str
    detail: str
    exception: str | None = None  # type name of the exception that ended the program, if any
    message: str = ""  # its message
    notes: tuple[str, ...] = ()  # its __notes__ (added with `add_note`)
    frames: tuple[tuple[int, str], ...] = ()  # (line number in `code`, source line) of the traceback, outermost first
    stdout: str = ""  # the last 64 KiB of stdout, without the runner's lines
    stderr: str = ""  # the last 64 KiB of stderr
    returncode: int | None = None
    duration_s: float = 0.0
    backend: str = ""


def sandbox_backend(backend: str | None = None) -> str:
    """The backend `run_python` would use: "bwrap" or "unshare". Raises `SandboxUnavailable` when it cannot run."""
    backend = backend or os.environ.get("MAGRPO_SANDBOX") or "bwrap"
    if backend not in ("bwrap", "unshare"):
        raise ValueError(f"sandbox backend must be 'bwrap' or 'unshare', got {backend!r}.")
    missing = [tool for tool in (backend, "prlimit") if shutil.which(tool) is None]
    if missing:
        hint = (
            "Install bubblewrap and util-linux (Debian/Ubuntu: `apt-get install -y bubblewrap util-linux`; Fedora: "
            "`dnf install bubblewrap util-linux`). "
            "`MAGRPO_SANDBOX=unshare` selects a weaker fallback (network, environment and process isolation only; "
            "the code can write wherever the trainer's user can)."
            if backend == "bwrap"
            else "`unshare` and `prlimit` come with util-linux."
        )
        raise SandboxUnavailable(f"Cannot sandbox model-written code: {', '.join(missing)} not found on PATH. {hint}")
    return backend


def check_sandbox(backend: str | None = None, timeout_s: float = 10.0, memory_mb: int = 512) -> str:
    """Run a trivial program (and one that must fail) in the sandbox; raise `SandboxUnavailable` if that does not
    work. Returns the backend name. Call it once before training, so that a broken set-up is not mistaken for bad
    code."""
    backend = sandbox_backend(backend)
    ok = run_python("assert sum(range(4)) == 6\n", timeout_s=timeout_s, memory_mb=memory_mb, backend=backend)
    bad = run_python("assert False, 'expected'\n", timeout_s=timeout_s, memory_mb=memory_mb, backend=backend)
    if not ok.passed or bad.status != "failed" or bad.exception != "AssertionError":
        raise SandboxUnavailable(
            f"The {backend} sandbox does not run Python correctly here. A trivial program gave: {ok.status}: "
            f"{ok.detail} (stderr: {ok.stderr[-500:]!r}); a failing one gave: {bad.status}: {bad.detail}."
        )
    return backend


def run_python(
    code: str,
    timeout_s: float = 5.0,
    memory_mb: int = 512,
    *,
    file_size_mb: int = 16,
    backend: str | None = None,
    python: str | None = None,
) -> SandboxResult:
    """Run `code` as a Python program in a fresh sandboxed process and report how it ended.

    timeout_s: wall-clock limit (the CPU-time limit is `ceil(timeout_s) + 1` s). memory_mb: address-space limit of each
    process. file_size_mb: the largest file the program may write (stdout and stderr included), and the size of its
    private /tmp. backend: "bwrap" (default) or "unshare" (weaker; see the module docstring). python: the interpreter
    (default: the one running this code).
    """
    start = time.perf_counter()
    try:
        backend = sandbox_backend(backend)
    except SandboxUnavailable as err:
        return SandboxResult(False, "error", str(err), duration_s=time.perf_counter() - start, backend=backend or "")
    python = os.path.realpath(python or sys.executable)
    nonce = secrets.token_hex(16)
    host_dir = tempfile.mkdtemp(prefix="magrpo-sandbox-")
    try:
        os.chmod(host_dir, 0o755)
        with open(os.path.join(host_dir, "program.py"), "w", encoding="utf-8") as f:
            f.write(code)
        with open(os.path.join(host_dir, "runner.py"), "w", encoding="utf-8") as f:
            f.write(RUNNER)
        if backend == "bwrap":
            # bwrap's own processes get a clean environment too: its pid-1 reaper's /proc/1/environ is visible inside.
            command, cwd, env = _bwrap_command(host_dir, python, file_size_mb), None, _clean_env("/")
            program_dir = "/sandbox"
        else:
            command, cwd, env = _unshare_command(), host_dir, _clean_env(host_dir)
            program_dir = host_dir
        command = [*command, python, "-I", "-S", "-B", f"{program_dir}/runner.py", f"{program_dir}/program.py"]
        limits = _prlimit(timeout_s, memory_mb, file_size_mb)
        return _execute([*limits, "--", *command], cwd, env, nonce, timeout_s, memory_mb, file_size_mb, backend, start)
    finally:
        shutil.rmtree(host_dir, ignore_errors=True)


def _python_paths(python: str) -> list[str]:
    """Host folders the interpreter needs, beyond /usr: its install prefix (and a venv's, if any)."""
    paths = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(python)))}
    return sorted(p for p in paths if p != "/" and not (p + "/").startswith("/usr/") and os.path.isdir(p))


def _bwrap_command(host_dir: str, python: str, file_size_mb: int) -> list[str]:
    cmd = [shutil.which("bwrap"), "--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    cmd += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534", "--cap-drop", "ALL"]
    cmd += ["--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for top in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = f"/{top}"
        if os.path.islink(path):
            cmd += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            cmd += ["--ro-bind", path, path]
    for path in _python_paths(python):
        cmd += ["--ro-bind", path, path]
    cmd += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    cmd += ["--proc", "/proc", "--dev", "/dev"]
    cmd += ["--size", str(file_size_mb * 1024 * 1024), "--tmpfs", "/tmp"]
    cmd += ["--ro-bind", host_dir, "/sandbox", "--chdir", "/tmp"]
    cmd += ["--remount-ro", "/"]  # the new root itself (where /etc, /root, ... were created) is read-only too
    cmd += ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8"]
    return cmd


def _unshare_command() -> list[str]:
    cmd = [shutil.which("unshare"), "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--uts"]
    if os.geteuid() != 0:
        cmd.insert(1, "--map-root-user")
    return cmd


def _clean_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"}


def _prlimit(timeout_s: float, memory_mb: int, file_size_mb: int) -> list[str]:
    cpu = math.ceil(timeout_s) + 1
    memory = memory_mb * 1024 * 1024
    fsize = file_size_mb * 1024 * 1024
    return [
        shutil.which("prlimit"), f"--cpu={cpu}:{cpu}", f"--as={memory}:{memory}", f"--fsize={fsize}:{fsize}",
        "--nofile=256:256", "--core=0:0",
    ]  # fmt: skip


def _execute(command, cwd, env, nonce, timeout_s, memory_mb, file_size_mb, backend, start) -> SandboxResult:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(
                command, stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=cwd, env=env, start_new_session=True,
                close_fds=True,
            )  # fmt: skip
        except OSError as exc:
            return SandboxResult(False, "error", f"could not start the sandbox: {exc}", backend=backend,
                                 duration_s=time.perf_counter() - start)  # fmt: skip
        timed_out = False
        try:
            try:
                proc.stdin.write((nonce + "\n").encode())
                proc.stdin.close()
            except OSError:
                pass  # it already died; its status says why
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            if proc.poll() is None:
                _kill(proc)
        duration = time.perf_counter() - start
        started = _head(out).startswith(nonce + " started\n")
        stdout_full = out.seek(0, os.SEEK_END) >= file_size_mb * 1024 * 1024
        stdout, stderr = _tail(out), _tail(err)
    return _classify(
        proc.returncode, started, stdout, stderr, nonce, timed_out, stdout_full, timeout_s, memory_mb, file_size_mb,
        backend, duration,
    )  # fmt: skip


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher's process group; `--die-with-parent` / `--kill-child` and the pid namespace do the rest."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=_KILL_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _head(f) -> str:
    f.seek(0)
    return f.read(256).decode("utf-8", errors="replace")


def _tail(f) -> str:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - _TAIL_BYTES))
    return f.read().decode("utf-8", errors="replace")


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _classify(
    returncode, started, stdout, stderr, nonce, timed_out, stdout_full, timeout_s, memory_mb, file_size_mb, backend,
    duration,
) -> SandboxResult:  # fmt: skip
    report, kept = None, []
    for line in stdout.splitlines():
        if line.startswith(nonce + " "):
            payload = line[len(nonce) + 1 :]
            if payload == "started":
                continue
            try:
                report = json.loads(payload)
            except ValueError:
                pass
            continue
        kept.append(line)
    common = dict(stdout="\n".join(kept), stderr=stderr, returncode=returncode, duration_s=duration, backend=backend)
    # bwrap and `unshare --fork` exit with 128 + n when the program was killed by signal n; -n if they were killed.
    killed_by = -returncode if returncode is not None and returncode < 0 else None
    if killed_by is None and returncode is not None and 128 < returncode < 160 and report is None:
        killed_by = returncode - 128

    if timed_out:
        return SandboxResult(False, "timeout", f"no result within the {timeout_s:g} s wall-clock limit; killed",
                             **common)  # fmt: skip
    if report is not None and report.get("ok") and returncode == 0:
        return SandboxResult(True, "passed", "the program ran to the end", **common)
    if report is not None and not report.get("ok"):
        exc_type = str(report.get("type", "Exception"))
        message = str(report.get("message", ""))
        notes = tuple(str(n) for n in report.get("notes", []) or [])
        frames = tuple((int(n), str(line)) for n, line in report.get("frames", []) or [])
        where = f" (line {frames[-1][0]}: {frames[-1][1].strip()})" if frames else ""
        detail = f"{exc_type}{': ' + message if message else ''}{where}"
        status = "crashed" if exc_type == "MemoryError" else "failed"
        if status == "crashed":
            detail += f"; memory limit {memory_mb} MB"
        return SandboxResult(False, status, detail, exception=exc_type, message=message, notes=notes, frames=frames,
                             **common)  # fmt: skip
    if not started:
        # The runner writes its "started" line before the program runs, so this is a set-up failure.
        return SandboxResult(False, "error", f"the sandbox did not start the program (exit status {returncode}): "
                             f"{stderr.strip()[-500:]}", **common)  # fmt: skip
    if killed_by == signal.SIGXCPU:
        return SandboxResult(False, "timeout", f"CPU time limit ({math.ceil(timeout_s) + 1} s) exceeded", **common)
    if killed_by is not None:
        return SandboxResult(False, "crashed", f"killed by {_signal_name(killed_by)}", **common)
    if stdout_full:
        return SandboxResult(False, "crashed", f"wrote more than the {file_size_mb} MB output limit", **common)
    return SandboxResult(False, "failed", f"the program exited (status {returncode}) before it reached its end",
                         **common)  # fmt: skip
