"""S28: the CLI prints stored and user-given text literally and never creates a store on a read.

A session full of terminal escapes, bidi overrides and rich markup (in its id,
message text, tool names and arguments, an error message, a custom kind and
an unknown entry type) goes through every verb, once on pipes and once on a
pseudo-terminal. No escape sequence from the content may reach the output;
the content must still be there, written as visible escapes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.cli import HOSTILE, MARKUP, SID, make_hostile_store, tl, tl_pty
from threadline.session import SessionRecord
from threadline.stores import FileStore

EXPORT_NAME = "export [bold]x[red] \x1b[2J.jsonl"

# Byte strings that would act on a terminal if the content reached it raw.
FORBIDDEN = [b"\x1b[2J", b"\x1b]", b"\x1b[5;35m", b"\x07", b"\xc2\x9b", b"\xe2\x80\xae",
             b"\x1bP", b"\x1b\\"]


def verbs(store: Path, ids: list[str], tmp: Path) -> list[tuple[list[str], int]]:
    """(argv, expected exit status) for every verb, in an order that keeps them valid."""
    s = ["--store", str(store)]
    exported = tmp / EXPORT_NAME
    return [
        (["--store", str(tmp / f"no{MARKUP}\x1b[2J"), "list"], 1),
        ([*s, "list"], 0), ([*s, "list", "--json"], 0),
        ([*s, "show", SID], 0), ([*s, "show", SID, "--json"], 0),
        ([*s, "show", SID, "--at", ids[1][-8:], "--tail", "1"], 0),
        ([*s, "tree", SID], 0), ([*s, "tree", SID, "--json"], 0),
        ([*s, "export", SID], 0), ([*s, "export", SID, "--format", "messages"], 0),
        ([*s, "export", SID, "--format", "markdown"], 0),
        ([*s, "check"], 0), ([*s, "check", "--json"], 0),
        ([*s, "fork", SID, "--id", f"fork{MARKUP}\x1b[2J"], 0),
        ([*s, "fork", SID, "--json"], 0),
        (["copy", str(store), f"sqlite:///{tmp / 'copy.db'}"], 0),
        (["copy", str(store), f"sqlite:///{tmp / 'copy.db'}", "--json"], 0),
        (["--store", f"sqlite:///{tmp / 'copy.db'}", "list", f"{MARKUP}\x1b[2J"], 2),
        ([*s, "delete", f"fork{MARKUP}\x1b[2J", "--yes"], 0),
        (["--store", str(tmp / "other"), "import", str(exported)], 0),
        # Errors quote what the user typed, literally.
        ([*s, "show", "x[/]y"], 1), ([*s, "show", "x[bold]y"], 1),
        ([*s, "show", SID, "--at", "\x1b[2Jnope"], 1),
    ]


def check_output(out: bytes, *, terminal: bool) -> None:
    for bad in FORBIDDEN:
        assert bad not in out, f"{bad!r} reached the output:\n{out!r}"
    if not terminal:
        assert b"\x1b" not in out, out  # no colour on a pipe either


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "pty"])
def test_s28_hostile_content_through_every_verb(tmp_path: Path, terminal: bool) -> None:
    store = tmp_path / "store"
    ids = make_hostile_store(store)
    (tmp_path / "other").mkdir()
    (tmp_path / EXPORT_NAME).write_bytes(FileStore(store).path_for(SID).read_bytes())
    seen: dict[tuple[str, ...], bytes] = {}
    for argv, status in verbs(store, ids, tmp_path):
        if terminal:
            code, out = tl_pty(*argv)
        else:
            proc = tl(*argv, check=False)
            code, out = proc.returncode, (proc.stdout + proc.stderr).encode()
        assert code == status, (argv, out)
        assert b"Traceback" not in out, (argv, out)
        if argv[-2:] == ["export", SID] and not terminal:
            # The stored bytes exactly, as `cat` of the file would give: JSON
            # escapes every C0 control, so no escape sequence can begin.
            assert b"\x1b" not in out and b"\x07" not in out
        else:
            check_output(out, terminal=terminal)
        seen[tuple(argv[2:] if argv[0] == "--store" else argv)] = out
    # The content is there, written out visibly, with its markup as typed.
    for key in (("list",), ("show", SID), ("tree", SID), ("export", SID, "--format", "markdown")):
        assert MARKUP.encode() in seen[key], (key, seen[key])
        assert b"\\x1b]0;pwned" in seen[key] or b"\\x1b[2J" in seen[key], (key, seen[key])
    shown = seen[("show", SID)]
    assert b"[bold]x[/bold] [/]" in shown and b"\\x9b2J" in shown and b"\\u202eabc" in shown
    assert b"error:" in shown  # the failed model turn is shown, with its reason
    assert b"unknown entry type" in shown
    errors = seen[("show", "x[/]y")] + seen[("show", "x[bold]y")]
    assert b"'x[/]y' not found" in errors and b"'x[bold]y' not found" in errors


def test_s28_json_output_decodes_to_the_stored_text(tmp_path: Path) -> None:
    store = tmp_path / "store"
    make_hostile_store(store)
    listed = [json.loads(line) for line in tl("--store", str(store), "list", "--json")
              .stdout.splitlines()]
    assert [row["id"] for row in listed] == [SID]
    shown = [json.loads(line) for line in tl("--store", str(store), "show", SID, "--json")
             .stdout.splitlines()]
    assert shown[0]["message"]["content"][0]["text"] == HOSTILE
    # On a terminal the same JSON, with C1 and bidi characters as \\u escapes.
    code, out = tl_pty("--store", str(store), "show", SID, "--json")
    assert code == 0
    first = json.loads(out.replace(b"\r\n", b"\n").splitlines()[0])
    assert first["message"]["content"][0]["text"] == HOSTILE


@pytest.mark.parametrize(("package", "argv", "hint"), [
    ("psycopg", ["--store", "postgresql://u@h/db", "list"], "'threadline[postgres]'"),
    ("openai", ["chat", "c", "--model", "openai:gpt-x"], "'threadline[openai]'"),
])
def test_s28_install_hints_keep_their_brackets(
    tmp_path: Path, package: str, argv: list[str], hint: str
) -> None:
    # The extra's package is "missing": a stand-in on the path that fails to import.
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("raise ImportError('not installed')\n")
    (tmp_path / "store").mkdir()
    proc = tl("--store", str(tmp_path / "store"), *argv, check=False,
              env={"PYTHONPATH": str(tmp_path), "OPENAI_API_KEY": "k"}, input="hi\n")
    assert proc.returncode == 1
    assert "pip install" in proc.stderr, proc.stderr
    assert f" {hint}" in proc.stderr, proc.stderr


READ_ONLY = [
    ["--store", "{tmp}/no/such/dir", "list"],
    ["--store", "sqlite:{tmp}/nope.db", "list"],
    ["--store", "sqlite:///{tmp}/nope.db", "show", "x"],
    ["--store", "{tmp}/no/such/dir", "check"],
    ["--store", "{tmp}/no/such/dir", "tree", "x"],
    ["--store", "{tmp}/no/such/dir", "export", "x"],
    ["--store", "{tmp}/no/such/dir", "fork", "x"],
    ["--store", "{tmp}/no/such/dir", "delete", "x", "--yes"],
    ["copy", "{tmp}/no/such/dir", "{tmp}/dst"],
    ["copy", "sqlite:{tmp}/nope.db", "{tmp}/dst"],
    ["list", "--store", "{tmp}/no/such/dir"],
]


@pytest.mark.parametrize("argv", READ_ONLY, ids=[" ".join(a) for a in READ_ONLY])
def test_s28_reading_a_missing_store_is_an_error_and_creates_nothing(
    tmp_path: Path, argv: list[str]
) -> None:
    args = [a.format(tmp=tmp_path) for a in argv]
    proc = tl(*args, check=False, cwd=tmp_path)
    assert proc.returncode == 1, proc
    assert proc.stderr.startswith("error: no "), proc.stderr
    assert str(tmp_path) in proc.stderr and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(os.listdir(tmp_path)) == [], "a read created something"


@pytest.mark.parametrize("url", ["sqllite:y.db", "sqllite:///y.db", "fiel:x"])
def test_s28_unknown_scheme_is_an_error_not_a_folder(tmp_path: Path, url: str) -> None:
    make_hostile_store(tmp_path / "src")
    for argv in (["--store", url, "list"], ["copy", str(tmp_path / "src"), url]):
        proc = tl(*argv, check=False, cwd=tmp_path)
        assert proc.returncode == 1
        assert "unknown store URL scheme" in proc.stderr and url in proc.stderr
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_s28_postgres_connection_errors_are_one_line_with_the_cause(pg_url: str) -> None:
    from urllib.parse import urlsplit

    parts = urlsplit(pg_url)
    missing = parts._replace(path="/no_such_db_h5").geturl()
    proc = tl("--store", missing, "list", check=False)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr  # one line: no pool retry log
    assert 'database "no_such_db_h5" does not exist' in proc.stderr
    refused = "postgresql://postgres@127.0.0.1:1/test?connect_timeout=2"
    proc = tl("--store", refused, "list", check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "127.0.0.1" in proc.stderr and "refused" in proc.stderr.lower()
    # A read names a schema that was never created: an error, and it stays uncreated.
    proc = tl("--store", f"{pg_url}?schema=tl_h5_never_made", "list", check=False)
    assert proc.returncode == 1 and "tl_h5_never_made" in proc.stderr
    assert "do not exist" in proc.stderr
    import psycopg

    with psycopg.connect(pg_url) as conn:
        row = conn.execute("SELECT count(*) FROM pg_namespace WHERE nspname = "
                           "'tl_h5_never_made'").fetchone()
    assert row == (0,)


def test_s28_torn_last_line_is_a_one_line_notice(tmp_path: Path) -> None:
    ids = make_hostile_store(tmp_path)
    with FileStore(tmp_path).path_for(SID).open("ab") as f:
        f.write(b'{"type":"message","id":"torn"')
    proc = tl("--store", str(tmp_path), "show", SID, check=False)
    assert proc.returncode == 0
    assert "RuntimeWarning" not in proc.stderr and "warnings.warn" not in proc.stderr
    notices = proc.stderr.splitlines()
    assert len(notices) == 1 and notices[0].startswith("notice: "), proc.stderr
    assert ids[-1][-6:] in proc.stdout  # everything before the torn line is shown
    # Verbs that open the session through durable.open say it the same way.
    proc = tl("--store", str(tmp_path), "fork", SID, "--id", "f", check=False)
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr
    assert all(line.startswith("notice: ") for line in proc.stderr.splitlines()), proc.stderr


async def test_s28_open_store_create_false_reads_existing_stores(
    tmp_path: Path, pg_url: str, pg_schema: str
) -> None:
    from threadline.errors import StoreError
    from threadline.stores import open_store

    urls = [str(tmp_path / "files"), f"sqlite:///{tmp_path / 'x.db'}",
            f"{pg_url}?schema={pg_schema}"]
    for url in urls:
        with pytest.raises(StoreError, match=r"do(es)? not exist"):
            reader = open_store(url, create=False)
            try:
                await reader.list_sessions()
            finally:
                await reader.close()
        writer = open_store(url)
        await writer.create_session(SessionRecord(id="s"))
        await writer.close()
        reader = open_store(url, create=False)
        try:
            assert [r.id for r in (await reader.list_sessions()).sessions] == ["s"]
        finally:
            await reader.close()


@pytest.mark.parametrize("terminal", [False, True], ids=["pipe", "pty"])
def test_s28_corrupt_line_with_markup_is_reported_literally(
    tmp_path: Path, terminal: bool
) -> None:
    make_hostile_store(tmp_path)
    path = FileStore(tmp_path).path_for(SID)
    with path.open("ab") as f:
        f.write(b'{"type":"message","id":"[/bold]\\u001b[2J" [/] \x1b[2J\n')
    where = b"line %d" % path.read_bytes().count(b"\n")  # the last line
    for argv in (["check"], ["show", SID], ["check", "--json"]):
        if terminal:
            code, out = tl_pty("--store", str(tmp_path), *argv)
        else:
            proc = tl("--store", str(tmp_path), *argv, check=False)
            code, out = proc.returncode, (proc.stdout + proc.stderr).encode()
        assert code == 1, out
        assert b"Traceback" not in out and where in out, out
        assert b"[/bold]" in out, out
        check_output(out, terminal=terminal)
