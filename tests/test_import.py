"""Importing pi, Claude Code and Agents SDK transcripts (S30).

S30: an import keeps the source's tree (branches, leaf, compactions, fork
lineage, tool-call pairing), keeps everything threadline has no type for as
raw custom entries, and never duplicates when it runs again.

The pi and the first Claude Code fixture are written by hand from the
published formats; ``claude_code_real_2.1.332.jsonl`` was written by the real
Claude Code CLI (see tests/fixtures/import/README.md). The Agents SDK
database is written by the real ``openai-agents`` package in each test.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from agents.memory import SQLiteSession

from support.cli import tl, tl_pty
from threadline import durable
from threadline.ai import AssistantMessage, ToolResultMessage, UserMessage
from threadline.cli._formats import EXPORTERS, IMPORTERS
from threadline.errors import CorruptLog
from threadline.integrations.importers import (
    Imported,
    import_agents_sqlite,
    import_claude_code,
    import_pi,
)
from threadline.session import (
    BranchSummaryEntry,
    CompactionEntry,
    CustomEntry,
    CustomMessageEntry,
    MessageEntry,
    SessionRecord,
    TreeIndex,
    build_context,
)
from threadline.stores import CopyResult, FileStore, MemoryStore, copy_sessions
from threadline.stores.file._format import export_lines
from threadline.testing import assert_valid_for_providers

FIXTURES = Path(__file__).parent / "fixtures" / "import"
PI = FIXTURES / "pi_v3_branching.jsonl"
CLAUDE = FIXTURES / "claude_code_branching.jsonl"
CLAUDE_REAL = FIXTURES / "claude_code_real_2.1.332.jsonl"


def one(importer: Any, path: Path) -> Imported:
    [found] = importer(path.read_bytes(), str(path))
    assert isinstance(found, Imported)
    return found


def source_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line]


def mapped_by_kind(imp: Imported) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for e in imp.entries:
        key = e.kind if isinstance(e, CustomEntry) else type(e).__name__
        out.setdefault(key, []).append(e)
    return out


ROLE = {UserMessage: "user", AssistantMessage: "assistant", ToolResultMessage: "tool_result"}


def message_texts(imp: Imported) -> list[tuple[str, str]]:
    """(role, text) of the context built from the active path."""
    out = []
    for m in build_context(TreeIndex(imp.entries).path()):
        text = m.text if not isinstance(m, AssistantMessage) or m.text else \
            ",".join(c.name for c in m.tool_calls)
        out.append((ROLE[type(m)], text))
    return out


# -- pi -----------------------------------------------------------------------------


def test_s30_pi_keeps_the_tree_the_leaf_compactions_and_fork_lineage() -> None:
    imp = one(import_pi, PI)
    src = source_lines(PI)
    assert imp.record == SessionRecord(
        id=src[0]["id"], parent_id="3a9d6c40-7e21-4f5b-8a1d-9b2c4e6f8a02",
        created_at=imp.record.created_at)
    assert imp.record.created_at.isoformat() == "2025-11-20T09:00:00+00:00"
    tree = TreeIndex(imp.entries)
    by_kind = mapped_by_kind(imp)
    # Every source entry keeps its parent: map each pi id to the entry made from it.
    made = {}
    for e in imp.entries:
        if not isinstance(e, CustomEntry) or e.kind not in ("pi.extra", "pi.session"):
            made[e.id] = e
    assert len(made) == len(src) - 1
    # The branch point: the first answer has two children (the later turn, via the
    # model change, and the branch summary), as in the file.
    [answer] = [e for e in by_kind["MessageEntry"] if isinstance(e.message, AssistantMessage)
                and e.message.text.startswith("Two files")]
    below = [c for c in tree.children(answer.id)]
    assert len(below) == 1 and below[0].kind == "pi.extra"  # the answer's cost, kept
    kinds = sorted(type(c).__name__ if not isinstance(c, CustomEntry) else c.kind
                   for c in tree.children(below[0].id))
    assert kinds == ["BranchSummaryEntry", "pi.model_change"]
    # The leaf is pi's leaf: the last entry of the file (its session_info, kept raw).
    assert tree.leaf is not None and tree.leaf.kind == "pi.session_info"
    context = message_texts(imp)
    assert context[4][0] == "user" and context[4][1].endswith(
        "Another branch read a.txt (it says hello from a).")
    assert context[:4] + context[5:] == [
        ("user", "List the files here"), ("assistant", "bash"),
        ("tool_result", "a.txt\nb.txt"), ("assistant", "Two files: a.txt and b.txt."),
        ("user", "Instead, count the files"),
        ("user", "Answer with a number only."), ("assistant", "2")]
    [summary] = by_kind["BranchSummaryEntry"]
    assert isinstance(summary, BranchSummaryEntry)
    assert "read a.txt" in summary.summary and summary.details == {
        "readFiles": ["a.txt"], "modifiedFiles": []}
    [compaction] = by_kind["CompactionEntry"]
    assert isinstance(compaction, CompactionEntry)
    assert compaction.tokens_before == 1200
    kept = made[compaction.first_kept_entry_id]
    assert isinstance(kept, MessageEntry) and isinstance(kept.message, UserMessage)
    assert kept.message.text == "Now read a.txt"
    # The other branch, read from its leaf, starts with the summary and keeps the tail.
    other = next(e for e in by_kind["MessageEntry"] if isinstance(e.message, AssistantMessage)
                 and e.message.text == "a.txt says hello from a.")
    assert summary.from_id == other.id
    context = build_context(tree.path(other.id))
    assert [ROLE[type(m)] for m in context] == ["user", "user", "assistant", "tool_result",
                                         "assistant"]
    assert "two files" in context[0].text.lower()


def test_s30_pi_keeps_what_it_cannot_map_as_raw_bytes() -> None:
    imp = one(import_pi, PI)
    lines = [line for line in PI.read_bytes().split(b"\n") if line]
    raw = {e.kind: bytes(e.data) for e in imp.entries
           if isinstance(e, CustomEntry) and e.kind != "pi.extra"
           and isinstance(e.data, msgspec.Raw)}
    assert raw["pi.session"] == lines[0]
    for kind in ("model_change", "label", "session_info"):
        assert raw[f"pi.{kind}"] in lines, kind
    assert raw["pi.message"] in lines  # the bash execution, a role threadline has not
    # Fields with no place ride in an extra entry after their message, values intact.
    extras = [msgspec.json.decode(bytes(e.data)) for e in imp.entries
              if isinstance(e, CustomEntry) and e.kind == "pi.extra"]
    assert {"input": 0.0004, "output": 0.0005, "cacheRead": 0, "cacheWrite": 0,
            "total": 0.0009} in [x.get("message.usage.cost") for x in extras]
    assert imp.extra_fields == {"message.timestamp": 10, "message.usage.cost": 5}
    assert imp.kept_raw == 5 + len(extras)
    # The custom entry and custom message are mapped, payloads intact.
    [custom] = [e for e in imp.entries if isinstance(e, CustomEntry) and e.kind == "todo"]
    assert msgspec.json.decode(bytes(custom.data)) == {"items": ["count files"], "done": False}
    [note] = [e for e in imp.entries if isinstance(e, CustomMessageEntry)]
    assert note.kind == "reminder" and not note.display and note.details == {
        "source": "extension"}


def test_s30_pi_version_1_links_entries_and_version_2_hook_messages() -> None:
    v1 = one(import_pi, FIXTURES / "pi_v1_linear.jsonl")
    path = TreeIndex(v1.entries).path()
    assert path == v1.entries  # one chain, in file order
    [compaction] = [e for e in v1.entries if isinstance(e, CompactionEntry)]
    kept = next(e for e in v1.entries if e.id == compaction.first_kept_entry_id)
    assert isinstance(kept, MessageEntry) and kept.message.text == "What is 2+2?"
    assert [text for _, text in message_texts(v1)][1:] == ["What is 2+2?", "4", "And 3+3?"]
    v2 = one(import_pi, FIXTURES / "pi_v2_hook.jsonl")
    [hook] = [e for e in v2.entries if isinstance(e, CustomMessageEntry)]
    assert hook.kind == "git-status" and hook.content[0].text == "On branch main"


def test_s30_pi_reads_a_session_and_its_fork_the_real_cli_wrote() -> None:
    parent = one(import_pi, FIXTURES / "pi_real_0.73.1.jsonl")
    fork = one(import_pi, FIXTURES / "pi_real_0.73.1_fork.jsonl")
    assert fork.record.parent_id == parent.record.id == "01a230ca-fabd-7673-8fc3-c0e994bbde58"
    assert message_texts(parent)[:4] == [
        ("user", "PLEASE_LIST run echo"), ("assistant", "bash"),
        ("tool_result", "fixture-output\n"), ("assistant", "The command printed fixture-output.")]
    assert message_texts(fork) == [*message_texts(parent), ("user", "After the fork"),
                                   ("assistant", "ok")]
    raw = sorted(e.kind for e in parent.entries if isinstance(e, CustomEntry)
                 and e.kind != "pi.extra")
    assert raw == ["pi.model_change", "pi.session", "pi.thinking_level_change"]


# -- Claude Code --------------------------------------------------------------------


def test_s30_claude_code_keeps_the_tree_sidechains_and_tool_pairs() -> None:
    imp = one(import_claude_code, CLAUDE)
    assert imp.record.id == "9d1e4f7a-2b3c-4d5e-8f90-a1b2c3d4e5f6"
    assert imp.record.created_at.isoformat() == "2025-10-01T10:00:00+00:00"
    tree = TreeIndex(imp.entries)
    messages = [e for e in imp.entries if isinstance(e, MessageEntry)]
    calls = {c.id: c.name for e in messages if isinstance(e.message, AssistantMessage)
             for c in e.message.tool_calls}
    results = [e.message for e in messages if isinstance(e.message, ToolResultMessage)]
    assert calls == {"toolu_01": "Bash", "toolu_02": "Task", "toolu_03": "Read"}
    assert {r.tool_call_id: r.tool_name for r in results} == calls
    bash = next(r for r in results if r.tool_call_id == "toolu_01")
    assert bash.details == {"stdout": "a.txt\nb.txt", "stderr": "", "interrupted": False,
                            "isImage": False}
    # The sub-agent's conversation is its own root, not part of the main path.
    roots = tree.roots()
    sidechain = [r for r in roots if isinstance(r, MessageEntry)
                 and r.message.text == "Read a.txt and report"]
    assert len(sidechain) == 1
    side_path = [e for e in tree.path(tree.entries[-1].id) if e.id == sidechain[0].id]
    assert side_path == []
    # The edited prompt made a branch: the first answer has two user children.
    [answer] = [e for e in messages if isinstance(e.message, AssistantMessage)
                and e.message.text.startswith("Two files")]
    extra = tree.children(answer.id)[0]
    firsts = sorted(c.message.text for c in tree.children(extra.id)
                    if isinstance(c, MessageEntry))
    assert firsts == ["Actually, just count them", "Read a.txt with a helper agent"]
    # The compaction folds everything before it, as Claude Code's does.
    [compaction] = [e for e in imp.entries if isinstance(e, CompactionEntry)]
    assert compaction.summary.startswith("This session is being continued")
    assert message_texts(imp)[1:] == [("user", "Thanks, that is all"),
                                      ("assistant", "You are welcome.")]
    # Reasoning keeps its signature; a streamed reply is one entry per block.
    thinking = messages[1].message
    assert isinstance(thinking, AssistantMessage)
    assert thinking.content[0].signature == "EqQBsig"  # type: ignore[union-attr]
    # summary and file-history-snapshot lines are kept raw, bytes intact.
    lines = [line for line in CLAUDE.read_bytes().split(b"\n") if line]
    raw = {e.kind: bytes(e.data) for e in imp.entries if isinstance(e, CustomEntry)
           and e.kind != "claude_code.extra"}
    assert raw["claude_code.summary"] == lines[0]
    assert raw["claude_code.file-history-snapshot"] == lines[6]
    assert raw["claude_code.system"] in lines


def test_s30_claude_code_reads_a_transcript_the_real_cli_wrote() -> None:
    imp = one(import_claude_code, CLAUDE_REAL)
    assert message_texts(imp) == [("user", "PLEASE_LIST run echo"), ("assistant", "Bash"),
                                  ("tool_result", "fixture-output"),
                                  ("assistant", "The command printed fixture-output.")]
    lines = [line for line in CLAUDE_REAL.read_bytes().split(b"\n") if line]
    raw_kinds = {e.kind for e in imp.entries if isinstance(e, CustomEntry)}
    assert {"claude_code.attachment", "claude_code.queue-operation",
            "claude_code.last-prompt", "claude_code.extra"} <= raw_kinds
    mapped = sum(1 for e in imp.entries if isinstance(e, MessageEntry))
    extras = sum(1 for e in imp.entries if isinstance(e, CustomEntry)
                 and e.kind == "claude_code.extra")
    assert mapped == 4 and imp.kept_raw == len(lines) - mapped + extras
    assert imp.extra_fields["cwd"] == 4 and imp.extra_fields["gitBranch"] == 4


# -- every format -------------------------------------------------------------------


def agents_db(path: Path) -> Path:
    """A database written by the real Agents SDK SQLiteSession: two sessions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    async def write() -> None:
        first = SQLiteSession("user-42", path)
        await first.add_items([
            {"role": "system", "content": "Be terse."},
            {"role": "user", "content": "Weather in Porto?"},
            {"type": "reasoning", "id": "rs_1", "summary": [
                {"type": "summary_text", "text": "Call the tool."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_a",
             "name": "get_weather", "arguments": '{"city": "Porto"}', "status": "completed"},
            {"type": "function_call_output", "call_id": "call_a", "output": "18C, sunny"},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "18C and sunny.",
                          "annotations": []}]},
        ])
        first.close()
        second = SQLiteSession("user-7", path)
        await second.add_items([{"role": "user", "content": [
            {"type": "input_text", "text": "Hello"}]}])
        second.close()

    asyncio.run(write())
    return path


