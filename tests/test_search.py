"""Search across sessions beyond the conformance part (S64): what each store keeps.

The conformance part (``testing/_conformance/_search.py``) runs on every
store through its own test module; these tests look at the index itself:
raw rows after deletes, the file store's derived index rebuilt when missing
or stale and kept right when another process appends, the PostgreSQL SQL
text rules against the Python ones, and a database indexed by its migration.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from threadline.ai._messages import TextPart, UserMessage
from threadline.errors import ConfigError, StoreError
from threadline.session._entries import Entry, MessageEntry, SessionRecord
from threadline.stores import FileStore, PostgresStore, SQLiteStore
from threadline.stores._search import indexed_text, query_terms, snippet_of
from threadline.testing import sample_entries
from threadline.testing._conformance._search import indexed_sample


def _user(text: str, parent: Entry | None = None) -> MessageEntry:
    return MessageEntry(parent_id=None if parent is None else parent.id,
                        message=UserMessage(content=(TextPart(text=text),)))


def _pg_rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query.encode(), params)
        return cur.fetchall() if cur.description else []


# -- SQLite -------------------------------------------------------------------------


async def test_s64_sqlite_delete_leaves_no_index_rows(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    for sid in ("gone", "kept"):
        await store.create_session(SessionRecord(id=sid))
        await store.append_entries(sid, [_user(f"whale {sid}"), _user("krill")])
    await store.delete_session("gone")
    await store.close()
    with sqlite3.connect(path) as raw:
        bodies = sorted(b for (b,) in raw.execute("SELECT body FROM search"))
        # Every row belongs to a stored entry, and none to the deleted session.
        orphans = raw.execute("SELECT count(*) FROM search WHERE rowid NOT IN "
                              "(SELECT seq FROM entries)").fetchone()[0]
    assert bodies == ["krill", "whale kept"] and orphans == 0


async def test_s64_sqlite_failed_append_indexes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    store = SQLiteStore(path)
    await store.create_session(SessionRecord(id="s"))
    first = _user("whale one")
    await store.append_entries("s", [first])
    # A batch repeating a stored id is refused whole: its new entry is not indexed.
    with pytest.raises(Exception, match="already"):
        await store.append_entries("s", [_user("whale two"), first])
    await store.append_entries("s", [first])  # an acknowledged retry: stores nothing
    assert [h.entry_id for h in await store.search("whale")] == [first.id]
    await store.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT count(*) FROM search").fetchone()[0] == 1


async def test_s64_sqlite_migration_indexes_existing_entries(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    store = SQLiteStore(path)
    await store.create_session(SessionRecord(id="s"))
    entries, expected = indexed_sample("wmig")
    await store.append_entries("s", entries)
    await store.close()
    with sqlite3.connect(path, isolation_level=None) as raw:  # back to version 3
        raw.execute("DROP TABLE search")
        raw.execute("DROP TABLE blobs")  # version 5, which runs again after 4
        raw.execute("DELETE FROM schema_migrations WHERE version >= 4")
    store = SQLiteStore(path)
    for probe, entry_id in expected.items():
        got = [h.entry_id for h in await store.search(probe)]
        assert got == ([] if entry_id is None else [entry_id]), probe
    await store.close()


# -- PostgreSQL -----------------------------------------------------------------------


@pytest.fixture
async def pg_store(pg_url: str, pg_schema: str) -> Any:
    store = PostgresStore(pg_url, schema=pg_schema, min_size=0, max_size=2)
    yield store
    await store.close()


async def test_s64_postgres_text_rules_match_python(pg_store: PostgresStore, pg_url: str,
                                                     pg_schema: str) -> None:
    """The trigger's SQL gives each row the text ``indexed_text`` gives its entry."""
    entries = [*sample_entries(), *indexed_sample("wpg")[0],
               _user('quote " backslash \\ tab \t newline \n é \u202e <b>')]
    await pg_store.create_session(SessionRecord(id="s"))
    await pg_store.append_entries("s", entries)
    stored = await pg_store.load_entries("s")
    rows = dict(_pg_rows(pg_url, f"SELECT seq, body FROM {pg_schema}.search "
                                 f"WHERE session_id = 's'"))
    for seq, entry in enumerate(stored, start=1):
        assert rows.get(seq) == indexed_text(entry), (seq, entry)


