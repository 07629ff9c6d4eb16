"""Tenants in PostgreSQL: the cost of row-level security, against the same store without it.

Two schemas made by the same migrations on the same server, used by the
same role (no superuser, no ``BYPASSRLS``, so the policies apply to it):

- with: ``PostgresStore(..., tenant="acme")``: every statement sent with a
  transaction-local ``set_config`` in its pipeline, forced row-level security
  on every table;
- without: the default-tenant store on a schema whose tables have row-level
  security disabled (no ``set_config``, no policy).

In turns, each first in turn:

- append: one realistic entry per ``append_entries`` to a session of 1,000,
  the median of paired ratios; goal 1.2x; then again with the role's
  ``synchronous_commit`` off, so the WAL flush no longer hides the cost of
  the statement itself;
- load: ``load_entries`` of a session of N realistic entries, the median of
  paired ratios; goal 1.2x.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from bench._harness import Run, alternate, at_most, ms
from bench._targets import MessageEntry, PostgresStore, SessionRecord
from bench._workloads import realistic

NEEDS = ("postgres",)
MINUTES = 1


def _sql(url: str, *statements: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        for stmt in statements:
            conn.execute(stmt.encode())


def _as(url: str, role: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{role}@{parts.netloc.rsplit('@', 1)[-1]}"))


async def _fill(store: PostgresStore, sid: str, entries: list[MessageEntry]) -> None:
    await store.create_session(SessionRecord(id=sid))
    for start in range(0, len(entries), 1000):
        await store.append_entries(sid, entries[start:start + 1000])


def main(run: Run) -> None:
    token = secrets.token_hex(4)
    role, with_rls, without = f"tl_bench_role_{token}", f"tl_bench_rls_{token}", \
        f"tl_bench_plain_{token}"
    url = _as(run.pg_url, role)

    async def migrate() -> None:
        for schema in (with_rls, without):
            async with PostgresStore(run.pg_url, schema=schema, max_size=1):
                pass

    asyncio.run(migrate())
    _sql(run.pg_url, f"CREATE ROLE {role} LOGIN NOSUPERUSER NOBYPASSRLS",
         *(f"GRANT USAGE ON SCHEMA {s} TO {role}" for s in (with_rls, without)),
         *(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {role}"
           for s in (with_rls, without)),
         *(f"ALTER TABLE {without}.{t} NO FORCE ROW LEVEL SECURITY, "
           f"DISABLE ROW LEVEL SECURITY" for t in ("sessions", "entries")))
    try:
        samples = run.pick(400, 120)
        n, turns = run.pick((5_000, 15), (1_000, 9))
        run.say("appends")
        place = Place(url, with_rls, without)
        appends(run, place, samples, "")
        # The same, commits not waiting for the WAL flush: what is left is the statement.
        _sql(run.pg_url, f"ALTER ROLE {role} SET synchronous_commit = off")
        appends(run, place, samples, ", synchronous_commit off")
        run.say("loads")
        loads(run, place, n, turns)
        lookups(run, place, run.pick(2_000, 300))
    finally:
        _sql(run.pg_url, f"DROP SCHEMA IF EXISTS {with_rls} CASCADE",
             f"DROP SCHEMA IF EXISTS {without} CASCADE", f"DROP ROLE IF EXISTS {role}")


@dataclass(frozen=True)
class Place:
    """Where the two stores live: the role's URL and the two schemas."""

    url: str
    with_rls: str
    without: str

    def stores(self) -> dict[str, PostgresStore]:
        return {"rls": PostgresStore(self.url, schema=self.with_rls, tenant="acme",
                                     min_size=1, max_size=1),
                "plain": PostgresStore(self.url, schema=self.without, min_size=1, max_size=1)}


def appends(run: Run, place: Place, samples: int, setting: str) -> None:
    new = realistic(samples + 2, seed=99)

    async def go() -> tuple[float, float, float]:
        stores = place.stores()
        parents: dict[str, str] = {}
        for name, store in stores.items():
            existing = realistic(1000, seed=3)
            await _fill(store, f"s{setting}", existing)
            parents[name] = existing[-1].id
        turn = {"k": 0}

        def before(k: int) -> None:
            turn["k"] = k + 1

        def way(name: str) -> Callable[[], object]:
            async def append() -> None:
                entry = MessageEntry(parent_id=parents[name], message=new[turn["k"]].message)
                parents[name] = entry.id
                await stores[name].append_entries(f"s{setting}", [entry])
            return append

        got = await alternate({name: way(name) for name in stores}, samples, before=before)
        for store in stores.values():
            await store.close()
        return got.median("rls"), got.median("plain"), got.paired("rls", "plain"), \
            got.pct("rls", 0.99) / got.pct("plain", 0.99)

    rls, plain, ratio, p99 = asyncio.run(go())
    run.row(f"PostgreSQL append p50 as a tenant (forced RLS), one realistic entry, "
            f"session of 1,000{setting}", ms(rls), "ms",
            versus="the same append, default tenant, RLS disabled", versus_value=ms(plain),
            ratio=ratio, goal=at_most(1.2),
            detail=f"median of {samples} paired turns; p99 {p99:.2f}× the plain p99; one "
                   f"pooled connection each")


def loads(run: Run, place: Place, n: int, turns: int) -> None:
    entries = realistic(n)

    async def go() -> tuple[float, float, float]:
        stores = place.stores()
        for store in stores.values():
            await _fill(store, "big", entries)

        def way(name: str) -> Callable[[], object]:
            async def load() -> None:
                assert len(await stores[name].load_entries("big")) == n
            return load

        got = await alternate({name: way(name) for name in stores}, turns, collect=True)
        for store in stores.values():
            await store.close()
        return got.median("rls"), got.median("plain"), got.paired("rls", "plain")

    rls, plain, ratio = asyncio.run(go())
    run.row(f"PostgreSQL load of a session of {n:,} realistic entries as a tenant (forced RLS)",
            ms(rls), "ms", versus="the same load, default tenant, RLS disabled",
            versus_value=ms(plain), ratio=ratio, goal=at_most(1.2),
            detail=f"median of {turns} paired turns")


def lookups(run: Run, place: Place, samples: int) -> None:
    """The shortest call: what the tenant's transaction (BEGIN, set_config, the
    statement, COMMIT) costs where the statement itself is nearly free."""

    async def go() -> tuple[float, float, float]:
        stores = place.stores()
        for store in stores.values():
            await store.create_session(SessionRecord(id="lookup"))

        def way(name: str) -> Callable[[], object]:
            async def lookup() -> None:
                await stores[name].load_session("lookup")
            return lookup

        got = await alternate({name: way(name) for name in stores}, samples)
        for store in stores.values():
            await store.close()
        return got.median("rls"), got.median("plain"), got.paired("rls", "plain")

    rls, plain, ratio = asyncio.run(go())
    run.row("PostgreSQL load_session p50 as a tenant (forced RLS)", ms(rls), "ms",
            versus="the same call, default tenant, RLS disabled (one statement, no transaction)",
            versus_value=ms(plain), ratio=ratio,
            detail=f"median of {samples} paired turns; the tenant's call is a transaction of "
                   f"four round trips; no goal: a fraction of a millisecond beside a model call")
