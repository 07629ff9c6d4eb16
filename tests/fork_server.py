"""A child process that imports once and forks a worker per job, for kill tests.

Hundreds of kills stay cheap when the imports (an engine SDK, threadline,
the stores) are paid once. The script given to ``ForkServer`` calls
``serve(run)``; each job line on its stdin becomes a forked child running
``run(job)``. Children report on stdout, one JSON line per report, written
before they go on, and the test kills them at the points they report.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec


def say(**fields: Any) -> None:
    os.write(1, msgspec.json.encode(fields) + b"\n")


class ForkServer:
    """A child that imports once and forks a worker per job (``script`` defines ``run(job)``)."""

    def __init__(self, script: Path, cwd: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, cwd=cwd)
        self.lines: dict[str, list[dict[str, Any]]] = {}
        self._cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            msg = msgspec.json.decode(raw)
            with self._cond:
                self.lines.setdefault(msg.get("tag", ""), []).append(msg)
                self._cond.notify_all()

    def start(self, **job: Any) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write(msgspec.json.encode(job) + b"\n")
        self.proc.stdin.flush()
        return int(self.wait_for(job["tag"], "pid")["pid"])

    def find(self, tag: str, *keys: str, value: Any = None) -> dict[str, Any] | None:
        """The first report of ``tag`` holding one of ``keys`` (equal to ``value``, if given)."""
        with self._cond:
            for msg in self.lines.get(tag, ()):
                if "error" in msg:
                    raise AssertionError(f"{tag}: {msg['error']}")
                if any(key in msg and (value is None or msg[key] == value) for key in keys):
                    return msg
        return None

    def wait_for(self, tag: str, *keys: str, value: Any = None,
                 timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._cond:
            while (found := self.find(tag, *keys, value=value)) is None:
                left = deadline - time.monotonic()
                assert left > 0, f"{tag}: no {keys}={value} in {self.lines.get(tag)}"
                assert self.proc.poll() is None, f"the fork server exited ({self.proc.returncode})"
                self._cond.wait(min(left, 1))
        return found

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(30)


def serve(run: Callable[[dict[str, Any]], None]) -> None:
    """The fork server's loop: one forked child per job line on stdin."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the children
    for line in sys.stdin.buffer:
        job = msgspec.json.decode(line)
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                run(job)
            except BaseException as exc:
                say(tag=job["tag"], error=f"{type(exc).__name__}: {exc}")
                code = 1
            os._exit(code)
        say(tag=job["tag"], pid=pid)


def kill(pid: int) -> None:
    """SIGKILL ``pid`` (if it has not finished) and wait until it is gone.

    The fork server ignores SIGCHLD, so the kernel reaps its children; once
    one is gone, its locks and connections are released.
    """
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    for _ in range(20_000):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.001)
    raise AssertionError(f"worker {pid} did not die")
