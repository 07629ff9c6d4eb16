"""threadline side by side with LangGraph checkpointers and OpenAI Agents SDK sessions.

Every system stores the same conversations: N messages (alternating user and
assistant) of 400 characters of base64 of random bytes, so compression
flatters nobody. Per system and N it measures bytes stored over raw payload
bytes, append latency p50/p99, a cold load (new connection, fresh objects),
the time to produce the model context after one more append and, for
threadline, a fork at N/2.

The peers live in their own environment, never in threadline's dependencies:

    python3 -m venv bench/.venv
    bench/.venv/bin/pip install -e '.[postgres]' -r bench/requirements-peers.txt
    bench/.venv/bin/python bench/peers.py            # full run
    bench/.venv/bin/python bench/peers.py --quick    # N = 50, 100, 200

It writes bench/results/peers.json and docs/img/peers-*.png; ``--markdown``
also prints the tables as Markdown for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, TypedDict

import msgspec
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "peers.json"
IMG = ROOT / "docs" / "img"
FULL_NS = (50, 100, 200, 400, 800)
QUICK_NS = (50, 100, 200)
PAYLOAD_CHARS = 400
SESSION = "bench"
DEFAULT_PG = os.environ.get("THREADLINE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
PG_DATABASE = "threadline_peers"
PEER_PACKAGES = (
    "langgraph", "langgraph-checkpoint", "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres", "openai-agents", "psycopg", "msgspec", "matplotlib",
)


def make_payloads(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [base64.b64encode(rng.randbytes(PAYLOAD_CHARS * 3 // 4)).decode() for _ in range(count)]


def is_user(index: int) -> bool:
    return index % 2 == 0


# --------------------------------------------------------------------------- storage helpers


def sqlite_bytes(path: Path) -> int:
    """Size of a SQLite database once its WAL is folded into the main file."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


@dataclass
class Postgres:
    admin_url: str
    url: str = ""

    def prepare(self) -> None:
        """Create the benchmark database next to ``test`` so nothing else shares it."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (PG_DATABASE,)
            ).fetchone()
            if not exists:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(PG_DATABASE)))
        self.url = psycopg.conninfo.make_conninfo(self.admin_url, dbname=PG_DATABASE)

    def version(self) -> str:
        with psycopg.connect(self.url) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"

    def reset_schema(self, schema: str, *, create: bool = True) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
            if create:
                conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))

    def schema_bytes(self, schema: str) -> int:
        """Heap + TOAST + indexes of every table in ``schema``, after VACUUM."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            tables = [r[0] for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,)
            )]
            for t in tables:
                conn.execute(sql.SQL("VACUUM {}").format(sql.Identifier(schema, t)))
            row = conn.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = %s AND c.relkind = 'r'",
                (schema,),
            ).fetchone()
        return int(row[0]) if row else 0


# --------------------------------------------------------------------------- adapters


@dataclass
class Timed:
    seconds: float
    texts: list[str]


