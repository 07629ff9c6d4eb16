"""threadline beside LangGraph's checkpointers and the OpenAI Agents SDK's sessions.

Every system stores the same conversation, 800 messages (user and assistant
in turn, each 400 characters of base64 of random bytes, so compression
flatters nobody), one store call per message (LangGraph's ``invoke`` stores
a user message and the node's reply in one call). Measured, the systems in
turns:

- append p50 and bytes stored, over 3 repetitions (bytes: SQLite after a
  WAL checkpoint, PostgreSQL tables + TOAST + indexes after VACUUM);
- cold load, many samples in rotating turns, each from new objects:
  ``threadline.durable.open`` on a new store object and the agent's
  messages, against ``SQLiteSession.get_items()`` on a new session object,
  a new ``SQLAlchemySession`` (PostgreSQL, same server) and LangGraph's
  ``get_state`` on a new connection.

threadline runs as an application uses it: a durable agent over the fsync
file store, the SQLite store (synchronous=FULL) and the PostgreSQL store.
The peers are not threadline's dependencies; they live in their own
environment (bench/requirements-peers.txt).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import secrets
import sqlite3
import statistics
import time
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict
from urllib.parse import urlsplit

from bench._harness import Measured, Run, alternate
from bench._targets import FileStore, PostgresStore, SQLiteStore, durable
from bench._workloads import payload_message, payload_texts
from bench.disk import schema_bytes, sqlite_bytes

NEEDS = ("import:agents,langgraph.checkpoint.sqlite,langgraph.checkpoint.postgres,sqlalchemy",)
MINUTES = 6
SESSION = "bench"
PEERS = ("langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres",
         "openai-agents", "sqlalchemy")


class System:
    """One system storing one conversation: ``step`` messages per store call."""

    name = ""
    backend = "sqlite"
    step = 1

    async def open(self) -> None: ...

    async def append(self, texts: Sequence[str], start: int) -> None: ...

    def stored_bytes(self) -> int:
        raise NotImplementedError

    async def cold_load(self) -> tuple[float, list[str]]:
        """Seconds to load the conversation from new objects, and its texts."""
        raise NotImplementedError

    async def close(self) -> None: ...


class LangGraph(System):
    def __init__(self, run: Run, url: str, backend: str, mode: str, tag: str) -> None:
        self.url, self.backend, self.mode = url, backend, mode
        saver = "SqliteSaver" if backend == "sqlite" else "PostgresSaver"
        how = "update_state per message" if mode == "update" else "invoke per turn"
        self.name = f"LangGraph {saver}, {how}"
        self.step = 1 if mode == "update" else 2
        self.path = run.tmp / f"lg-{backend}-{mode}-{tag}.sqlite"
        self.schema = f"lg_{backend}_{mode}_{tag}"
        self.config: Any = {"configurable": {"thread_id": SESSION}}
        self.reply = ""

    def _graph(self, saver: Any) -> Any:
        from langchain_core.messages import AIMessage, AnyMessage
        from langgraph.graph import END, START, StateGraph
        from langgraph.graph.message import add_messages

        state = TypedDict(  # noqa: UP013 (the class form cannot see these local imports)
            "State", {"messages": Annotated[list[AnyMessage], add_messages]})
        g = StateGraph(state)
        g.add_node("chat", lambda s: {"messages": [AIMessage(content=self.reply)]})
        g.add_edge(START, "chat")
        g.add_edge("chat", END)
        return g.compile(checkpointer=saver)

    def _connect(self) -> tuple[Any, Any]:
        if self.backend == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            conn: Any = sqlite3.connect(self.path, check_same_thread=False)
            return conn, SqliteSaver(conn)
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
        from psycopg.rows import dict_row

        conn = psycopg.Connection.connect(self.url, autocommit=True,
                                          prepare_threshold=0, row_factory=dict_row,
                                          options=f"-c search_path={self.schema}")
        return conn, PostgresSaver(conn)

    async def open(self) -> None:
        if self.backend == "postgres":
            _sql(self.url, f"CREATE SCHEMA {self.schema}")
        self.conn, saver = self._connect()
        saver.setup()
        self.graph = self._graph(saver)

    def _message(self, text: str, index: int) -> Any:
        from langchain_core.messages import AIMessage, HumanMessage

        return HumanMessage(content=text) if index % 2 == 0 else AIMessage(content=text)

    async def append(self, texts: Sequence[str], start: int) -> None:
        message = {"messages": [self._message(texts[0], start)]}
        if self.mode == "update":
            self.graph.update_state(self.config, message, as_node="chat")
        else:
            self.reply = texts[1]
            self.graph.invoke(message, self.config, durability="sync")

    def stored_bytes(self) -> int:
        if self.backend == "sqlite":
            return sqlite_bytes(self.path)
        return schema_bytes(self.url, self.schema)

    async def cold_load(self) -> tuple[float, list[str]]:
        t0 = time.perf_counter()
        conn, saver = self._connect()
        t1 = time.perf_counter()
        graph = self._graph(saver)  # building the graph is not storage work
        t2 = time.perf_counter()
        state = graph.get_state(self.config)
        took = t1 - t0 + time.perf_counter() - t2
        conn.close()
        return took, [str(m.content) for m in state.values["messages"]]

    async def close(self) -> None:
        self.conn.close()
        if self.backend == "postgres":
            _sql(self.url, f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


class Agents(System):
    def __init__(self, run: Run, url: str, backend: str, tag: str) -> None:
        self.url, self.backend = url, backend
        self.name = ("Agents SDK SQLiteSession" if backend == "sqlite"
                     else "Agents SDK SQLAlchemySession (psycopg)")
        self.path = run.tmp / f"agents-{tag}.sqlite"
        self.tables = {"sessions_table": f"agent_sessions_{tag}",
                       "messages_table": f"agent_messages_{tag}"}

    def _session(self) -> Any:
        if self.backend == "sqlite":
            from agents import SQLiteSession

            return SQLiteSession(SESSION, self.path)
        from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession

        url = self.url.replace("postgresql://", "postgresql+psycopg://", 1)
        return SQLAlchemySession.from_url(SESSION, url=url, create_tables=True, **self.tables)

    async def _done(self, session: Any) -> None:
        if self.backend == "sqlite":
            session.close()
        else:
            await session.engine.dispose()

    async def open(self) -> None:
        self.session = self._session()

    async def append(self, texts: Sequence[str], start: int) -> None:
        role = "user" if start % 2 == 0 else "assistant"
        await self.session.add_items([{"role": role, "content": texts[0]}])

    def stored_bytes(self) -> int:
        if self.backend == "sqlite":
            return sqlite_bytes(self.path)
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as conn:
            total = 0
            for table in self.tables.values():
                conn.execute(f"VACUUM {table}")
                row = conn.execute("SELECT pg_total_relation_size(%s)", (table,)).fetchone()
                total += int(row[0]) if row else 0
        return total

    async def cold_load(self) -> tuple[float, list[str]]:
        t0 = time.perf_counter()
        session = self._session()
        items = await session.get_items()
        took = time.perf_counter() - t0
        await self._done(session)
        return took, [i["content"] for i in items]

    async def close(self) -> None:
        await self._done(self.session)
        if self.backend == "postgres":
            for table in self.tables.values():
                _sql(self.url, f"DROP TABLE IF EXISTS {table} CASCADE")


class Threadline(System):
    def __init__(self, run: Run, url: str, backend: str, tag: str) -> None:
        self.url, self.backend = url, backend
        self.name = {"file": "threadline FileStore (fsync)",
                     "sqlite": "threadline SQLiteStore (synchronous=FULL)",
                     "postgres": "threadline PostgresStore"}[backend]
        self.root = run.tmp / f"tl-{backend}-{tag}"
        self.schema = f"tl_peers_{tag}"

    def _store(self) -> Any:
        if self.backend == "file":
            return FileStore(self.root)
        if self.backend == "sqlite":
            return SQLiteStore(self.root / "threadline.sqlite")
        return PostgresStore(self.url, schema=self.schema)

    async def open(self) -> None:
        self.root.mkdir()
        self.store = self._store()
        self.agent = await durable.open(None, store=self.store, session_id=SESSION)

    async def append(self, texts: Sequence[str], start: int) -> None:
        await self.agent.append(payload_message(texts[0], start))

    def stored_bytes(self) -> int:
        if self.backend == "file":
            return sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())
        if self.backend == "sqlite":
            return sqlite_bytes(self.root / "threadline.sqlite")
        return schema_bytes(self.url, self.schema)

    async def cold_load(self) -> tuple[float, list[str]]:
        t0 = time.perf_counter()
        store = self._store()
        agent = await durable.open(None, store=store, session_id=SESSION)
        texts = [m.text for m in agent.messages()]
        took = time.perf_counter() - t0
        await store.close()
        return took, texts

    async def close(self) -> None:
        await self.store.close()
        if self.backend == "postgres":
            _sql(self.url, f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")


def _sql(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def _peers_database(url: str) -> str:
    """A database of its own on the same server, so nothing else shares its tables."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = 'threadline_peers'"
                            ).fetchone():
            conn.execute("CREATE DATABASE threadline_peers")
    return urlsplit(url)._replace(path="/threadline_peers").geturl()


