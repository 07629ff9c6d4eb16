"""Listing sessions: the file store against a bare scan of its folder, PostgreSQL against a lookup.

- File store, 10,000 sessions of two entries each, on a fresh ``FileStore``
  each time: the first page (50), every page (200 pages), and the first
  page again after another handle created one more session; against one
  ``os.scandir`` of the folder plus one read of each file's first line.
  Goals: first page 2x, all pages 3x.
- PostgreSQL (when reachable), 100,000 sessions: the first page and a page
  from a cursor half way through, against ``load_session`` of one session
  through the same store (one round trip, one index probe).
"""

from __future__ import annotations

import asyncio
import secrets
import time

from bench._floors import scan
from bench._harness import Measured, Run, alternate, at_most, ms
from bench._targets import FileStore, PostgresStore, SessionRecord
from bench._workloads import chain

NEEDS = ()
MINUTES = 2


def file_listing(run: Run, n: int, turns: int) -> None:
    root = run.tmp / "listing"

    async def fill() -> None:
        store = FileStore(root, durability="flush")
        for start in range(0, n, 200):
            ids = [f"session-{i:06d}" for i in range(start, min(n, start + 200))]
            await asyncio.gather(*(store.create_session(SessionRecord(id=i)) for i in ids))
            await asyncio.gather(*(store.append_entries(i, chain(2)) for i in ids))
        await store.close()

    asyncio.run(fill())
    time.sleep(0.2)  # the folder's mtime settles: a listing may trust it from here
    late = iter(range(10**6))

    async def first_page() -> None:
        assert len((await FileStore(root).list_sessions(limit=50)).sessions) == 50

    async def all_pages() -> None:
        store, cursor, seen = FileStore(root), None, 0
        while True:
            page = await store.list_sessions(limit=50, cursor=cursor)
            seen += len(page.sessions)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen >= n

    async def after_create() -> Measured:
        reader = FileStore(root)
        await reader.list_sessions(limit=50)
        await FileStore(root, durability="flush").create_session(
            SessionRecord(id=f"late-{next(late)}"))
        t0 = time.perf_counter()
        await reader.list_sessions(limit=50)
        return Measured(time.perf_counter() - t0)

    got = asyncio.run(alternate({"floor": lambda: scan(root), "first": first_page,
                                 "all": all_pages, "rescan": after_create}, turns))
    floor = "os.scandir of the folder + one read of each file's first line"
    detail = f"median of {turns} paired turns"
    for key, what, goal in (("first", "first page (50)", at_most(2.0)),
                            ("all", f"every page ({n // 50} pages of 50)", at_most(3.0)),
                            ("rescan", "first page after another handle created one", None)):
        run.row(f"file store, {n:,} sessions: {what}", ms(got.median(key)), "ms",
                versus=floor, versus_value=ms(got.median("floor")),
                ratio=got.paired(key, "floor"), goal=goal, detail=detail)


def postgres_listing(run: Run, n: int, turns: int) -> None:
    schema = f"tl_bench_list_{secrets.token_hex(4)}"

    async def go() -> None:
        store = PostgresStore(run.pg_url, schema=schema, max_size=4)
        for start in range(0, n, 500):
            await asyncio.gather(*(store.create_session(SessionRecord(id=f"s-{i:07d}"))
                                   for i in range(start, min(n, start + 500))))
        middle = (await store.list_sessions(limit=n // 2)).next_cursor
        got = await alternate({
            "floor": lambda: store.load_session(f"s-{n // 3:07d}"),
            "first": lambda: store.list_sessions(limit=50),
            "deep": lambda: store.list_sessions(limit=50, cursor=middle),
        }, turns, block=10)
        await store.close()
        for key, what in (("first", "first page (50)"), ("deep", "a page from half way")):
            run.row(f"PostgreSQL store, {n:,} sessions: {what}", ms(got.median(key)), "ms",
                    versus="load_session of one session, same store",
                    versus_value=ms(got.median("floor")), ratio=got.paired(key, "floor"),
                    detail=f"median of {turns} paired turns of 10 calls")

    try:
        asyncio.run(go())
    finally:
        from bench.disk import drop_schema

        drop_schema(run.pg_url, schema)


def main(run: Run) -> None:
    file_listing(run, run.pick(10_000, 500), run.pick(9, 2))
    if run.postgres():
        postgres_listing(run, run.pick(100_000, 500), run.pick(21, 2))