def every_import(db: Path) -> list[Imported]:
    found = [one(import_pi, p) for p in sorted(FIXTURES.glob("pi_*.jsonl"))]
    found += [one(import_claude_code, p) for p in sorted(FIXTURES.glob("claude_code_*.jsonl"))]
    return found + import_agents_sqlite(db)


def test_s30_every_imported_session_gives_a_context_every_provider_accepts(
    tmp_path: Path,
) -> None:
    imports = every_import(agents_db(tmp_path / "agents.db"))
    assert len(imports) == 9
    for imp in imports:
        tree = TreeIndex(imp.entries)
        for leaf in [tree.leaf, *tree.roots()]:
            assert leaf is not None
            assert_valid_for_providers(build_context(tree.path(leaf.id)))
        # Counts add up: every entry is mapped or raw.
        raw = sum(1 for e in imp.entries if isinstance(e, CustomEntry)
                  and "." in e.kind)
        assert imp.kept_raw == raw, imp.record.id


def test_s30_importing_again_gives_the_same_bytes(tmp_path: Path) -> None:
    db = agents_db(tmp_path / "agents.db")
    first, second = every_import(db), every_import(db)
    for a, b in zip(first, second, strict=True):
        assert a.record == b.record
        assert export_lines(a.entries) == export_lines(b.entries)