def systems(run: Run, url: str | None) -> list[System]:
    tag = secrets.token_hex(3)
    out: list[System] = [LangGraph(run, "", "sqlite", "update", tag),
                         LangGraph(run, "", "sqlite", "invoke", tag),
                         Agents(run, "", "sqlite", tag),
                         Threadline(run, "", "file", tag), Threadline(run, "", "sqlite", tag)]
    if url is not None:
        out += [LangGraph(run, url, "postgres", "update", tag),
                LangGraph(run, url, "postgres", "invoke", tag),
                Agents(run, url, "postgres", tag), Threadline(run, url, "postgres", tag)]
    return out


async def fill(system: System, texts: Sequence[str], n: int) -> list[float]:
    await system.open()
    lat = []
    for start in range(0, n, system.step):
        t0 = time.perf_counter()
        await system.append(texts[start:start + system.step], start)
        lat.append(time.perf_counter() - t0)
    return lat


def _against(run: Run, system: System, peers: list[System], metric: str, *,
             ours: float, theirs: dict[str, float], unit: str, detail: str) -> None:
    for peer in peers:
        run.row(f"{metric}: {system.name}", ours, unit, versus=peer.name,
                versus_value=theirs[peer.name], peer=True, detail=detail)


async def go(run: Run, n: int, repeat: int, samples: int) -> None:
    texts = payload_texts(n + 2)
    url = _peers_database(run.pg_url) if run.postgres() else None
    lat: dict[str, list[float]] = {}
    size: dict[str, int] = {}
    for r in range(repeat):  # the systems take turns, each first in turn
        all_ = systems(run, url)
        for system in all_[r % len(all_):] + all_[:r % len(all_)]:
            run.say(f"repetition {r + 1}: {system.name}")
            lat.setdefault(system.name, []).extend(await fill(system, texts, n))
            size[system.name] = system.stored_bytes()
            if r < repeat - 1:
                await system.close()
    kept = all_  # the last repetition's, still open: the cold loads read them

    async def load(system: System) -> Measured:
        took, got = await system.cold_load()
        if got != texts[:n]:
            raise RuntimeError(f"{system.name}: a cold load read back other messages")
        return Measured(took)

    run.say(f"cold loads, {samples} samples each")
    cold = await alternate({s.name: lambda s=s: load(s) for s in kept},  # type: ignore[misc]
                           samples)
    for system in kept:
        await system.close()
    payload = sum(len(t.encode()) for t in texts[:n])
    p50 = {name: statistics.median(v) * 1e3 for name, v in lat.items()}
    for system in kept:
        if not isinstance(system, Threadline):
            continue
        backend = "sqlite" if system.backend == "file" else system.backend
        peers = [p for p in kept if p.backend == backend and not isinstance(p, Threadline)]
        each = f"{n} messages"
        _against(run, system, peers, f"append p50 at {each}", ours=p50[system.name],
                 theirs=p50, unit="ms", detail=f"{repeat} repetitions, one store call per "
                 "message (LangGraph invoke: two)")
        _against(run, system, peers, f"bytes stored for {each}",
                 ours=size[system.name] / 1e3, theirs={k: v / 1e3 for k, v in size.items()},
                 unit="kB", detail=f"payload {payload / 1e3:.0f} kB; {system.name} "
                 f"{size[system.name] / payload:.2f}× it")
        for peer in peers:
            if isinstance(peer, LangGraph) and peer.mode == "invoke":
                continue  # the same state as update_state's, loaded the same way
            run.row(f"cold load of {each}: {system.name}", cold.median(system.name) * 1e3,
                    "ms", versus=peer.name, versus_value=cold.median(peer.name) * 1e3,
                    ratio=cold.paired(system.name, peer.name), peer=True,
                    detail=f"new objects each time; median of {samples} paired samples")


def main(run: Run) -> None:
    for dist in PEERS:
        try:
            run.uses(dist, importlib.metadata.version(dist))
        except importlib.metadata.PackageNotFoundError:
            continue
    n, repeat, samples = run.pick((800, 3, 40), (40, 1, 3))
    asyncio.run(go(run, n, repeat, samples))
