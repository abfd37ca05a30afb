"""``python -c SCRIPT ARGS`` for the tests that kill or interrupt a training run, forked from a
warmed interpreter instead of started cold.

A test that SIGKILLs a run, or presses Ctrl-C inside one, needs a real process: its own pid,
signals, exit status and output. Started cold, each such process spent about four seconds on
imports and two tokenizer loads before its half second of work. :func:`run_python` gives it the
same process forked from a server (this file, run as a script) that did those once: it imports
the CLI and what a training run imports, loads our tokenizer and the twins' copy that pytrio
loads (handed to pytrio as the suite's own processes hand it, ``twin_support``), and then forks
one child per run. The child runs the script as ``python -c`` would: ``sys.argv``, a fresh
``__main__``, the exit status of ``sys.exit``, of an uncaught exception (its traceback printed)
or of a signal, non-daemon threads joined and ``atexit`` run before it exits. Its output is
captured as ``subprocess.run(..., capture_output=True, text=True)`` captures it.

The start-up itself stays covered by cold processes: ``tests/commands/test_prerequisites.py``
times it, ``tests/commands/test_invoked_program.py`` runs the script as installed, and the
tests of Ctrl-C during start-up in ``tests/e2e/test_run_safety.py`` interrupt it. A run whose
environment differs from the server's (modules read some variables as they are imported), or
that is not a ``-c`` script, is started cold, as before.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# What a training run imports beyond the CLI (the commands load their modules when invoked).
WARM_MODULES = ("searchr1.cli", "searchr1.commands.train", "searchr1.commands.eval", "searchr1.training.loop",
                "searchr1.training.pipeline", "searchr1.twin.server", "searchr1.search.replay",
                "searchr1.runtime.preflight", "pytrio", "modelscope")


# ----------------------------------------------------------------------------- the test's side


class _Server:
    """The warmed interpreter of this test process, and the environment it started with."""

    def __init__(self) -> None:
        self.environment = dict(os.environ)
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve())], cwd=TESTS,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._pending = b""
        if self.read_line(time.monotonic() + 300) != "ready":
            raise RuntimeError("the warm Python server did not start")
        atexit.register(self.close)

    def read_line(self, deadline: float) -> str | None:
        """The server's next line; None when ``deadline`` passes first."""
        assert self.process.stdout is not None
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.process.stdout.fileno(), 4096)
            if not chunk:
                raise RuntimeError(f"the warm Python server ended (exit {self.process.wait()})")
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return line.decode()

    def run(self, script: str, args: Sequence[str], cwd: str, timeout: float | None) -> tuple[int, str, str]:
        assert self.process.stdin is not None
        deadline = time.monotonic() + (timeout if timeout is not None else 1e9)
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            request = {"script": script, "args": list(args), "cwd": cwd, "stdout": str(out), "stderr": str(err)}
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            pid = self.read_line(time.monotonic() + 60)
            if not pid:
                raise RuntimeError("the warm Python server started no process")
            status = self.read_line(deadline)
            if status is None:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:  # it ended as the deadline passed
                    pass
                self.read_line(time.monotonic() + 60)
                raise subprocess.TimeoutExpired([sys.executable, "-c", script, *args], timeout or 0.0,
                                                out.read_bytes(), err.read_bytes())
            return int(status), out.read_text("utf-8"), err.read_text("utf-8")

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=30)


_SERVERS: list[_Server] = []
COLD: list[list[str]] = []  # the runs started cold, for the tests of this harness


def _compared(environment: Mapping[str, str]) -> dict[str, str]:
    """The environment as a run would read it (pytest names the running test in one variable)."""
    return {name: value for name, value in environment.items() if name != "PYTEST_CURRENT_TEST"}


def run_python(args: Sequence[str], *, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
               timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
    text=True, timeout=timeout)``, forked from this process's warm interpreter when ``args`` is
    ``-c SCRIPT ...`` and the environment is the one it started with."""
    command = [sys.executable, *args]
    wanted = _compared(os.environ if env is None else env)
    if not _SERVERS and args[:1] == ["-c"] and wanted == _compared(os.environ):  # the server's would be this
        _SERVERS.append(_Server())
    if args[:1] != ["-c"] or not _SERVERS or wanted != _compared(_SERVERS[0].environment):
        COLD.append(command)
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    code, out, err = _SERVERS[0].run(args[1], args[2:], str(Path(cwd or os.getcwd()).resolve()), timeout)
    return subprocess.CompletedProcess(command, code, out, err)


# ----------------------------------------------------------------------------- the server's side


def _warm() -> None:
    import importlib

    from twin_support import hand_loaded_tokenizers_to_modelscope, preload_sdk_tokenizer

    from searchr1.runtime.tokenizer import shared_tokenizer

    for module in WARM_MODULES:
        importlib.import_module(module)
    preload_sdk_tokenizer(shared_tokenizer())
    hand_loaded_tokenizers_to_modelscope()


def _exit_status(stop: SystemExit) -> int:
    """The status ``python`` exits with on ``stop`` (a message is printed, and is status 1)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code & 0xFF
    print(stop.code, file=sys.stderr)
    return 1


def _child(request: dict[str, object]) -> int:
    """Run the request's script as ``python -c`` runs one; the status to exit with (a negative
    one: the signal to end by)."""
    for stream, name in ((1, "stdout"), (2, "stderr")):
        descriptor = os.open(str(request[name]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(descriptor, stream)
        os.close(descriptor)
    os.chdir(str(request["cwd"]))
    main = types.ModuleType("__main__")
    sys.modules["__main__"] = main
    sys.argv = ["-c", *request["args"]]  # type: ignore[misc]
    sys.path[0] = ""  # python -c puts the working directory first
    try:
        exec(compile(str(request["script"]), "<string>", "exec"), main.__dict__)  # noqa: S102 - the test's script
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop)
    except BaseException as error:  # noqa: BLE001 - printed, as python prints it (without this frame)
        error.with_traceback(error.__traceback__.tb_next if error.__traceback__ else None)
        sys.excepthook(type(error), error, error.__traceback__)
        # python ends itself by SIGINT on an uncaught Ctrl-C, and with status 1 on anything else
        status = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    threading._shutdown()  # type: ignore[attr-defined]  # non-daemon threads are joined, as at exit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    return status


def serve() -> None:
    """Read one request per line; fork a child for each and answer its pid, then its exit status
    as ``subprocess`` reports it (a signal as its negative number)."""
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # the server's own output goes where its errors go, never into a reply
    _warm()
    replies.write("ready\n")
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        if threading.active_count() != 1:
            raise RuntimeError("the warm Python server started a thread: forking it is not safe")
        pid = os.fork()
        if pid == 0:
            requests.close()
            replies.close()
            try:
                status = _child(request)
            except BaseException:  # noqa: BLE001 - a fault of this harness, never the script's
                traceback.print_exc()
                status = 70
            if status < 0:
                signal.signal(-status, signal.SIG_DFL)
                os.kill(os.getpid(), -status)
            os._exit(status)
        replies.write(f"{pid}\n")
        _, raw = os.waitpid(pid, 0)
        replies.write(f"{os.waitstatus_to_exitcode(raw)}\n")


if __name__ == "__main__":
    sys.path.insert(1, str(TESTS.parent))  # the checkout, after this folder (the script's own)
    serve()