def test_s30_agents_sqlite_maps_items_and_keeps_the_rest(tmp_path: Path) -> None:
    [porto, hello] = import_agents_sqlite(agents_db(tmp_path / "agents.db"))
    assert (porto.record.id, hello.record.id) == ("user-42", "user-7")
    assert TreeIndex(porto.entries).path() == porto.entries  # the SDK's history is linear
    assert message_texts(porto) == [("user", "Weather in Porto?"),
                                    ("assistant", "get_weather"),
                                    ("tool_result", "18C, sunny"),
                                    ("assistant", "18C and sunny.")]
    [result] = [e.message for e in porto.entries if isinstance(e, MessageEntry)
                and isinstance(e.message, ToolResultMessage)]
    assert result.tool_name == "get_weather"
    raw = {e.kind: msgspec.json.decode(bytes(e.data)) for e in porto.entries
           if isinstance(e, CustomEntry)}
    assert raw["openai_agents.message"] == {"role": "system", "content": "Be terse."}
    assert raw["openai_agents.reasoning"]["summary"][0]["text"] == "Call the tool."
    # The items' ids, statuses and part annotations are kept after their messages.
    assert porto.extra_fields == {"content.0.annotations": 1, "content.form": 1, "id": 2,
                                  "status": 2}
    extras = [msgspec.json.decode(bytes(e.data)) for e in porto.entries
              if isinstance(e, CustomEntry) and e.kind == "openai_agents.extra"]
    assert {"id": "fc_1", "status": "completed"} in extras
    assert message_texts(hello) == [("user", "Hello")]


