"""Process supervision for the subprocess loop.

A child runs in its own process group, so it and whatever it starts are
signalled together. Its stdout is read in chunks and split into lines here;
its stderr is drained all the time and its tail kept for error messages.
Stopping is SIGTERM, then SIGKILL after the grace period; the child is always
reaped, and what it left in its group is killed once it exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from threadline.errors import SubprocessError

__all__ = ["ABORTED", "DEFAULT_LINE_LIMIT", "TIMED_OUT", "TOO_LONG", "Child", "Options"]

DEFAULT_LINE_LIMIT = 64 * 1024 * 1024
_STDERR_LINES = 20  # lines of the child's stderr quoted in errors
_STDERR_KEEP = 8 * 1024  # bytes of stderr kept while the child runs
_CHUNK = 1024 * 1024  # bytes read from the child's stdout at a time


@dataclass(frozen=True, slots=True)
class Options:
    """How to start and stop the child; checked once, when the factory is made."""

    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None
    cwd: str | os.PathLike[str] | None = None
    grace: float = 5.0
    line_limit: int = DEFAULT_LINE_LIMIT

    @classmethod
    def checked(
        cls,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | os.PathLike[str] | None,
        grace: float,
        line_limit: int,
    ) -> Options:
        if isinstance(argv, str) or not argv:
            raise SubprocessError(
                f"the subprocess factory needs a command as a list of arguments, got {argv!r}"
            )
        if grace < 0 or line_limit < 1:
            raise SubprocessError(
                f"grace must be >= 0 and line_limit >= 1, got {grace!r} and {line_limit!r}"
            )
        return cls(tuple(str(a) for a in argv), dict(env) if env is not None else None, cwd,
                   grace, line_limit)


ABORTED = object()  # what next_line returns when the abort event fired
TIMED_OUT = object()  # ... when stdout stayed open after the child exited
TOO_LONG = object()  # ... when a line exceeds line_limit


class Child:
    """One child process: its pipes, its stderr tail, stopping and reaping it."""

    def __init__(self, options: Options, proc: asyncio.subprocess.Process,
                 request: bytes) -> None:
        self.options = options
        self.proc = proc
        self.grace = options.grace
        self.sent: list[signal.Signals] = []  # signals threadline sent to the child
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.stdout = proc.stdout
        self._buf = bytearray()
        self._pos = 0  # start of the next line in _buf
        self._scanned = 0  # _buf holds no newline before this
        self._eof = False
        self._stderr = bytearray()
        self._stopper: asyncio.Task[None] | None = None
        self._abort_wait: asyncio.Task[Any] | None = None
        self._exited = asyncio.create_task(self._reap())
        self._writer = asyncio.create_task(_write(proc.stdin, request))
        self._reader = asyncio.create_task(_drain(proc.stderr, self._stderr))

    @classmethod
    async def start(cls, options: Options, request: bytes) -> Child:
        proc = await asyncio.create_subprocess_exec(
            *options.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=options.env, cwd=options.cwd,
            limit=_CHUNK, start_new_session=True,
        )
        return cls(options, proc, request)

    async def _reap(self) -> None:
        # Not proc.wait(): that also waits for the pipes to close, which never
        # happens while something the child started still holds them. The
        # child watcher sets returncode as soon as it has reaped the child.
        delay = 0.001
        while self.proc.returncode is None:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        # Whatever the child left running in its group would hold our pipes open.
        _signal_group(self.proc.pid, signal.SIGKILL)

    async def next_line(self, *, watch_abort: bool, abort: asyncio.Event) -> object:
        """The next stdout line (``b""`` at EOF) or one of the markers above."""
        # Our own buffer, filled a chunk at a time: waiting for the pipe once
        # per line would cost an event-loop round trip per streamed token.
        buf = self._buf
        while True:
            if watch_abort and abort.is_set():
                return ABORTED
            end = buf.find(b"\n", max(self._pos, self._scanned))
            if end >= 0:
                if end - self._pos > self.options.line_limit:
                    return TOO_LONG
                line = bytes(buf[self._pos : end + 1])
                self._pos = self._scanned = end + 1
                return line
            del buf[: self._pos]
            self._pos, self._scanned = 0, len(buf)
            if len(buf) > self.options.line_limit:
                return TOO_LONG
            if self._eof:
                line = bytes(buf)  # b"" or a last line cut short
                buf.clear()
                self._scanned = 0
                return line
            chunk = await self._read_chunk(watch_abort, abort)
            if not isinstance(chunk, bytes):
                return chunk
            if chunk:
                buf += chunk
            else:
                self._eof = True

    async def _read_chunk(self, watch_abort: bool, abort: asyncio.Event) -> object:
        read = asyncio.ensure_future(self.stdout.read(_CHUNK))
        try:
            while True:
                waiting: set[asyncio.Future[Any]] = {read}
                if watch_abort:
                    if self._abort_wait is None:
                        self._abort_wait = asyncio.ensure_future(abort.wait())
                    waiting.add(self._abort_wait)
                exited = self._exited.done()
                if not exited:
                    waiting.add(self._exited)
                # Once the child is gone its output is already in the pipe; only a
                # process that escaped its group could keep us waiting for EOF.
                done, _ = await asyncio.wait(
                    waiting, timeout=self.grace if exited else None,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                if read in done:
                    return read.result()
                if watch_abort and abort.is_set():
                    return ABORTED
                if exited and not done:
                    return TIMED_OUT
        finally:
            if not read.done():
                read.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await read

    def begin_stop(self) -> None:
        if self._stopper is None:
            self._stopper = asyncio.create_task(self._terminate())

    async def stop(self) -> None:
        """SIGTERM the child's group, SIGKILL it after the grace period; return once reaped."""
        self.begin_stop()
        assert self._stopper is not None
        await asyncio.shield(self._stopper)

    async def _terminate(self) -> None:
        if self._exited.done():
            return
        self._send(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(self._exited), self.grace)
        except TimeoutError:
            self._send(signal.SIGKILL)
            await self._exited

    def _send(self, sig: signal.Signals) -> None:
        self.sent.append(sig)
        _signal_group(self.proc.pid, sig)

    async def finish(self) -> None:
        """Give the child the grace period to exit by itself, then stop it."""
        if self._stopper is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._exited), self.grace)
        await self.stop()

    async def stderr_tail(self) -> str:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._reader), self.grace)
        lines = self._stderr.decode("utf-8", "replace").splitlines()[-_STDERR_LINES:]
        return "\n".join(f"  {line[:500]}" for line in lines)

    def failed(self) -> bool:
        code = self.proc.returncode
        return code is not None and code != 0 and not self.sent

    def exit_status(self) -> str:
        code = self.proc.returncode
        if code is None:
            return "is still running"
        if code >= 0:
            return f"exited with status {code}"
        try:
            sig = signal.Signals(-code)
        except ValueError:
            return f"was killed by signal {-code}"
        by = ""
        if sig in self.sent:
            by = " (sent by threadline" + (
                " after the grace period)" if sig == signal.SIGKILL else ")")
        return f"was killed by {sig.name}{by}"

    def error(self, what: str, tail: str) -> SubprocessError:
        where = f"agent process {self.options.argv[0]!r} (pid {self.proc.pid})"
        quoted = f"\nlast lines of its stderr:\n{tail}" if tail else " (its stderr was empty)"
        return SubprocessError(f"{where} {what}{quoted}")

    async def cleanup(self) -> None:
        """Leave nothing running, even when the run is closed or cancelled mid-way."""
        try:
            await self.stop()
        except asyncio.CancelledError:
            # Cancelled again while waiting out the grace period: no more waiting.
            self._send(signal.SIGKILL)
            raise
        finally:
            for task in (self._writer, self._reader, self._abort_wait):
                if task is not None and not task.done():
                    task.cancel()
            pending = [t for t in (self._writer, self._reader, self._abort_wait) if t is not None]
            await asyncio.wait(pending)


async def _write(stdin: asyncio.StreamWriter, request: bytes) -> None:
    # A separate task, so a child that writes before reading cannot deadlock
    # us; a child that closes stdin early (or never reads it) is its business.
    with contextlib.suppress(ConnectionError):
        stdin.write(request)
        await stdin.drain()
    stdin.close()
    with contextlib.suppress(ConnectionError):
        await stdin.wait_closed()


async def _drain(stream: asyncio.StreamReader, keep: bytearray) -> None:
    # Chunks, not lines: a huge stderr line must neither stall the child nor us.
    while chunk := await stream.read(64 * 1024):
        keep += chunk
        if len(keep) > 2 * _STDERR_KEEP:
            del keep[:-_STDERR_KEEP]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
