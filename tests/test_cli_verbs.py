"""The CLI for scripts and people: options, short ids, paging, new verbs, round trips."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from support.cli import CLI, SID, make_hostile_store, tl, tl_pty
from threadline import __version__
from threadline.session import SessionRecord
from threadline.stores import FileStore, SQLiteStore
from threadline.stores.file import decode_lines
from threadline.stores.file._format import export_lines


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo") / "s"
    tl("--store", str(root), "demo")
    return root


def main_id(root: Path) -> str:
    return next(f.stem for f in root.glob("*.jsonl") if not f.stem.endswith("-fork"))


def test_version() -> None:
    assert tl("--version").stdout.strip() == f"threadline {__version__}"


def test_store_before_or_after_the_verb_or_from_the_environment(demo: Path) -> None:
    sid = main_id(demo)
    before = tl("--store", str(demo), "list", "--json").stdout
    after = tl("list", "--json", "--store", str(demo)).stdout
    env = tl("list", "--json", env={"THREADLINE_STORE": str(demo)}).stdout
    assert before == after == env and sid in before
    # After the verb wins over before it.
    assert tl("--store", "nowhere", "list", "--store", str(demo)).returncode == 0


def test_json_output_has_full_ids_and_no_wrapping(demo: Path) -> None:
    sid = main_id(demo)
    rows = [json.loads(line) for line in tl("--store", str(demo), "list", "--json",
                                            env={"COLUMNS": "40"}).stdout.splitlines()]
    assert {r["id"] for r in rows} == {sid, f"{sid}-fork"}
    assert next(r for r in rows if r["id"] == f"{sid}-fork")["parent_id"] == sid
    tree = json.loads(tl("--store", str(demo), "tree", sid, "--json").stdout)
    assert len(tree["entries"]) == 9 and tree["leaf_id"] == tree["entries"][-1]["id"]
    checked = [json.loads(line) for line in tl("--store", str(demo), "check", "--json")
               .stdout.splitlines()]
    assert all(c["ok"] for c in checked) and len(checked) == 2
    # Human output on a narrow pipe is not cut or wrapped either.
    listed = tl("--store", str(demo), "list", env={"COLUMNS": "40"}).stdout
    assert f"{sid}-fork  {sid}" in listed


def test_short_ids_shown_are_accepted_as_input(demo: Path) -> None:
    sid = main_id(demo)
    path = [json.loads(line) for line in tl("--store", str(demo), "show", sid, "--json")
            .stdout.splitlines()]
    shown = tl("--store", str(demo), "show", sid).stdout.splitlines()
    shorts = [line.split()[0] for line in shown]
    assert [p["id"][-len(s):] for p, s in zip(path, shorts, strict=True)] == shorts
    # The short id of the third entry, a full id and a unique prefix all name it.
    third = path[2]["id"]
    for given in (shorts[2], third, third[:30]):
        at = tl("--store", str(demo), "show", sid, "--at", given, "--json").stdout
        assert [json.loads(line)["id"] for line in at.splitlines()] == [p["id"] for p in path[:3]]
    proc = tl("--store", str(demo), "show", sid, "--at", "0", check=False)
    assert proc.returncode == 1 and "ambiguous" in proc.stderr
    proc = tl("--store", str(demo), "show", sid, "--at", "zzzz", check=False)
    assert proc.returncode == 1 and "no entry 'zzzz'" in proc.stderr


def test_show_tail_and_at(demo: Path) -> None:
    sid = main_id(demo)
    full = tl("--store", str(demo), "show", sid).stdout.splitlines()
    tail = tl("--store", str(demo), "show", sid, "--tail", "2").stdout.splitlines()
    assert tail == [f"… {len(full) - 2} earlier entries", *full[-2:]]


def test_show_pages_on_a_terminal_like_git_log(demo: Path) -> None:
    sid = main_id(demo)
    code, out = tl_pty("--store", str(demo), "show", sid, env={"PAGER": "sed s/^/PAGED:/"})
    lines = out.replace(b"\r\n", b"\n").decode().splitlines()
    assert code == 0 and lines and all(line.startswith("PAGED:") for line in lines), lines
    code, out = tl_pty("--store", str(demo), "show", sid, "--no-pager",
                       env={"PAGER": "sed s/^/PAGED:/"})
    assert code == 0 and b"PAGED:" not in out and b"Porto" in out


def test_export_import_round_trips_through_every_store(
    tmp_path: Path, pg_url: str, pg_schema: str
) -> None:
    src = tmp_path / "src"
    make_hostile_store(src)
    original = FileStore(src).path_for(SID).read_bytes()
    exported = tl("--store", str(src), "export", SID).stdout.encode("utf-8", "surrogateescape")
    # The file's own bytes, its batch line (one append of five entries) opened
    # up into one line per entry.
    head, body = original.split(b"\n", 1)
    assert b'{"type":"batch"' in body
    assert exported == head + b"\n" + export_lines(decode_lines(body))
    # The session file itself imports, and so does the export.
    dump, export = tmp_path / "dump.jsonl", tmp_path / "export.jsonl"
    dump.write_bytes(original)
    export.write_bytes(exported)
    for url in (str(tmp_path / "files"), f"sqlite:///{tmp_path / 'x.db'}",
                f"{pg_url}?schema={pg_schema}"):
        out = json.loads(tl("--store", url, "import", str(dump), "--json").stdout)
        assert out == {"session_id": SID, "file": str(dump), "format": "threadline",
                       "entries": 6, "mapped": 6, "kept_raw": 0, "extra_fields": {},
                       "status": "copied"}
        again = tl("--store", url, "export", SID).stdout.encode("utf-8", "surrogateescape")
        assert again == exported, url
        # Importing again changes nothing and says so.
        assert "already present" in tl("--store", url, "import", str(export)).stdout


def test_import_refuses_to_overwrite_a_different_session(tmp_path: Path) -> None:
    make_hostile_store(tmp_path / "a")
    dump = tmp_path / "dump.jsonl"
    dump.write_bytes(FileStore(tmp_path / "a").path_for(SID).read_bytes())
    other = tmp_path / "b"
    asyncio.run(FileStore(other).create_session(SessionRecord(id=SID)))
    proc = tl("--store", str(other), "import", str(dump), check=False)
    assert proc.returncode == 1 and "exists in the destination" in proc.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"type":"message"}\n')
    proc = tl("--store", str(other), "import", str(bad), check=False)
    assert proc.returncode == 1 and f"{bad} line 1" in proc.stderr


def test_export_markdown_reads_as_a_conversation(demo: Path) -> None:
    md = tl("--store", str(demo), "export", main_id(demo), "--format", "markdown").stdout
    assert md.startswith("# Session `demo-")
    assert "## User\n\nNever mind Lisbon." in md
    assert "Tool call `get_weather`:\n\n```json" in md and "(interrupted)" in md


def test_delete_asks_or_needs_yes_and_is_all_or_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for sid in ("a", "b"):
        asyncio.run(store.create_session(SessionRecord(id=sid)))
    proc = tl("--store", str(tmp_path), "delete", "a", check=False)
    assert proc.returncode == 1 and "--yes" in proc.stderr
    proc = tl("--store", str(tmp_path), "delete", "a", "nope", "--yes", check=False)
    assert proc.returncode == 1 and "'nope' not found" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]
    assert tl("--store", str(tmp_path), "delete", "a", "--yes").stdout == "deleted a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jsonl"]


def test_check_names_each_bad_file_and_checks_the_rest(demo: Path, tmp_path: Path) -> None:
    store = tmp_path / "s"
    store.mkdir()
    for f in demo.glob("*.jsonl"):
        (store / f.name).write_bytes(f.read_bytes())
    (store / "notes.jsonl").write_bytes(b"shopping list\n")
    proc = tl("--store", str(store), "check", check=False)
    assert proc.returncode == 1
    assert f"{store / 'notes.jsonl'} line 1" in proc.stdout
    assert proc.stdout.count("✓") == 2


def test_demo_honours_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    out = tl("--store", url, "demo", cwd=tmp_path).stdout
    assert "SIGKILL" in out and "appended by crash repair" in out
    rows = [json.loads(line) for line in tl("--store", url, "list", "--json", "--entries")
            .stdout.splitlines()]
    assert len(rows) == 2 and sorted(r["entries"] for r in rows) == [7, 9]
    assert not (tmp_path / "threadline-demo").exists()
    proc = tl("--store", "memory:", "demo", check=False)
    assert proc.returncode == 1 and "another process" in proc.stderr


def test_copy_summary_and_ctrl_c_says_how_to_resume(demo: Path, tmp_path: Path) -> None:
    db = tmp_path / "dst.db"

    async def prepare() -> None:
        async with SQLiteStore(db) as store:  # migrated, so the copy waits on our lock only
            await store.create_session(SessionRecord(id="already-here"))

    asyncio.run(prepare())
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")

    def interrupt(proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGINT)
        blocker.execute("ROLLBACK")

    code, out = tl_pty("copy", str(demo), f"sqlite:///{db}", until=b"copying sessions",
                       then=interrupt)
    assert code == 130, out
    assert b"run the same command again to resume" in out
    blocker.close()
    done = tl("copy", str(demo), f"sqlite:///{db}").stdout
    assert done.startswith("copied 2 sessions from ") and done.count("\n") == 1
    again = tl("copy", str(demo), f"sqlite:///{db}").stdout
    assert "2 already complete; 0 entries written" in again


def test_chat_prints_model_errors_on_stderr_and_exits_nonzero(tmp_path: Path) -> None:
    from support.wire_server import json_reply

    async def go() -> tuple[int | None, bytes, bytes]:
        from support.wire_server import WireServer

        async with WireServer() as server:
            server.reply(json_reply(401, {"error": {"message": "Incorrect API key \x1b[2J",
                                                    "type": "invalid_request_error"}}))
            env = dict(os.environ, OPENAI_API_KEY="k", OPENAI_BASE_URL=f"{server.url}/v1",
                       NO_COLOR="1")
            proc = await asyncio.create_subprocess_exec(
                *CLI, "--store", str(tmp_path), "chat", "c", "--model", "openai:gpt-test",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env)
            out, err = await asyncio.wait_for(proc.communicate(b"hi\n"), 60)
            return proc.returncode, out, err

    code, _, err = asyncio.run(go())
    assert code == 1
    assert err.startswith(b"error: the model failed: ") and b"Incorrect API key" in err
    assert b"\x1b" not in err
    shown = tl("--store", str(tmp_path), "show", "c").stdout
    assert "[error: " in shown and "Incorrect API key" in shown


def test_chat_recalls_the_conversation_and_branch_continues_from_an_entry(
    tmp_path: Path,
) -> None:
    from support.cli import chat_reply as reply
    from support.wire_server import WireServer

    async def go() -> list[bytes]:
        outs = []
        async with WireServer() as server:
            server.reply(reply("First answer."), reply("Second answer."),
                         reply("Branched answer."))
            env = dict(os.environ, OPENAI_API_KEY="k", OPENAI_BASE_URL=f"{server.url}/v1",
                       NO_COLOR="1")
            for verb, line in (("chat", "one"), ("chat", "two"), ("branch", "three")):
                argv = [verb, "c"]
                if verb == "branch":
                    shown = tl("--store", str(tmp_path), "show", "c").stdout.splitlines()
                    argv.append(shown[1].split()[0])  # the first answer's short id
                proc = await asyncio.create_subprocess_exec(
                    *CLI, "--store", str(tmp_path), *argv, "--model", "openai:gpt-test",
                    stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, env=env)
                out, err = await asyncio.wait_for(proc.communicate(f"{line}\n".encode()), 60)
                assert proc.returncode == 0, err
                outs.append(out)
        third = server.received[2].body["messages"]
        assert [m.get("content") for m in third] == ["one", "First answer.", "three"]
        return outs

    first, second, _ = asyncio.run(go())
    assert b"new session c" in first
    assert b"resuming session c" in second and b"user one" in second
    assert b"assistant First answer." in second
    tree = json.loads(tl("--store", str(tmp_path), "tree", "c", "--json").stdout)
    answer = tree["entries"][1]["id"]
    assert [e["parent_id"] for e in tree["entries"]].count(answer) == 2  # two branches