# -- errors -------------------------------------------------------------------------


@pytest.mark.parametrize(("importer", "fixture", "lineno", "bad", "says"), [
    (import_pi, PI, 5, b'{"type":"message","id":"zz",', "not JSON"),
    (import_pi, PI, 5, b'{"type":"message","id":"zz","parentId":"nope","timestamp":'
                       b'"2025-11-20T09:00:05.000Z","message":{"role":"user","content":"x"}}',
     "names no earlier entry"),
    (import_pi, PI, 3, b'{"type":"message","id":"zz","parentId":null,"timestamp":'
                       b'"2025-11-20T09:00:05.000Z","message":{"role":"assistant"}}',
     "missing field 'content'"),
    (import_claude_code, CLAUDE, 4, b"[1, 2]", "expected a JSON object"),
    (import_claude_code, CLAUDE, 4, b'{"type":"user","uuid":"u0000001",'
                                    b'"timestamp":"2025-10-01T10:00:00Z","message":{}}',
     "appears twice"),
    (import_claude_code, CLAUDE, 4, b'{"type":"assistant","uuid":"q","parentUuid":null,'
                                    b'"timestamp":"2025-10-01T10:00:00Z","message":{}}',
     "missing field 'content'"),
])
def test_s30_a_malformed_line_is_an_error_naming_file_and_line(  # noqa: PLR0917
    tmp_path: Path, importer: Any, fixture: Path, lineno: int, bad: bytes, says: str,
) -> None:
    lines = fixture.read_bytes().split(b"\n")
    lines[lineno - 1] = bad
    path = tmp_path / fixture.name
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(CorruptLog) as caught:
        importer(path.read_bytes(), str(path))
    assert caught.value.path == str(path) and caught.value.line == lineno
    assert says in str(caught.value) and str(caught.value).startswith(f"{path} line {lineno}")
    # Through the command: nothing written, the same message, no traceback.
    store = tmp_path / "store"
    fmt = "pi" if importer is import_pi else "claude-code"
    proc = tl("--store", str(store), "import", "--format", fmt, str(path), check=False)
    assert proc.returncode == 1 and f"{path} line {lineno}" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(store.glob("*.jsonl"))