class Adapter:
    """One system storing one conversation at a time.

    ``step`` is how many messages one store call carries: 1 for every system
    except LangGraph's ``invoke`` per user turn, which stores a user message
    and the node's reply together.
    """

    name = ""
    label = ""
    step = 1
    threadline = False
    workdir: Path

    async def open(self, n: int) -> None:
        raise NotImplementedError

    async def append(self, texts: Sequence[str], start: int) -> None:
        raise NotImplementedError

    async def stored_bytes(self) -> int | None:
        raise NotImplementedError

    async def cold_load(self) -> Timed:
        raise NotImplementedError

    async def context_after_append(self, texts: Sequence[str], start: int) -> Timed:
        raise NotImplementedError

    async def fork(self, at: int) -> float:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class LangGraphAdapter(Adapter):
    def __init__(self, backend: str, mode: str, workdir: Path, pg: Postgres | None) -> None:
        self.backend, self.mode, self.workdir, self.pg = backend, mode, workdir, pg
        self.name = f"langgraph-{backend}-{mode}"
        saver = "SqliteSaver" if backend == "sqlite" else "PostgresSaver"
        how = "update_state per message" if mode == "update" else "invoke per turn, sync"
        self.label = f"LangGraph {saver}, {how}"
        self.step = 1 if mode == "update" else 2
        self.config: Any = {"configurable": {"thread_id": SESSION}}
        self._conns: list[Any] = []
        self._reply = ""
        self._seen: tuple[float, list[str]] = (0.0, [])

    def _graph(self, saver: Any) -> Any:
        from langchain_core.messages import AIMessage, AnyMessage
        from langgraph.graph import END, START, StateGraph
        from langgraph.graph.message import add_messages

        # Functional form: under postponed annotations the class form's hints would be
        # strings naming these local imports, which LangGraph cannot resolve.
        state_type = TypedDict(  # noqa: UP013
            "State", {"messages": Annotated[list[AnyMessage], add_messages]}
        )

        def chat(state: dict[str, Any]) -> dict[str, Any]:
            # The moment the model call would start: the context is in hand.
            self._seen = (time.perf_counter(), [str(m.content) for m in state["messages"]])
            return {"messages": [AIMessage(content=self._reply)]}

        g = StateGraph(state_type)
        g.add_node("chat", chat)
        g.add_edge(START, "chat")
        g.add_edge("chat", END)
        return g.compile(checkpointer=saver)

    def _connect(self) -> Any:
        if self.backend == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn = sqlite3.connect(self.path, check_same_thread=False)
            self._conns.append(conn)
            return SqliteSaver(conn)
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        assert self.pg is not None
        pconn = psycopg.Connection.connect(
            self.pg.url, autocommit=True, prepare_threshold=0, row_factory=dict_row,
            options=f"-c search_path={self.schema}",
        )
        self._conns.append(pconn)
        return PostgresSaver(pconn)

    async def open(self, n: int) -> None:
        self.path = self.workdir / f"{self.name}-{n}.sqlite"
        self.schema = f"{self.name}-{n}".replace("-", "_")
        if self.pg is not None and self.backend == "postgres":
            self.pg.reset_schema(self.schema)
        saver = self._connect()
        saver.setup()
        self.graph = self._graph(saver)

    def _message(self, text: str, index: int) -> Any:
        from langchain_core.messages import AIMessage, HumanMessage

        return HumanMessage(content=text) if is_user(index) else AIMessage(content=text)

    async def append(self, texts: Sequence[str], start: int) -> None:
        if self.mode == "update":
            self.graph.update_state(
                self.config, {"messages": [self._message(texts[0], start)]}, as_node="chat"
            )
        else:
            self._reply = texts[1]
            self.graph.invoke(
                {"messages": [self._message(texts[0], start)]}, self.config, durability="sync"
            )

    async def stored_bytes(self) -> int:
        if self.backend == "sqlite":
            return sqlite_bytes(self.path)
        assert self.pg is not None
        return self.pg.schema_bytes(self.schema)

    async def cold_load(self) -> Timed:
        t0 = time.perf_counter()
        saver = self._connect()
        t1 = time.perf_counter()
        graph = self._graph(saver)  # building the graph is not storage work
        t2 = time.perf_counter()
        state = graph.get_state(self.config)
        texts = [str(m.content) for m in state.values["messages"]]
        return Timed(t1 - t0 + time.perf_counter() - t2, texts)

    async def context_after_append(self, texts: Sequence[str], start: int) -> Timed:
        if self.mode == "update":
            t0 = time.perf_counter()
            await self.append(texts, start)
            state = self.graph.get_state(self.config)
            got = [str(m.content) for m in state.values["messages"]]
            return Timed(time.perf_counter() - t0, got)
        t0 = time.perf_counter()
        await self.append(texts, start)
        seen_at, got = self._seen
        return Timed(seen_at - t0, got)

    async def close(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns.clear()
        if self.pg is not None and self.backend == "postgres":
            self.pg.reset_schema(self.schema, create=False)


class AgentsAdapter(Adapter):
    name = "openai-agents-sqlite"
    label = "OpenAI Agents SDK SQLiteSession, add_items per message"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self._sessions: list[Any] = []

    def _session(self) -> Any:
        from agents import SQLiteSession

        s = SQLiteSession(SESSION, self.path)
        self._sessions.append(s)
        return s

    async def open(self, n: int) -> None:
        self.path = self.workdir / f"{self.name}-{n}.sqlite"
        self.session = self._session()

    @staticmethod
    def _item(text: str, index: int) -> dict[str, Any]:
        return {"role": "user" if is_user(index) else "assistant", "content": text}

    async def append(self, texts: Sequence[str], start: int) -> None:
        await self.session.add_items([self._item(texts[0], start)])

    async def stored_bytes(self) -> int:
        for s in self._sessions:
            s.close()
        self._sessions.clear()
        size = sqlite_bytes(self.path)
        self.session = self._session()
        return size

    async def cold_load(self) -> Timed:
        t0 = time.perf_counter()
        items = await self._session().get_items()
        return Timed(time.perf_counter() - t0, [i["content"] for i in items])

    async def context_after_append(self, texts: Sequence[str], start: int) -> Timed:
        t0 = time.perf_counter()
        await self.append(texts, start)
        items = await self.session.get_items()
        return Timed(time.perf_counter() - t0, [i["content"] for i in items])

    async def close(self) -> None:
        for s in self._sessions:
            s.close()
        self._sessions.clear()


THREADLINE_STORES = {
    "memory": ("threadline.session._memory", "threadline MemoryStore"),
    "file": ("threadline.session._file", "threadline FileStore, fsync"),
    "sqlite": ("threadline.session._sqlite", "threadline SQLiteStore, synchronous=FULL"),
    "postgres": ("threadline.session._postgres", "threadline PostgresStore"),
}


def threadline_available(kind: str) -> bool:
    try:
        return importlib.util.find_spec(THREADLINE_STORES[kind][0]) is not None
    except ImportError:  # the package itself does not import yet
        return False


class _StoreAgent:
    """The part of ``threadline.durable.DurableAgent`` this benchmark uses, on the bare
    Store API: the stand-in while ``threadline.durable`` does not import."""

    def __init__(self, store: Any, session_id: str, entries: Sequence[Any]) -> None:
        from threadline.session import TreeIndex

        self.store, self.session_id = store, session_id
        self.tree = TreeIndex(entries, session_id=session_id)

    @classmethod
    async def open(cls, store: Any, session_id: str) -> _StoreAgent:
        from threadline.errors import SessionNotFound
        from threadline.session import SessionRecord

        try:
            entries = await store.load_entries(session_id)
        except SessionNotFound:
            await store.create_session(SessionRecord(id=session_id))
            entries = []
        return cls(store, session_id, entries)

    async def append(self, message: Any) -> None:
        from threadline.session import MessageEntry

        entry = MessageEntry(parent_id=self.tree.leaf_id, message=message)
        await self.store.append_entries(self.session_id, [entry])
        self.tree.add(entry)

    def path(self) -> list[Any]:
        return self.tree.path()

    def messages(self) -> list[Any]:
        from threadline.session import build_context

        return build_context(self.tree.path())

    def branch(self, entry_id: str) -> None:
        self.tree.set_leaf(entry_id)

    async def fork(self, session_id: str) -> None:
        from threadline.session import SessionRecord, new_id

        copies, parent = [], None
        for entry in self.tree.path():
            copy = msgspec.structs.replace(entry, id=new_id(), parent_id=parent,
                                           origin_id=entry.id)
            copies.append(copy)
            parent = copy.id
        await self.store.create_session(SessionRecord(id=session_id, parent_id=self.session_id))
        await self.store.append_entries(session_id, copies)


def durable_available() -> bool:
    try:
        import threadline.durable  # noqa: F401
    except ImportError:
        return False
    return True


class ThreadlineAdapter(Adapter):
    """threadline as an application uses it: a durable agent over a store.

    ``threadline.durable`` when it imports (``via = "durable"``), else the
    same calls on the bare Store API (``via = "store"``).
    """

    threadline = True

    def __init__(self, kind: str, workdir: Path, pg: Postgres | None) -> None:
        self.kind, self.workdir, self.pg = kind, workdir, pg
        self.name = f"threadline-{kind}"
        self.via = "durable" if durable_available() else "store"
        self.label = f"{THREADLINE_STORES[kind][1]} (via {self.via})"
        self._stores: list[Any] = []

    async def _store(self) -> Any:
        from threadline import session as ts

        store: Any
        if self.kind == "memory":
            store = ts.MemoryStore()
        elif self.kind == "file":
            store = ts.FileStore(self.root, durability="fsync")
        elif self.kind == "sqlite":
            store = ts.SQLiteStore(self.root / "threadline.sqlite")
        else:
            assert self.pg is not None
            store = ts.PostgresStore(self.pg.url, schema=self.schema)
        self._stores.append(store)
        return store

    async def _agent(self, store: Any) -> Any:
        if self.via == "durable":
            from threadline import durable

            return await durable.open(None, store=store, session_id=SESSION)
        return await _StoreAgent.open(store, SESSION)

    async def open(self, n: int) -> None:
        self.root = self.workdir / f"{self.name}-{n}"
        self.root.mkdir()
        self.schema = f"{self.name}-{n}".replace("-", "_")
        if self.pg is not None and self.kind == "postgres":
            self.pg.reset_schema(self.schema, create=False)
        self.store = await self._store()
        self.agent = await self._agent(self.store)

    @staticmethod
    def _message(text: str, index: int) -> Any:
        from threadline.ai import AssistantMessage, TextPart, UserMessage

        if is_user(index):
            return UserMessage.of(text)
        return AssistantMessage(content=(TextPart(text=text),))

    async def append(self, texts: Sequence[str], start: int) -> None:
        await self.agent.append(self._message(texts[0], start))

    async def stored_bytes(self) -> int | None:
        if self.kind == "memory":
            return None
        if self.kind == "file":
            return tree_bytes(self.root)
        if self.kind == "sqlite":
            return sqlite_bytes(self.root / "threadline.sqlite")
        assert self.pg is not None
        return self.pg.schema_bytes(self.schema)

    async def cold_load(self) -> Timed:
        t0 = time.perf_counter()
        # Memory keeps nothing across processes: its "cold" load is a warm one.
        store = self.store if self.kind == "memory" else await self._store()
        agent = await self._agent(store)
        messages = agent.messages()
        return Timed(time.perf_counter() - t0, [m.text for m in messages])

    async def context_after_append(self, texts: Sequence[str], start: int) -> Timed:
        # The agent holds its tree: the append is the only I/O.
        t0 = time.perf_counter()
        await self.append(texts, start)
        messages = self.agent.messages()
        return Timed(time.perf_counter() - t0, [m.text for m in messages])

    async def fork(self, at: int) -> float:
        """Fork the active path cut at its ``at``-th entry into a child session."""
        self.agent.branch(self.agent.path()[at - 1].id)
        t0 = time.perf_counter()
        await self.agent.fork(f"{SESSION}-fork")
        return time.perf_counter() - t0

    async def close(self) -> None:
        for store in self._stores:
            closer = getattr(store, "close", None)
            if closer is not None:
                await closer()
        self._stores.clear()
        if self.pg is not None and self.kind == "postgres":
            self.pg.reset_schema(self.schema, create=False)


# --------------------------------------------------------------------------- measurement


@dataclass
class Point:
    n: int
    payload_bytes: int
    stored_bytes: int | None
    append_ms: list[float] = field(default_factory=list)
    cold_load_ms: float = 0.0
    context_ms: float = 0.0
    fork_ms: float | None = None
    fork_bytes: int | None = None
    fork_payload_bytes: int | None = None



def summarize(reps: Sequence[Point]) -> dict[str, Any]:
    """Pool the repetitions of one (system, N): append samples are concatenated,
    one-shot timings take the median, sizes the last run (they barely vary)."""

    def med(values: list[float | None]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    last = reps[-1]
    lat = sorted(ms for p in reps for ms in p.append_ms)
    return {
        "n": last.n,
        "repeats": len(reps),
        "payload_bytes": last.payload_bytes,
        "stored_bytes": last.stored_bytes,
        "bytes_ratio": None if last.stored_bytes is None
        else last.stored_bytes / last.payload_bytes,
        "append_calls": len(lat),
        "append_p50_ms": statistics.median(lat),
        "append_p99_ms": percentile(lat, 0.99),
        "append_total_ms": sum(lat) / len(reps),
        "cold_load_ms": med([p.cold_load_ms for p in reps]),
        "context_ms": med([p.context_ms for p in reps]),
        "fork_ms": med([p.fork_ms for p in reps]),
        "fork_bytes": last.fork_bytes,
        "fork_payload_bytes": last.fork_payload_bytes,
    }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: with 25 samples p99 is the slowest one."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def expect(what: str, got: list[str], want: Sequence[str]) -> None:
    if got != list(want):
        raise SystemExit(f"{what}: read back {len(got)} messages, expected {len(want)} (mismatch)")


async def measure(adapter: Adapter, n: int, texts: Sequence[str]) -> Point:
    await adapter.open(n)
    try:
        point = Point(n=n, payload_bytes=sum(len(t.encode()) for t in texts[:n]), stored_bytes=None)
        gc.collect()
        for start in range(0, n, adapter.step):
            chunk = texts[start:start + adapter.step]
            t0 = time.perf_counter()
            await adapter.append(chunk, start)
            point.append_ms.append((time.perf_counter() - t0) * 1000)
        point.stored_bytes = await adapter.stored_bytes()
        loaded = await adapter.cold_load()
        expect(f"{adapter.name} N={n} cold load", loaded.texts, texts[:n])
        point.cold_load_ms = loaded.seconds * 1000
        more = texts[n:n + adapter.step]
        ctx = await adapter.context_after_append(more, n)
        # LangGraph's node sees the user message but not yet its own reply.
        expect(f"{adapter.name} N={n} context", ctx.texts, texts[:n + 1])
        point.context_ms = ctx.seconds * 1000
        if adapter.threadline:
            before = await adapter.stored_bytes()
            point.fork_ms = await adapter.fork(n // 2) * 1000
            after = await adapter.stored_bytes()
            if before is not None and after is not None:
                point.fork_bytes = after - before
            point.fork_payload_bytes = sum(len(t.encode()) for t in texts[:n // 2])
        return point
    finally:
        await adapter.close()
        shutil.rmtree(adapter.workdir)
        adapter.workdir.mkdir()


def slope(ns: Sequence[int], values: Sequence[float | None]) -> float | None:
    """Least-squares slope of log(value) against log(N): 1 is linear, 2 quadratic."""
    pairs = [(math.log(n), math.log(v)) for n, v in zip(ns, values, strict=True) if v]
    if len(pairs) < 2:
        return None
    mx = statistics.fmean(p[0] for p in pairs)
    my = statistics.fmean(p[1] for p in pairs)
    den = sum((x - mx) ** 2 for x, _ in pairs)
    return sum((x - mx) * (y - my) for x, y in pairs) / den


def marginal(points: Sequence[dict[str, Any]]) -> float | None:
    """Bytes added per payload byte between the two largest N: fixed overhead cancels out."""
    if len(points) < 2 or points[-1]["stored_bytes"] is None:
        return None
    a, b = points[-2], points[-1]
    return (b["stored_bytes"] - a["stored_bytes"]) / (b["payload_bytes"] - a["payload_bytes"])


def machine(pg: Postgres | None) -> dict[str, Any]:
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    versions = {}
    for pkg in PEER_PACKAGES:
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "ram_gib": round(mem_kb / 2**20, 1),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "postgresql": pg.version() if pg else None,
        "platform": platform.platform(),
        "loadavg_at_start": os.getloadavg(),
        "versions": versions,
    }


def build_adapters(
    names: Sequence[str] | None, workdir: Path, pg: Postgres | None, missing: list[str]
) -> list[Adapter]:
    adapters: list[Adapter] = []
    for backend in ("sqlite", "postgres"):
        if backend == "postgres" and pg is None:
            continue
        for mode in ("update", "invoke"):
            adapters.append(LangGraphAdapter(backend, mode, workdir, pg))
    adapters.append(AgentsAdapter(workdir))
    for kind in THREADLINE_STORES:
        if kind == "postgres" and pg is None:
            continue
        if not threadline_available(kind):
            print(f"skipping threadline-{kind}: {THREADLINE_STORES[kind][0]} does not import",
                  file=sys.stderr)
            missing.append(f"threadline-{kind}")
            continue
        adapters.append(ThreadlineAdapter(kind, workdir, pg))
    if names:
        adapters = [a for a in adapters if any(s in a.name for s in names)]
    for a in adapters:  # each its own directory, emptied after every measurement
        a.workdir = workdir / a.name
        a.workdir.mkdir()
    return adapters


# --------------------------------------------------------------------------- output


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    ns = report["ns"]
    systems = report["systems"]
    out: list[tuple[str, list[str], list[list[str]]]] = []

    def by_n(title: str, key: str, *extra: tuple[str, str],
             only: Callable[[dict[str, Any]], bool] = lambda s: True) -> None:
        header = ["system", *[f"N={n}" for n in ns], *[h for h, _ in extra]]
        rows = []
        for s in systems:
            if not only(s):
                continue
            pts = {p["n"]: p for p in s["points"]}
            row = [s["name"], *[fmt(pts[n][key]) if n in pts else "-" for n in ns]]
            row += [fmt(s[k]) for _, k in extra]
            rows.append(row)
        out.append((title, header, rows))

    by_n("Bytes stored / raw payload bytes (slope: log-log of bytes vs N; marginal: bytes"
         " added per payload byte between the two largest N)",
         "bytes_ratio", ("slope", "bytes_slope"), ("marginal", "marginal_ratio"))
    by_n("Append latency p50, ms per store call (slope: log-log vs N)",
         "append_p50_ms", ("slope", "append_p50_slope"))
    by_n("Append latency p99, ms per store call", "append_p99_ms")
    by_n("Cold load of the whole conversation, ms (new connection)", "cold_load_ms")
    by_n("Model context after one more append, ms", "context_ms")
    by_n("threadline fork at N/2, ms", "fork_ms", only=lambda s: s["threadline"])

    header = ["system", *[f"N={n}" for n in ns]]
    rows = []
    for s in systems:
        if not s["threadline"] or s["name"].endswith("memory"):
            continue
        pts = {p["n"]: p for p in s["points"]}
        rows.append([s["name"], *[
            "-" if n not in pts or pts[n]["fork_bytes"] is None
            else f"{pts[n]['fork_bytes']:,} "
            f"({pts[n]['fork_bytes'] / pts[n]['fork_payload_bytes']:.2f}x)"
            for n in ns
        ]])
    out.append(("threadline fork at N/2: bytes added (x payload of the copied half)", header, rows))
    return out


WIN_METRICS = {
    "bytes_ratio": "bytes stored",
    "append_p50_ms": "append p50",
    "append_p99_ms": "append p99",
    "cold_load_ms": "cold load",
    "context_ms": "context after append",
}


def peer_wins(report: dict[str, Any]) -> list[str]:
    """Every cell where a peer beats threadline's store on the same backend."""
    systems = {s["name"]: s for s in report["systems"]}
    out = []
    for s in report["systems"]:
        if s["threadline"]:
            continue
        backend = "postgres" if "postgres" in s["name"] else "sqlite"
        ours = systems.get(f"threadline-{backend}")
        if ours is None:
            continue
        mine = {p["n"]: p for p in ours["points"]}
        for key, what in WIN_METRICS.items():
            wins = [
                f"N={p['n']} ({fmt(p[key])} vs {fmt(mine[p['n']][key])})"
                for p in s["points"]
                if p[key] is not None and mine[p["n"]][key] is not None
                and p[key] < mine[p["n"]][key]
            ]
            if wins:
                out.append(f"{s['name']} beats {ours['name']} on {what} at " + ", ".join(wins))
    return out


def print_rich(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for title, header, rows in tables(report):
        table = Table(title=title, title_justify="left")
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for line in peer_wins(report):
        console.print(f"[yellow]peer wins:[/] {line}")


def markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    parts = [
        f"Machine: {m['nproc']} CPUs ({m['cpu']}), {m['ram_gib']} GiB RAM, Python {m['python']},"
        f" SQLite {m['sqlite']}, PostgreSQL {m['postgresql']}; load average"
        f" {m['loadavg_at_start'][0]:.2f} at start, {m['loadavg_at_end'][0]:.2f} at end;"
        f" {report['repeat']} repetition(s), {report['wall_seconds']:.0f} s.",
        f"Versions: {versions}.",
    ]
    if report["missing"]:
        parts.append("Not measured (store missing): " + ", ".join(report["missing"]) + ".")
    for title, header, rows in tables(report):
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |",
                 "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        parts.append("\n".join(lines))
    wins = peer_wins(report)
    parts.append("**Where a peer wins** (against threadline's store on the same backend):\n\n"
                 + ("\n".join(f"- {w}" for w in wins) if wins else "- nowhere"))
    return "\n\n".join(parts) + "\n"


# One look per system in every figure: peers dashed, threadline solid.
STYLE = {
    "langgraph-sqlite-update": ("tab:orange", "o"),
    "langgraph-sqlite-invoke": ("tab:brown", "s"),
    "langgraph-postgres-update": ("tab:red", "D"),
    "langgraph-postgres-invoke": ("tab:pink", "^"),
    "openai-agents-sqlite": ("tab:olive", "v"),
    "threadline-memory": ("tab:gray", "x"),
    "threadline-file": ("tab:blue", "o"),
    "threadline-sqlite": ("tab:cyan", "s"),
    "threadline-postgres": ("tab:purple", "D"),
}


def plot(report: dict[str, Any]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    ns = report["ns"]

    def draw(ax: Any, key: str, ylabel: str, title: str) -> None:
        for s in report["systems"]:
            pts = [p for p in s["points"] if p[key]]
            if not pts:
                continue
            color, marker = STYLE.get(s["name"], ("black", "."))
            ax.plot([p["n"] for p in pts], [p[key] for p in pts],
                    "-" if s["threadline"] else "--", marker=marker, color=color,
                    label=s["name"] + (" (per turn)" if s["messages_per_append"] > 1 else ""))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.minorticks_off()
        ax.set_xlabel("messages in the conversation (N)")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="major", alpha=0.3)

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=110)
    draw(ax, "stored_bytes", "bytes stored", "Bytes stored vs N (log-log)")
    ax.plot(ns, [n * PAYLOAD_CHARS for n in ns], color="black", lw=1, alpha=0.6,
            label="raw payload")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    bytes_png = IMG / "peers-bytes.png"
    fig.savefig(bytes_png)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.5), dpi=110, sharey=True)
    draw(left, "append_p50_ms", "ms per append call", "Append latency p50 vs N")
    draw(right, "append_p99_ms", "", "Append latency p99 vs N")
    right.yaxis.set_tick_params(labelleft=True)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=5, frameon=False)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    append_png = IMG / "peers-append.png"
    fig.savefig(append_png)
    plt.close(fig)
    return [bytes_png, append_png]


# --------------------------------------------------------------------------- main


async def run(args: argparse.Namespace) -> dict[str, Any]:
    ns = QUICK_NS if args.quick else FULL_NS
    if args.n:
        ns = tuple(args.n)
    texts = make_payloads(max(ns) + 2)
    pg: Postgres | None = None
    if not args.no_postgres:
        pg = Postgres(args.pg_url)
        pg.prepare()
    workdir = Path(tempfile.mkdtemp(prefix="threadline-peers-", dir=args.workdir))
    try:
        missing: list[str] = []
        adapters = build_adapters(args.systems, workdir, pg, missing)
        report: dict[str, Any] = {
            "ns": list(ns), "payload_chars": PAYLOAD_CHARS, "quick": args.quick,
            "repeat": args.repeat,
            "machine": machine(pg), "systems": [], "missing": missing,
        }
        started = time.perf_counter()
        for adapter in list(adapters):
            try:  # warm-up: imports, first connections, prepared statements
                await measure(adapter, 10, texts)
            except NotImplementedError as exc:  # a store module still being written
                print(f"skipping {adapter.name}: {exc}", file=sys.stderr)
                missing.append(adapter.name)
                adapters.remove(adapter)
        reps: dict[tuple[str, int], list[Point]] = {}
        # Systems take turns at each N, so background load hits them alike.
        for rep in range(args.repeat):
            for n in ns:
                for adapter in adapters:
                    t0 = time.perf_counter()
                    reps.setdefault((adapter.name, n), []).append(
                        await measure(adapter, n, texts)
                    )
                    print(f"rep {rep + 1}/{args.repeat} {adapter.name:28} N={n:<4}"
                          f" {time.perf_counter() - t0:6.1f}s", file=sys.stderr, flush=True)
        for adapter in adapters:
            points = [summarize(reps[adapter.name, n]) for n in ns]
            report["systems"].append({
                "name": adapter.name,
                "label": adapter.label,
                "messages_per_append": adapter.step,
                "threadline": adapter.threadline,
                "points": points,
                "bytes_slope": slope(ns, [p["stored_bytes"] for p in points]),
                "append_p50_slope": slope(ns, [p["append_p50_ms"] for p in points]),
                "marginal_ratio": marginal(points),
            })
        report["wall_seconds"] = time.perf_counter() - started
        report["machine"]["loadavg_at_end"] = os.getloadavg()
        return report
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="N = 50, 100, 200 and one repetition")
    parser.add_argument("--repeat", type=int, default=None,
                        help="repetitions of each (system, N), interleaved (default 3; quick 1)")
    parser.add_argument("--n", type=int, action="append", help="conversation length (repeatable)")
    parser.add_argument("--systems", nargs="*",
                        help="only systems whose name contains one of these")
    parser.add_argument("--pg-url", default=DEFAULT_PG,
                        help="server to create the bench database on")
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--workdir", default=None, help="where the files go (default: system tmp)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="also print Markdown tables")
    args = parser.parse_args()
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    report = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print_rich(report)
    if not args.no_plots:
        for path in plot(report):
            print(f"wrote {path.relative_to(ROOT)}")
    print(f"wrote {args.out}  ({report['wall_seconds']:.0f}s)")
    if args.markdown:
        print(markdown(report))


if __name__ == "__main__":
    main()
