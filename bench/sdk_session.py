"""``ThreadlineSession`` against the Agents SDK's own file ``SQLiteSession``, per call.

Both hold the same conversation: user and assistant items in turn, each
with 400 characters of base64 of random bytes, the assistant items in the
form the SDK stores a model's reply (id, status, output_text with
annotations). With 1,000 and then 10,000 items already stored, in the same
turns: ``add_items`` of one more user item, and ``get_items(limit=20)``,
each through a session object that has been in use (as an application keeps
one per conversation). threadline runs over the fsync file store, the SQLite
store (synchronous=FULL) and the PostgreSQL store; the SDK's session is its
SQLite file in WAL mode, which syncs each commit too. Bytes on disk after
the same 10,000 items: the folder, the SQLite file after a WAL checkpoint,
the schema's tables with TOAST and indexes after VACUUM.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import secrets
from pathlib import Path
from typing import Any

from bench._harness import Run, alternate, at_most
from bench._workloads import payload_texts
from bench.disk import drop_schema, schema_bytes, sqlite_bytes

NEEDS = ("import:agents",)
MINUTES = 6
SID = "bench"


def item(n: int, text: str) -> dict[str, Any]:
    if n % 2 == 0:
        return {"role": "user", "content": text}
    return {"id": f"msg_{n:024x}", "type": "message", "role": "assistant",
            "status": "completed", "content": [{"type": "output_text", "text": text,
                                                "annotations": [], "logprobs": []}]}


def _session_type() -> Any:
    from threadline.integrations.openai_agents import ThreadlineSession

    return ThreadlineSession


async def _fill(session: Any, items: list[dict[str, Any]]) -> None:
    for start in range(0, len(items), 500):
        await session.add_items(items[start:start + 500])


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


async def _one_size(run: Run, kind: str, n: int, texts: list[str], turns: int) -> None:
    from agents import SQLiteSession

    tag = secrets.token_hex(3)
    items = [item(i, t) for i, t in enumerate(texts[:n])]
    schema = f"sdk_{tag}"
    url = {"file": f"file://{run.tmp}/files-{tag}", "sqlite": f"sqlite://{run.tmp}/tl-{tag}.db",
           "postgres": f"{run.pg_url}?schema={schema}"}[kind]
    ours = _session_type().from_url(SID, url)  # closing it closes its store
    sdk_path = run.tmp / f"sdk-{tag}.db"
    sdk = SQLiteSession(SID, sdk_path)
    await _fill(ours, items)
    await _fill(sdk, items)
    extra = iter(texts[n:])

    def adder(session: Any) -> Any:
        async def add() -> None:
            await session.add_items([{"role": "user", "content": next(extra)}])
        return add

    def getter(session: Any) -> Any:
        async def get() -> None:
            got = await session.get_items(limit=20)
            assert len(got) == 20
        return get

    got = await alternate({"ours add": adder(ours), "sdk add": adder(sdk),
                           "ours get": getter(ours), "sdk get": getter(sdk)}, turns)
    label = {"file": "fsync file store", "sqlite": "SQLite store",
             "postgres": "PostgreSQL store"}[kind]
    peer = "the Agents SDK's file SQLiteSession in the same turns"
    detail = f"median of {turns} paired turns, {n:,} items stored"
    for what, key in (("add_items of one item", "add"), ("get_items(limit=20)", "get")):
        run.row(f"ThreadlineSession on the {label}: {what} at {n:,} items",
                got.median(f"ours {key}") * 1e3, "ms", versus=peer,
                versus_value=got.median(f"sdk {key}") * 1e3,
                ratio=got.paired(f"ours {key}", f"sdk {key}"), peer=True,
                goal=at_most(1.5), detail=detail)
    if n == max(run.pick((1_000, 10_000), (200,))):
        await ours.close()
        if kind == "file":
            ours_bytes = _folder_bytes(run.tmp / f"files-{tag}")
        elif kind == "sqlite":
            ours_bytes = sqlite_bytes(run.tmp / f"tl-{tag}.db")
        else:
            ours_bytes = schema_bytes(run.pg_url, schema)
        extra_items = turns + 1  # the adds measured, in both
        sdk.close()
        run.row(f"ThreadlineSession on the {label}: bytes for {n + extra_items:,} items",
                ours_bytes / 1e6, "MB", versus="the Agents SDK's SQLiteSession file",
                versus_value=sqlite_bytes(sdk_path) / 1e6, peer=True, goal=at_most(1.3),
                detail="the same items in both")
    else:
        sdk.close()
    await ours.close()
    if kind == "postgres":
        drop_schema(run.pg_url, schema)


def main(run: Run) -> None:
    run.uses("openai-agents", importlib.metadata.version("openai-agents"))
    sizes, turns = run.pick(((1_000, 10_000), 40), ((200,), 5))
    texts = payload_texts(max(sizes) + (turns + 2) * 4)
    kinds = ["file", "sqlite"] + (["postgres"] if run.postgres() else [])
    for kind in kinds:
        for n in sizes:
            asyncio.run(_one_size(run, kind, n, texts, turns))