async def test_s64_postgres_nul_text_never_fails_an_append(pg_store: PostgresStore) -> None:
    await pg_store.create_session(SessionRecord(id="s"))
    odd = _user("whale \x00 nul and a literal \\u0000")
    plain = _user("whale plain", odd)
    await pg_store.append_entries("s", [odd, plain])  # one statement, fallback pass
    assert {h.entry_id for h in await pg_store.search("whale")} == {odd.id, plain.id}
    assert await pg_store.load_entries("s") == [odd, plain]


async def test_s64_postgres_delete_leaves_no_index_rows(pg_store: PostgresStore, pg_url: str,
                                                        pg_schema: str) -> None:
    for sid in ("gone", "kept"):
        await pg_store.create_session(SessionRecord(id=sid))
        await pg_store.append_entries(sid, [_user(f"whale {sid}")])
    await pg_store.delete_session("gone")
    rows = _pg_rows(pg_url, f"SELECT session_id, body FROM {pg_schema}.search")
    assert rows == [("kept", "whale kept")]


async def test_s64_postgres_migration_indexes_existing_entries(
        pg_store: PostgresStore, pg_url: str, pg_schema: str) -> None:
    await pg_store.create_session(SessionRecord(id="s"))
    entries, expected = indexed_sample("wpgmig")
    await pg_store.append_entries("s", entries)
    await pg_store.close()
    s = pg_schema
    _pg_rows(pg_url, f"DROP TABLE {s}.search; DROP TRIGGER search_added ON {s}.entries; "
                     f"DROP TRIGGER search_removed ON {s}.entries; "
                     f"DROP TRIGGER search_truncated ON {s}.entries; "
                     f"DROP FUNCTION {s}.search_added, {s}.search_removed, {s}.search_truncated, "
                     f"{s}.search_text_lenient, {s}.search_text, {s}.search_line, "
                     f"{s}.search_json; DROP TABLE {s}.blobs; "  # version 7 runs again after 6
                     f"DELETE FROM {s}.schema_migrations WHERE version >= 6")
    store = PostgresStore(pg_url, schema=pg_schema, min_size=0, max_size=2)
    try:
        for probe, entry_id in expected.items():
            got = [h.entry_id for h in await store.search(probe)]
            assert got == ([] if entry_id is None else [entry_id]), probe
    finally:
        await store.close()


async def test_s64_truncating_the_entries_empties_the_index(
        pg_store: PostgresStore, pg_url: str, pg_schema: str) -> None:
    """A truncate fires no delete trigger: the index is emptied with the entries, so
    the entries numbered anew after it neither collide with old rows nor find them."""
    await pg_store.create_session(SessionRecord(id="s"))
    await pg_store.append_entries("s", [MessageEntry(message=UserMessage.of("alpha words"))])
    _pg_rows(pg_url, f"TRUNCATE {pg_schema}.entries, {pg_schema}.sessions")
    await pg_store.create_session(SessionRecord(id="s"))
    await pg_store.append_entries("s", [MessageEntry(message=UserMessage.of("beta words"))])
    assert [h.snippet for h in await pg_store.search("words")] == ["beta words"]


async def test_s64_a_key_other_than_the_entry_ids_is_a_failure_not_a_retry(
        pg_store: PostgresStore, pg_url: str, pg_schema: str) -> None:
    """An index row left behind (here by a truncate with the trigger off) makes the
    append fail naming that key: it is not taken for a repeated append."""
    await pg_store.create_session(SessionRecord(id="s"))
    await pg_store.append_entries("s", [MessageEntry(message=UserMessage.of("alpha words"))])
    _pg_rows(pg_url, f"ALTER TABLE {pg_schema}.entries DISABLE TRIGGER search_truncated; "
                     f"TRUNCATE {pg_schema}.entries, {pg_schema}.sessions")
    await pg_store.create_session(SessionRecord(id="s"))
    with pytest.raises(StoreError) as info:
        await pg_store.append_entries("s", [MessageEntry(message=UserMessage.of("beta"))])
    assert "search_pkey" in str(info.value) and "repeats" not in str(info.value)


# -- the file store's derived index ---------------------------------------------------------


