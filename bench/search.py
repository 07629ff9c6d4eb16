"""Search across sessions: the SQL stores' ``search`` against a bare FTS5 / GIN query.

A store of 1,000,000 entries (2,000 sessions of 500; ``--quick``: 20,000 in
200), each a chat message of 12 to 40 words drawn from a 20,000-word
vocabulary with a Zipf-like skew, so a query meets common, middling and
rare words. For SQLite and for PostgreSQL (when reachable):

- query p50: ``store.search`` of two-word queries (one middling word, one
  rarer), 20 hits, against the bare statement on the same database and the
  same terms: FTS5 ``MATCH`` ordered by ``bm25`` (SQLite), ``@@`` ordered by
  ``ts_rank`` (PostgreSQL), both returning ``LIMIT 20`` row keys through a
  plain driver connection, no join, no snippet, no event loop. Goal 1.5x.
- append: ``append_entries`` of a user message and an answer to an existing
  session of the full store, against the same append with indexing off
  (SQLite: the store's index call replaced by a no-op for that call;
  PostgreSQL: a twin schema holding the same rows, its index trigger off).
  Default durability (SQLite ``FULL``, PostgreSQL's commit). Goal 1.3x.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import sqlite3
import time
from collections.abc import Callable
from typing import Any

from bench._harness import Measured, Run, alternate, at_most, ms, pct
from bench._targets import (
    AssistantMessage,
    MessageEntry,
    PostgresStore,
    SessionRecord,
    SQLiteStore,
    TextPart,
    UserMessage,
)

NEEDS = ()
MINUTES = 25

_VOCAB = 20_000
_LIMIT = 20


def _word(n: int) -> str:
    # Pronounceable, distinct, never an English stop word of any config.
    consonants, vowels = "bcdfghklmnprstvz", "aeiou"
    out = ""
    n += 1
    while n:
        n, c = divmod(n, len(consonants))
        n, v = divmod(n, len(vowels))
        out += consonants[c] + vowels[v]
    return out


WORDS = [_word(n) for n in range(_VOCAB)]
_WEIGHTS = [1 / (k + 1) ** 0.9 for k in range(_VOCAB)]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, _WEIGHTS, k=rng.randint(12, 40)))


def _entries(rng: random.Random, n: int) -> list[MessageEntry]:
    out: list[MessageEntry] = []
    parent = None
    for k in range(n):
        message = (UserMessage(content=(TextPart(text=_text(rng)),)) if k % 2 == 0 else
                   AssistantMessage(content=(TextPart(text=_text(rng)),)))
        out.append(MessageEntry(parent_id=parent, message=message))
        parent = out[-1].id
    return out


def _queries(rng: random.Random, count: int) -> list[str]:
    """Two words each: one from the middling ranks, one rarer."""
    return [f"{WORDS[rng.randint(50, 500)]} {WORDS[rng.randint(500, 5000)]}"
            for _ in range(count)]


async def _fill(store: Any, sessions: int, per: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    ids = [f"s-{k:05d}" for k in range(sessions)]
    for start in range(0, sessions, 8):
        group = ids[start:start + 8]
        await asyncio.gather(*(store.create_session(SessionRecord(id=i)) for i in group))
        await asyncio.gather(*(store.append_entries(i, _entries(rng, per)) for i in group))
    return ids


def _appender(store: Any, ids: list[str], seed: int) -> Callable[[], Any]:
    rng = random.Random(seed)
    turn = iter(range(10**9))

    async def append() -> None:
        sid = ids[next(turn) % len(ids)]
        await store.append_entries(sid, _entries(rng, 2))

    return append


async def _in_turns(store: Any, bare: Callable[[str], object],
                   queries: list[str]) -> dict[str, list[float]]:
    """Each query through the store's ``search`` and the bare query (on a
    thread), taking turns at going first; the seconds of each, after five to warm both."""
    loop = asyncio.get_running_loop()
    for q in queries[:5]:
        await store.search(q)
        bare(q)
    timed: dict[str, list[float]] = {"store": [], "bare": []}
    for k, q in enumerate(queries):
        for name in (("store", "bare") if k % 2 == 0 else ("bare", "store")):
            t0 = time.perf_counter()
            if name == "store":
                await store.search(q)
            else:
                await loop.run_in_executor(None, bare, q)
            timed[name].append(time.perf_counter() - t0)
    return timed


def _rows(run: Run, what: str, got: dict[str, list[float]], floor: str) -> None:
    store_q = [ms(t) for t in got["store"]]
    bare_q = [ms(t) for t in got["bare"]]
    run.row(f"{what}: search p50 (2 words, {_LIMIT} hits)",
            pct(store_q, 0.5), "ms", versus=floor, versus_value=pct(bare_q, 0.5),
            goal=at_most(1.5), detail=f"p50 of {len(store_q)} queries, each run by both")


def sqlite_search(run: Run, sessions: int, per: int, turns: int) -> None:
    import threadline.stores.sqlite._store as sqlite_store

    path = run.tmp / "search.db"
    n = sessions * per
    rng = random.Random(7)
    queries = _queries(rng, run.pick(200, 40))

    async def go() -> None:
        store = SQLiteStore(path)
        ids = await _fill(store, sessions, per, 1)
        raw = sqlite3.connect(path, check_same_thread=False)

        def bare(q: str) -> None:
            match = " ".join(f'"{t}"' for t in q.split())
            raw.execute("SELECT rowid, bm25(search) FROM search WHERE search MATCH ? "
                        "ORDER BY bm25(search) LIMIT ?", (match, _LIMIT)).fetchall()

        timed = await _in_turns(store, bare, queries)
        _rows(run, f"SQLite store, {n:,} entries", timed,
              "the bare FTS5 MATCH ... ORDER BY bm25 LIMIT 20 (sqlite3, a thread)")

        indexed = _appender(store, ids, 2)
        plain = _appender(store, ids, 3)
        # The store's module-level name for its index call, swapped for one call.
        names = vars(sqlite_store)
        real = names["search_index"]

        async def without() -> Measured:
            names["search_index"] = lambda conn, texts: None
            try:
                t0 = time.perf_counter()
                await plain()
                return Measured(time.perf_counter() - t0)
            finally:
                names["search_index"] = real

        got = await alternate({"indexed": indexed, "without": without}, turns, block=1)
        run.row(f"SQLite store, {n:,} entries: append of 2 entries (synchronous=FULL)",
                ms(got.median("indexed")), "ms",
                versus="the same append with indexing off",
                versus_value=ms(got.median("without")),
                ratio=got.paired("indexed", "without"), goal=at_most(1.3),
                detail=f"median of {turns} paired turns")
        raw.close()
        await store.close()

    asyncio.run(go())


def postgres_search(run: Run, sessions: int, per: int, turns: int) -> None:
    import psycopg

    schema = f"tl_bench_search_{secrets.token_hex(4)}"
    twin = f"{schema}_plain"
    n = sessions * per
    rng = random.Random(7)
    queries = _queries(rng, run.pick(200, 40))

    async def go() -> None:
        store = PostgresStore(run.pg_url, schema=schema, max_size=4)
        plain_store = PostgresStore(run.pg_url, schema=twin, max_size=4)
        ids = await _fill(store, sessions, per, 1)
        raw = psycopg.connect(run.pg_url, autocommit=True)
        # The floor: the same rows in a twin schema whose index trigger is off
        # from the start (turning it off and on between appends would make
        # every append after it plan its statements again).
        await plain_store.create_session(SessionRecord(id="first"))
        raw.execute(f"ALTER TABLE {twin}.entries DISABLE TRIGGER search_added")
        plain_ids = await _fill(plain_store, sessions, per, 1)
        raw.execute(f"VACUUM ANALYZE {schema}.search")
        bare_sql = (f"SELECT session_id, seq FROM {schema}.search, "
                    f"plainto_tsquery('simple', %s) q WHERE tsv @@ q "
                    f"ORDER BY ts_rank(tsv, q) DESC LIMIT {_LIMIT}")

        def bare(q: str) -> None:
            raw.execute(bare_sql, (q,)).fetchall()

        timed = await _in_turns(store, bare, queries)
        _rows(run, f"PostgreSQL store, {n:,} entries", timed,
              "the bare @@ ... ORDER BY ts_rank LIMIT 20 (psycopg, a thread)")
        got = await alternate({"indexed": _appender(store, ids, 2),
                               "without": _appender(plain_store, plain_ids, 2)},
                              turns, block=1)
        run.row(f"PostgreSQL store, {n:,} entries: append of 2 entries",
                ms(got.median("indexed")), "ms",
                versus="the same append, same rows, index trigger off",
                versus_value=ms(got.median("without")),
                ratio=got.paired("indexed", "without"), goal=at_most(1.3),
                detail=f"median of {turns} paired turns")
        raw.close()
        await store.close()
        await plain_store.close()

    try:
        asyncio.run(go())
    finally:
        from bench.disk import drop_schema

        drop_schema(run.pg_url, schema)
        drop_schema(run.pg_url, twin)


def main(run: Run) -> None:
    sessions, per = run.pick((2_000, 500), (200, 100))
    turns = run.pick(101, 11)
    sqlite_search(run, sessions, per, turns)
    if run.postgres():
        postgres_search(run, sessions, per, turns)

