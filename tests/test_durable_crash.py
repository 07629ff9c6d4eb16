"""The durable agent under real process death (S4, S11, S12).

A "zygote" child process (this file run as a script) imports threadline once
and then forks one grandchild per job, so a hundred crashes cost a hundred
``fork`` calls, not a hundred interpreter starts. The zygote has no threads,
which makes forking it safe. Each grandchild runs a durable agent on a real
store and reports, over the shared stdout pipe, every entry id a forwarded
event carried; the test kills it with SIGKILL whenever it likes, then checks
the store against what was reported.

Protocol, one JSON object per line (each write is one ``os.write`` below
PIPE_BUF, so lines from different processes never mix):

- test -> zygote: ``{"job": {...}}`` forks a grandchild; ``{"reap": pid}``
  waits for it.
- zygote -> test: ``{"tag", "pid"}`` after a fork, ``{"reaped", "status"}``.
- grandchild -> test: ``{"tag", "ids"}`` per receipt, ``{"tag", "ready"}``,
  ``{"tag", "tool"}`` when a tool starts, ``{"tag", "done"}`` at the end,
  ``{"tag", "error"}`` if it failed.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from support.stores import import_every_store
from threadline import durable
from threadline.ai._messages import ToolResultMessage, UserMessage
from threadline.ai._tools import tool
from threadline.durable import RunStarted, StoredMessageEnd
from threadline.durable._repair import orphaned_results
from threadline.errors import SessionNotFound
from threadline.session import Entry, MessageEntry, TreeIndex, build_context
from threadline.stores import open_store
from threadline.testing import Call, Delay, ScriptedModel, Text, Turn, assert_valid_for_providers

# -- the child side -----------------------------------------------------------------


def _say(**fields: Any) -> None:
    os.write(1, msgspec.json.encode(fields) + b"\n")


def _job_script(rng: random.Random, calls_per_turn: int) -> list[Turn]:
    def pause() -> Delay:
        return Delay(rng.uniform(0, 0.003))

    turns = [
        Turn(Text("Working", " on it."), pause(),
             *(Call("work", {"n": i}) for i in range(calls_per_turn))),
        Turn(pause(), Call("work", {"n": 9})),
        Turn(Text("Done", "."), pause(), Text(" Bye.")),
    ]
    return turns


async def _child(job: dict[str, Any]) -> None:
    tag = job["tag"]
    rng = random.Random(job["seed"])
    hang = job["mode"] == "hang"

    @tool
    async def work(n: int) -> str:
        """Does some work."""
        _say(tag=tag, tool=n)
        if hang:
            await asyncio.Event().wait()
        await asyncio.sleep(rng.uniform(0, 0.003))
        return f"worked {n}"

    store = open_store(job["store"])
    lm = ScriptedModel(_job_script(rng, 2))
    agent = await durable.open(durable.model(lm, [work]), store=store,
                               session_id=job["session"])
    _say(tag=tag, ids=[e.id for e in agent.repaired])
    if job["mode"] == "append":
        _say(tag=tag, ready=True)
        go = Path(job["go"])
        while not go.exists():  # noqa: ASYNC110, ASYNC240  (another process creates it)
            await asyncio.sleep(0.001)
        for i in range(job["count"]):
            written = await agent.append(UserMessage.of(f"{tag} {i}"))
            _say(tag=tag, ids=[e.id for e in written])
    else:
        async for ev in agent.run("go"):
            if isinstance(ev, RunStarted | StoredMessageEnd):
                _say(tag=tag, ids=[e.id for e in ev.entries])
    await store.close()
    _say(tag=tag, done=True)


def _zygote() -> None:
    import_every_store()
    for line in sys.stdin.buffer:
        msg = msgspec.json.decode(line)
        if "reap" in msg:
            _, status = os.waitpid(msg["reap"], 0)
            _say(reaped=msg["reap"], status=status)
            continue
        job = msg["job"]
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                asyncio.run(_child(job))
            except BaseException as exc:
                _say(tag=job["tag"], error=f"{type(exc).__name__}: {exc}")
                code = 1
            os._exit(code)
        _say(tag=job["tag"], pid=pid)


# -- the test side ------------------------------------------------------------------


class Zygote:
    def __init__(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "zygote"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in = self.proc.stdin
        self._out = self.proc.stdout.fileno()
        self._buf = b""
        self.lines: dict[str, list[dict[str, Any]]] = {}
        self._reaped: dict[int, int] = {}

    def _send(self, **msg: Any) -> None:
        self._in.write(msgspec.json.encode(msg) + b"\n")
        self._in.flush()

    def _pump(self, timeout: float) -> None:
        ready, _, _ = select.select([self._out], [], [], timeout)
        if not ready:
            return
        chunk = os.read(self._out, 65536)
        if not chunk:
            raise AssertionError(f"zygote exited with {self.proc.wait()}")
        self._buf += chunk
        *complete, self._buf = self._buf.split(b"\n")
        for raw in complete:
            msg = msgspec.json.decode(raw)
            if "reaped" in msg:
                self._reaped[msg["reaped"]] = msg["status"]
            else:
                self.lines.setdefault(msg["tag"], []).append(msg)

    def wait_for(self, tag: str, key: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for msg in self.lines.get(tag, ()):
                if key in msg:
                    return msg
                if "error" in msg:
                    raise AssertionError(f"child {tag} failed: {msg['error']}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"child {tag} never said {key!r}: {self.lines.get(tag)}")
            self._pump(left)

    def wait_lines(self, tag: str, n: int, timeout: float = 20.0) -> None:
        """Until the child said ``n`` things (its pid line aside) or finished."""
        deadline = time.monotonic() + timeout
        while True:
            said = [m for m in self.lines.get(tag, ()) if "pid" not in m]
            if len(said) >= n or any("done" in m or "error" in m for m in said):
                return
            left = deadline - time.monotonic()
            assert left > 0, f"child {tag} stalled: {said}"
            self._pump(left)

    def start(self, **job: Any) -> int:
        self._send(job=job)
        return int(self.wait_for(job["tag"], "pid")["pid"])

    def reap(self, pid: int) -> int:
        self._send(reap=pid)
        deadline = time.monotonic() + 20
        while pid not in self._reaped:
            assert time.monotonic() < deadline, f"pid {pid} never reaped"
            self._pump(deadline - time.monotonic())
        return self._reaped.pop(pid)

    def reported(self, tag: str) -> list[str]:
        """Entry ids the child reported, each once, in order."""
        out: dict[str, None] = {}
        for msg in self.lines.get(tag, ()):
            assert "error" not in msg, f"child {tag} failed: {msg['error']}"
            out.update(dict.fromkeys(msg.get("ids", ())))
        return list(out)

    def finished(self, tag: str) -> bool:
        return any("done" in m for m in self.lines.get(tag, ()))

    def close(self) -> None:
        self._in.close()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    z = Zygote()
    yield z
    z.close()


def assert_calls_answered(path: list[Entry]) -> None:
    msgs = [e.message for e in path if isinstance(e, MessageEntry)]
    i = 0
    while i < len(msgs):
        m = msgs[i]
        i += 1
        assert not isinstance(m, ToolResultMessage), f"stray result at {i - 1}"
        calls = getattr(m, "tool_calls", ())
        pending = {c.id for c in calls}
        while pending:
            r = msgs[i] if i < len(msgs) else None
            assert isinstance(r, ToolResultMessage) and r.tool_call_id in pending, (
                f"message {i}: calls {sorted(pending)} unanswered"
            )
            pending.discard(r.tool_call_id)
            i += 1


async def _load(url: str, session: str) -> list[Entry]:
    store = open_store(url)
    try:
        return await store.load_entries(session)
    except SessionNotFound:  # killed before the session was created
        return []
    finally:
        await store.close()


async def _open(url: str, session: str) -> tuple[list[Entry], list[Entry], list[Entry]]:
    """Open with repair; (all entries, active path, what repair appended)."""
    store = open_store(url)
    try:
        agent = await durable.open(None, store=store, session_id=session)
        return agent.entries, agent.path(), list(agent.repaired)
    finally:
        await store.close()


STORES = ["file", "sqlite"]


def _url(kind: str, tmp: Path) -> str:
    return f"file://{tmp}/sessions" if kind == "file" else f"sqlite:///{tmp}/sessions.db"


@pytest.mark.timeout(120)
def test_s11_receipts_survive_100_random_kills(zygote: Zygote, tmp_path: Path) -> None:
    url = _url("file", tmp_path)
    rng = random.Random(1234)
    killed_mid_run = repaired_by_test = repaired_by_child = 0
    for i in range(100):
        session = f"s{i % 10}"
        tag = f"k{i}"
        pid = zygote.start(tag=tag, mode="random", store=url, session=session, seed=i)
        # Kill somewhere after the child's n-th report (a run says about 13
        # things), plus a little: every stage of a run gets hit.
        zygote.wait_lines(tag, rng.randint(0, 13))
        time.sleep(rng.uniform(0, 0.004))
        os.kill(pid, signal.SIGKILL)
        zygote.reap(pid)
        killed_mid_run += not zygote.finished(tag)
        reported = zygote.reported(tag)
        first = next((m for m in zygote.lines.get(tag, ()) if "ids" in m), None)
        repaired_by_child += bool(first and first["ids"])
        if i % 2:
            # Check without writing, so the next child may have to repair (and
            # may itself be killed while doing it).
            entries = asyncio.run(_load(url, session))
            tree = TreeIndex(entries)
            fixes = orphaned_results(tree.path())
            path = tree.path()
            context = build_context(path)
            if fixes:
                assert {f.tool_call_id for f in fixes} <= {
                    c.id for m in context for c in getattr(m, "tool_calls", ())
                }
        else:
            entries, path, repaired = asyncio.run(_open(url, session))
            repaired_by_test += bool(repaired)
            assert_calls_answered(path)
            context = build_context(path)
        missing = set(reported) - {e.id for e in entries}
        assert not missing, f"kill {i}: reported but not stored: {missing}"
        assert_valid_for_providers(context)
    # The kills landed mid-run and left work for repair, or the test proved little.
    assert killed_mid_run >= 50, killed_mid_run
    assert repaired_by_test + repaired_by_child >= 5, (repaired_by_test, repaired_by_child)
    for s in range(10):
        _, path, _ = asyncio.run(_open(url, f"s{s}"))
        assert_calls_answered(path)


@pytest.mark.parametrize("kind", STORES)
def test_s12_kill_mid_tool_is_repaired_by_appending(
    zygote: Zygote, tmp_path: Path, kind: str
) -> None:
    url = _url(kind, tmp_path)
    tag = f"hang-{kind}"
    pid = zygote.start(tag=tag, mode="hang", store=url, session="s12", seed=7)
    zygote.wait_for(tag, "tool")
    os.kill(pid, signal.SIGKILL)
    assert zygote.reap(pid) == signal.SIGKILL
    reported = zygote.reported(tag)
    before = asyncio.run(_load(url, "s12"))
    assert [e.id for e in before] == reported  # user message, assistant with two calls
    assert len(before) == 2
    file = tmp_path / "sessions" / "s12.jsonl"
    before_bytes = file.read_bytes() if kind == "file" else b""

    entries, path, repaired = asyncio.run(_open(url, "s12"))
    assert len(repaired) == 2  # the first turn's two calls
    for fix in repaired:
        assert isinstance(fix, MessageEntry) and isinstance(fix.message, ToolResultMessage)
        assert fix.message.synthesized == "interrupted"
    assert entries[: len(before)] == before  # appended, never rewritten
    assert_calls_answered(path)
    assert_valid_for_providers(build_context(path))
    if kind == "file":
        after_bytes = file.read_bytes()
        assert after_bytes.startswith(before_bytes) and after_bytes != before_bytes
    again_entries, _, again_repaired = asyncio.run(_open(url, "s12"))
    assert again_repaired == [] and again_entries == entries
    if kind == "file":
        assert file.read_bytes() == after_bytes


@pytest.mark.parametrize("kind", STORES)
def test_s4_two_processes_append_from_their_own_leaves(
    zygote: Zygote, tmp_path: Path, kind: str
) -> None:
    url = _url(kind, tmp_path)

    async def seed() -> str:
        store = open_store(url)
        agent = await durable.open(None, store=store, session_id="s4")
        (root,) = await agent.append(UserMessage.of("start"))
        await store.close()
        return root.id

    root_id = asyncio.run(seed())
    go = tmp_path / "go"
    tags = [f"p{n}-{kind}" for n in (1, 2)]
    pids = [zygote.start(tag=t, mode="append", store=url, session="s4", seed=0,
                         go=str(go), count=20) for t in tags]
    for t in tags:
        zygote.wait_for(t, "ready")  # both loaded the same leaf
    go.touch()
    for t, pid in zip(tags, pids, strict=True):
        zygote.wait_for(t, "done")
        assert zygote.reap(pid) == 0
    chains = [zygote.reported(t) for t in tags]
    entries, path, _ = asyncio.run(_open(url, "s4"))
    by_id = {e.id: e for e in entries}
    assert len(entries) == 41
    for chain in chains:
        assert len(chain) == 20
        assert by_id[chain[0]].parent_id == root_id
        for prev, nxt in itertools.pairwise(chain):
            assert by_id[nxt].parent_id == prev
    assert path[-1].id == entries[-1].id  # leaf = last appended
    assert path[-1].id in {chains[0][-1], chains[1][-1]}


if __name__ == "__main__" and sys.argv[1:] == ["zygote"]:
    _zygote()