def _child_append(root: str, sid: str, text: str) -> str:
    async def run() -> str:
        entry = _user(text)
        await FileStore(root).append_entries(sid, [entry])
        return entry.id

    return asyncio.run(run())


async def test_s64_file_index_stays_right_when_another_process_appends(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = FileStore(root)
    await store.create_session(SessionRecord(id="s"))
    first = _user("whale first")
    await store.append_entries("s", [first])
    assert [h.entry_id for h in await store.search("whale")] == [first.id]  # index written
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        other = pool.apply(_child_append, (str(root), "s", "whale from the child"))
    assert {h.entry_id for h in await store.search("whale")} == {first.id, other}
    assert [h.entry_id for h in await store.search("child")] == [other]


async def test_s64_file_index_rebuilt_when_missing_or_damaged(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = FileStore(root)
    await store.create_session(SessionRecord(id="s"))
    entry = _user("whale text")
    await store.append_entries("s", [entry])
    await store.search("whale")
    (index,) = (root / ".search").iterdir()
    for damage in (index.unlink, lambda: index.write_bytes(b"\x00garbage")):
        damage()
        fresh = FileStore(root)  # no cache: it must read, or rebuild, the file
        assert [h.entry_id for h in await fresh.search("whale")] == [entry.id]
        assert index.exists() and b"whale text" in index.read_bytes()


async def test_s64_file_delete_by_any_means_leaves_no_index_file(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = FileStore(root)
    for sid in ("a", "b", "c"):
        await store.create_session(SessionRecord(id=sid))
        await store.append_entries(sid, [_user(f"whale {sid}")])
    await store.search("whale")
    assert len(list((root / ".search").iterdir())) == 3
    await FileStore(root).delete_session("a")  # another handle
    os.unlink(store.path_for("b"))  # another program
    assert [h.session_id for h in await store.search("whale")] == ["c"]
    remaining = list((root / ".search").iterdir())
    assert len(remaining) == 1 and b"whale a" not in remaining[0].read_bytes()
    page = await store.list_sessions()
    assert [r.id for r in page.sessions] == ["c"] and page.problems == []


# -- queries and snippets ----------------------------------------------------------------


def test_s64_query_terms_are_words() -> None:
    assert query_terms('Blue "WHALE" AND-or* near(x)') == ["blue", "whale", "and", "or",
                                                            "near", "x"]
    assert query_terms("read_file Ünïcode") == ["read", "file", "ünïcode"]
    for bad in ("", "  ", '"*()', 7):
        with pytest.raises(ConfigError):
            query_terms(bad)  # type: ignore[arg-type]


def test_s64_snippet_is_around_the_first_match() -> None:
    text = " ".join(f"w{n}" for n in range(100)) + " whale " + " ".join(f"x{n}" for n in range(50))
    snippet = snippet_of(text, ["whale"])
    assert "whale" in snippet and snippet.startswith("…") and snippet.endswith("…")
    assert len(snippet.split()) <= 17
    assert snippet_of("short whale", ["whale"]) == "short whale"


def test_s64_the_docs_example_runs_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    page = (Path(__file__).resolve().parent.parent / "docs" / "search.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/search.md", "exec"), {"__name__": "docs_example"})
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("chat-1 ") and "blue whales spend the winter" in line


async def test_s64_file_index_follows_no_link_and_waits_on_no_fifo(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = FileStore(root)
    await store.create_session(SessionRecord(id="s"))
    entry = _user("whale text")
    await store.append_entries("s", [entry])
    await store.search("whale")
    (index,) = (root / ".search").iterdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"not yours")
    for hostile in ("fifo", "link"):
        index.unlink()
        if hostile == "fifo":
            os.mkfifo(index)
        else:
            index.symlink_to(secret)
        assert [h.entry_id for h in await FileStore(root).search("whale")] == [entry.id]
        assert secret.read_bytes() == b"not yours"
    # A linked index folder is neither read nor written.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "other.jsonl.idx").write_bytes(b"kept")
    for f in (root / ".search").iterdir():
        f.unlink()
    (root / ".search").rmdir()
    (root / ".search").symlink_to(elsewhere)
    assert [h.entry_id for h in await FileStore(root).search("whale")] == [entry.id]
    assert [p.name for p in elsewhere.iterdir()] == ["other.jsonl.idx"]