def test_s30_a_claude_code_parent_outside_the_file_starts_a_root_with_a_note() -> None:
    lines = CLAUDE.read_bytes().split(b"\n")
    lines[1] = lines[1].replace(b'"parentUuid":null', b'"parentUuid":"from-an-older-file"')
    [imp] = import_claude_code(b"\n".join(lines), "t.jsonl")
    assert imp.notes == ("t.jsonl line 2: parent 'from-an-older-file' is not in the file; "
                         "the line starts a new root",)
    first = next(e for e in imp.entries if isinstance(e, MessageEntry))
    assert first.parent_id is None
    extra = TreeIndex(imp.entries).children(first.id)[0]
    assert isinstance(extra, CustomEntry)
    assert msgspec.json.decode(bytes(extra.data))["parentUuid"] == "from-an-older-file"


def test_s30_a_bad_agents_row_names_the_database_and_row(tmp_path: Path) -> None:
    db = agents_db(tmp_path / "agents.db")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE agent_messages SET message_data = '{oops' WHERE id = 3")
    with pytest.raises(CorruptLog) as caught:
        import_agents_sqlite(db)
    assert str(caught.value).startswith(f"{db}: agent_messages row id 3: not JSON")
    assert caught.value.session_id == "user-42"
    (tmp_path / "plain.db").write_bytes(b"")
    with pytest.raises(CorruptLog, match="not an Agents SDK session database"):
        import_agents_sqlite(tmp_path / "plain.db")


# -- through the command, every store -----------------------------------------------


def import_json(store: str, fmt: str, *files: Path) -> list[dict[str, Any]]:
    out = tl("--store", store, "import", "--format", fmt, *map(str, files), "--json").stdout
    return [json.loads(line) for line in out.splitlines()]


