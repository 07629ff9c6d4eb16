"""Running the ``threadline`` command as a real child process, on a pipe or a pty."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from pathlib import Path

from wire_server import Reply, sse_data, sse_reply

CLI = [sys.executable, "-c", "from threadline.cli import main; main()"]


def tl(
    *args: str, cwd: Path | None = None, check: bool = True, env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """The command with stdout and stderr on pipes."""
    full = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb", **(env or {})}
    proc = subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd, env=full,
                          timeout=120, check=False, input=input)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:\n{proc.stdout}\n"
                             f"stderr:\n{proc.stderr}")
    return proc


def tl_pty(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
           until: bytes | None = None, then: object = None) -> tuple[int, bytes]:
    """The command with stdout and stderr on a pseudo-terminal; (exit status, bytes).

    With ``until``, ``then(proc)`` is called once those bytes have appeared.
    """
    master, slave = os.openpty()
    full = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120", "PAGER": "cat",
            **(env or {})}
    full.pop("NO_COLOR", None)
    # A terminal's program gets Ctrl-C. One started from a background job of a
    # script (as CI's suites are) inherits SIGINT ignored and would never see
    # it; handled here instead of ignored, it starts at the default.
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    if ignored:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen([*CLI, *args], stdin=subprocess.DEVNULL, stdout=slave,
                                stderr=slave, cwd=cwd, env=full)
    finally:
        if ignored:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.close(slave)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([master], [], [], 120)
            if not ready:
                proc.kill()
                raise AssertionError(f"no output for 120 s; so far: {out!r}")
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed its end of the terminal
                break
            if not data:
                break
            out += data
            if until is not None and until in out and callable(then):
                then(proc)
                until = None
    finally:
        os.close(master)
    return proc.wait(60), out


def chat_reply(text: str) -> Reply:
    """An OpenAI Chat Completions stream answering ``text``."""
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    return sse_reply(sse_data([
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text},
                              "finish_reason": None}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]))
