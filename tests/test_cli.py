"""The ``threadline`` command, run as a real child process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.cli import CLI, tl
from threadline.ai import ToolResultMessage
from threadline.session import MessageEntry, SessionRecord, decode_entry
from threadline.stores import FileStore
from threadline.stores.file._format import encode_init


def test_demo_kills_repairs_branches_and_forks(tmp_path: Path) -> None:
    out = tl("demo", "--dir", str(tmp_path / "d")).stdout
    assert "SIGKILL" in out
    assert "appended by crash repair" in out
    files = sorted((tmp_path / "d").glob("*.jsonl"))
    assert len(files) == 2  # the session and its fork
    main = next(f for f in files if not f.name.endswith("-fork.jsonl"))
    lines = main.read_bytes().splitlines()
    assert json.loads(lines[0])["type"] == "session_init"
    entries = [decode_entry(line) for line in lines[1:]]
    # The child stored the question and the tool call before it was killed;
    # the parent's repair appended an interrupted result right after.
    third = entries[2]
    assert isinstance(third, MessageEntry)
    assert isinstance(third.message, ToolResultMessage)
    assert third.message.synthesized == "interrupted"
    # Two branches grow from the repaired result.
    children = [e for e in entries if e.parent_id == third.id]
    assert len(children) == 2
    fork = next(f for f in files if f.name.endswith("-fork.jsonl"))
    init = json.loads(fork.read_bytes().splitlines()[0])
    assert init["parent_id"] == main.stem


def test_demo_twice_in_one_folder_keeps_both_runs(tmp_path: Path) -> None:
    tl("demo", "--dir", str(tmp_path))
    tl("demo", "--dir", str(tmp_path))
    assert len(list(tmp_path.glob("*.jsonl"))) == 4


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    out = tmp_path / "s"
    tl("demo", "--dir", str(out))
    return out


def test_list_show_tree_export(store_dir: Path) -> None:
    listed = tl("--store", str(store_dir), "list").stdout
    sid = next(f.stem for f in store_dir.glob("*.jsonl") if not f.stem.endswith("-fork"))
    assert sid in listed and f"{sid}-fork" in listed
    shown = tl("--store", str(store_dir), "show", sid).stdout
    assert "Porto" in shown and "interrupted" in shown
    tree = tl("--store", str(store_dir), "tree", sid).stdout
    assert tree.count("branch") == 2 and "leaf" in tree
    # The default export is the session file itself, session_init included.
    exported = tl("--store", str(store_dir), "export", sid).stdout.encode()
    assert exported == (store_dir / f"{sid}.jsonl").read_bytes()
    messages = json.loads(tl("--store", str(store_dir), "export", sid, "--format",
                             "messages").stdout)
    assert [m["role"] for m in messages][:3] == ["user", "assistant", "tool_result"]


def test_check_reports_corruption_with_file_and_line(store_dir: Path) -> None:
    assert "✓" in tl("--store", str(store_dir), "check").stdout
    victim = next(store_dir.glob("*-fork.jsonl"))
    lines = victim.read_bytes().splitlines(keepends=True)
    lines[2] = b'{"type":"message","id":"x"\n'
    victim.write_bytes(b"".join(lines))
    proc = tl("--store", str(store_dir), "check", check=False)
    assert proc.returncode == 1
    assert f"{victim.name} line 3" in proc.stdout


def test_check_flags_unanswered_tool_call(tmp_path: Path) -> None:
    import asyncio

    from threadline.ai import AssistantMessage, ToolCall

    async def make() -> None:
        store = FileStore(tmp_path)
        await store.create_session(SessionRecord(id="s"))
        await store.append_entries("s", [MessageEntry(message=AssistantMessage(
            content=(ToolCall(id="c", name="t"),), stop_reason="tool_use"))])

    asyncio.run(make())
    proc = tl("--store", str(tmp_path), "check", "s", check=False)
    assert proc.returncode == 1 and "without a result" in proc.stdout


def test_fork_and_copy_between_stores(store_dir: Path, tmp_path: Path) -> None:
    sid = next(f.stem for f in store_dir.glob("*.jsonl") if not f.stem.endswith("-fork"))
    out = tl("--store", str(store_dir), "fork", sid, "--id", "copy-of-demo").stdout
    assert "copy-of-demo" in out
    head = json.loads((store_dir / "copy-of-demo.jsonl").read_bytes().splitlines()[0])
    assert head["parent_id"] == sid
    db = tmp_path / "all.db"
    tl("copy", str(store_dir), f"sqlite:///{db}")
    listed = tl("--store", f"sqlite:///{db}", "list").stdout
    assert "copy-of-demo" in listed and sid in listed
    # Same bytes on both sides: export from each store and compare.
    a = tl("--store", str(store_dir), "export", sid).stdout
    b = tl("--store", f"sqlite:///{db}", "export", sid).stdout
    assert a == b


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--store", "nosuch://x", "list"], "nosuch://x"),
        (["--store", ".", "show", "does-not-exist"], "does-not-exist"),
    ],
)
def test_bad_input_prints_one_line_not_a_traceback(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    proc = tl(*args, cwd=tmp_path, check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error:") and needle in proc.stderr


def test_fork_of_a_missing_session_fails_and_creates_nothing(tmp_path: Path) -> None:
    store = tmp_path / "sessions"
    store.mkdir()
    proc = tl("--store", str(store), "fork", "no-such", "--id", "child", check=False)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error:") and "no-such" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert list(store.glob("*.jsonl")) == []


def test_check_reports_a_missing_session_and_checks_the_rest(tmp_path: Path) -> None:
    import asyncio

    asyncio.run(FileStore(tmp_path).create_session(SessionRecord(id="here")))
    proc = tl("--store", str(tmp_path), "check", "gone", "here", check=False)
    assert proc.returncode == 1
    assert "gone" in proc.stdout and "not found" in proc.stdout
    assert "✓ here" in proc.stdout


def test_init_line_written_by_store_matches_codec(tmp_path: Path) -> None:
    import asyncio

    record = SessionRecord(id="abc")
    asyncio.run(FileStore(tmp_path).create_session(record))
    assert (tmp_path / "abc.jsonl").read_bytes().splitlines()[0] == encode_init(record)


def test_list_survives_a_corrupt_session(store_dir: Path) -> None:
    victim = next(store_dir.glob("*-fork.jsonl"))
    lines = victim.read_bytes().splitlines(keepends=True)
    lines[1] = b"not json\n"
    victim.write_bytes(b"".join(lines))
    listed = tl("--store", str(store_dir), "list", "--entries").stdout
    assert "corrupt" in listed and victim.stem in listed


async def test_chat_talks_to_a_real_http_server_and_resumes(tmp_path: Path) -> None:
    """`threadline chat` end to end: the openai SDK against the local wire server."""
    import asyncio

    from support.cli import chat_reply as reply
    from support.wire_server import WireServer

    async with WireServer() as server:
        server.reply(reply("Hello from the server."), reply("Still here."))
        env = dict(os.environ, OPENAI_API_KEY="test-key", OPENAI_BASE_URL=f"{server.url}/v1",
                   NO_COLOR="1", COLUMNS="200")
        for line in ("hi", "again"):
            proc = await asyncio.create_subprocess_exec(
                *CLI, "--store", str(tmp_path), "chat", "c-1", "--model", "openai:gpt-test",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env)
            out, err = await asyncio.wait_for(proc.communicate(f"{line}\n\n".encode()), 60)
            assert proc.returncode == 0, err.decode()
        assert b"Still here." in out
    # The second process resumed the session: the model saw the first exchange.
    second = server.received[1].body["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "user"]
    assert second[1]["content"] == "Hello from the server."
    lines = (tmp_path / "c-1.jsonl").read_bytes().splitlines()
    assert len(lines) == 1 + 4