def test_s30_import_twice_never_duplicates_in_any_store(
    tmp_path: Path, pg_url: str, pg_schema: str,
) -> None:
    db = agents_db(tmp_path / "agents.db")
    expected = {imp.record.id: imp for imp in every_import(db)}
    for url in (str(tmp_path / "files"), f"sqlite:///{tmp_path / 'x.db'}",
                f"{pg_url}?schema={pg_schema}"):
        for status in ("copied", "skipped"):
            reports = (import_json(url, "pi", *sorted(FIXTURES.glob("pi_*.jsonl")))
                       + import_json(url, "claude-code", CLAUDE, CLAUDE_REAL)
                       + import_json(url, "openai-agents-sqlite", db))
            assert {r["status"] for r in reports} == {status}, (url, reports)
            for r in reports:
                imp = expected[r["session_id"]]
                assert r["entries"] == len(imp.entries)
                assert (r["mapped"], r["kept_raw"]) == (len(imp.entries) - imp.kept_raw,
                                                        imp.kept_raw)
                assert r["extra_fields"] == imp.extra_fields
        for sid, imp in expected.items():
            exported = tl("--store", url, "export", sid).stdout.encode()
            assert exported.split(b"\n", 1)[1] == export_lines(imp.entries), (url, sid)


def test_s30_import_into_the_memory_store_and_again(tmp_path: Path) -> None:
    db = agents_db(tmp_path / "agents.db")
    first, second = every_import(db), every_import(db)

    async def run() -> CopyResult:
        store, staging = MemoryStore(), MemoryStore()
        for target, imports in ((store, first), (staging, second)):
            for imp in imports:
                await target.create_session(imp.record)
                await target.append_entries(imp.record.id, imp.entries)
        return await copy_sessions(staging, store, ids=[i.record.id for i in first])

    result = asyncio.run(run())
    assert (result.copied, result.skipped, result.entries) == (0, len(first), 0)


def test_s30_one_session_in_two_files_is_imported_once_or_refused(tmp_path: Path) -> None:
    store = str(tmp_path / "s")
    reports = import_json(store, "pi", PI, PI)
    assert [r["status"] for r in reports] == ["copied"]
    other = tmp_path / "edited.jsonl"
    other.write_bytes(PI.read_bytes().replace(b"count the files", b"count them"))
    proc = tl("--store", store, "import", "--format", "pi", str(PI), str(other), check=False)
    assert proc.returncode == 1
    assert f"{PI} and {other} hold different versions of session" in proc.stderr
    proc = tl("--store", store, "import", "--format", "pi", str(other), check=False)
    assert proc.returncode == 1 and "the destination holds different content" in proc.stderr
    db = tmp_path / "missing.db"
    proc = tl("--store", store, "import", "--format", "openai-agents-sqlite", str(db),
              check=False)
    assert proc.returncode == 1 and f"{db}: no such SQLite file" in proc.stderr
    proc = tl("--store", store, "import", "--format", "openai-agents-sqlite", "-",
              check=False)
    assert proc.returncode == 1 and "reads a database file, not stdin" in proc.stderr


def test_s30_a_session_continued_after_its_import_is_refused_not_rewound(
    tmp_path: Path,
) -> None:
    store = tmp_path / "s"
    [report] = import_json(str(store), "pi", PI)

    async def continue_it() -> None:
        agent = await durable.open(None, store=FileStore(store), session_id=report["session_id"],
                                   create=False)
        await agent.append(UserMessage.of("carried on in threadline"))

    asyncio.run(continue_it())
    before = FileStore(store).path_for(report["session_id"]).read_bytes()
    proc = tl("--store", str(store), "import", "--format", "pi", str(PI), check=False)
    assert proc.returncode == 1
    assert f"has {report['entries'] + 1} entries in the destination but only" in proc.stderr
    assert FileStore(store).path_for(report["session_id"]).read_bytes() == before


def test_s30_hostile_text_in_a_transcript_is_shown_escaped(tmp_path: Path) -> None:
    evil = "x\x1b[2J\u202ey"
    text = PI.read_text(encoding="utf-8")
    text = text.replace("7f1c2a9e-41d2-4b6a-9c3e-2d8b5e0f6a11", json.dumps(evil)[1:-1])
    text = text.replace('"customType":"todo"', '"customType":' + json.dumps(evil))
    text += '{"type":"message","id":"zz",\n'  # a bad line after all, to see the error too
    path = tmp_path / "evil.jsonl"
    path.write_text(text, encoding="utf-8")
    store = str(tmp_path / "s")
    proc = tl("--store", store, "import", "--format", "pi", str(path), check=False)
    assert proc.returncode == 1 and "\x1b" not in proc.stderr and "\u202e" not in proc.stderr
    path.write_text(text.rsplit("\n", 2)[0] + "\n", encoding="utf-8")
    shown, as_json = "x\\x1b[2J\\u202ey", "x\\u001b[2J\\u202ey"
    for args, escaped in ((("import", "--format", "pi", str(path)), shown),
                          (("show", evil, "--no-pager", "--custom"), shown),
                          (("import", "--format", "pi", str(path), "--json"), as_json)):
        proc = tl("--store", store, *args)
        out = proc.stdout + proc.stderr
        assert "\x1b" not in out and "\u202e" not in out, args
        assert escaped in out, args


def test_s30_a_torn_last_line_is_left_out_and_finished_by_the_next_import(
    tmp_path: Path,
) -> None:
    full = PI.read_bytes()
    torn = tmp_path / PI.name
    torn.write_bytes(full[: full.rindex(b'"name"')])  # the last line cut mid-write
    store = str(tmp_path / "s")
    proc = tl("--store", store, "import", "--format", "pi", str(torn), "--json")
    [report] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert report["status"] == "copied"
    assert "line 19: torn last line" in proc.stderr
    complete = len(one(import_pi, PI).entries)
    assert report["entries"] == complete - 1  # the session_info line, not yet written
    torn.write_bytes(full)
    [again] = import_json(store, "pi", torn)
    assert (again["status"], again["entries"]) == ("resumed", complete)


def test_s30_many_files_show_progress_on_a_terminal(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        text = PI.read_text(encoding="utf-8").replace("7f1c2a9e", f"0000000{i}")
        files.append(tmp_path / f"{i}.jsonl")
        files[-1].write_text(text, encoding="utf-8")
    code, out = tl_pty("--store", str(tmp_path / "s"), "import", "--format", "pi",
                       *map(str, files))
    assert code == 0 and out.count(b"imported: 0000000") == 3
    assert b"reading files" in out and b"importing sessions" in out and b"3/3" in out


# -- threadline's own format --------------------------------------------------------


async def test_s30_export_then_import_is_byte_identical_in_the_memory_store() -> None:
    src = MemoryStore()
    imp = one(import_pi, PI)
    await src.create_session(imp.record)
    await src.append_entries(imp.record.id, imp.entries)
    tree = TreeIndex(await src.load_entries(imp.record.id))
    dump = EXPORTERS["jsonl"](await src.load_session(imp.record.id), tree, False)
    [back] = IMPORTERS["threadline"](dump, "dump.jsonl")
    dst = MemoryStore()
    await dst.create_session(back.record)
    await dst.append_entries(back.record.id, back.entries)
    again = EXPORTERS["jsonl"](await dst.load_session(back.record.id),
                               TreeIndex(await dst.load_entries(back.record.id)), False)
    assert again == dump and back.record == imp.record


def test_s30_the_documented_example_runs(tmp_path: Path) -> None:
    doc = (Path(__file__).parent.parent / "docs" / "integrations.md").read_text("utf-8")
    block = doc.split("<!-- example-import:", 1)[1].split("```python\n", 1)[1]
    (tmp_path / "example.py").write_text(block.split("```", 1)[0], encoding="utf-8")
    (tmp_path / "transcript.jsonl").write_bytes(CLAUDE.read_bytes())
    imp = one(import_claude_code, CLAUDE)
    for copied, skipped in ((1, 0), (0, 1)):  # the second run changes nothing
        proc = subprocess.run([sys.executable, "example.py"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == [
            f"{imp.record.id} {len(imp.entries)} entries, {imp.kept_raw} kept raw",
            f"{copied} copied, {skipped} already there",
            "3 messages a model would be sent"]
