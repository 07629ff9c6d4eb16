"""The ``threadline`` command as a new user meets it (S28), run as real child processes.

What it prints hides nothing (tag, zero-width and soft-hyphen characters
are escaped like the bidi ones), bad numbers are usage errors, errors speak
of commands rather than Python functions, counts read as English, columns
line up, tool arguments are whole on a pipe, custom-message content is
shown, the custom entries an importer leaves are hidden unless asked for,
and ``check`` reads a folder only through the store, so a link, a FIFO or
a file that is no session is reported and never followed or read.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from support.cli import CLI, tl
from threadline.ai import AssistantMessage, TextPart, ToolCall, UserMessage
from threadline.durable import ToolPlan
from threadline.session import CustomEntry, CustomMessageEntry, Entry, MessageEntry, SessionRecord
from threadline.stores import FileStore

# Characters that hide text or change what is read, beyond C0, C1 and bidi.
HIDING = {
    "\U000e0041": "\\U000e0041",  # a tag character: invisible ASCII ("A")
    "\U000e0001": "\\U000e0001",  # the language tag
    "\u200b": "\\u200b",  # zero-width space
    "\u200d": "\\u200d",  # zero-width joiner
    "\u2060": "\\u2060",  # word joiner
    "\u00ad": "\\xad",  # soft hyphen
    "\U000e0100": "\\U000e0100",  # a variation selector past the BMP: hides bytes
}
SECRET_TEXT = "p" + "".join(HIDING) + "q"


def write(root: Path, sid: str, entries: list[Entry]) -> None:
    async def go() -> None:
        store = FileStore(root)
        await store.create_session(SessionRecord(id=sid))
        if entries:
            await store.append_entries(sid, entries)
        await store.close()

    asyncio.run(go())


def chain(*items: MessageEntry | CustomEntry | CustomMessageEntry) -> list[Entry]:
    """The entries, each the child of the one before (their given ids kept)."""
    import msgspec

    out: list[Entry] = []
    for item in items:
        out.append(msgspec.structs.replace(item, parent_id=out[-1].id if out else None))
    return out


def user(text: str) -> MessageEntry:
    return MessageEntry(message=UserMessage.of(text))


def test_s28_show_tree_and_json_escape_tag_zero_width_and_soft_hyphen(tmp_path: Path) -> None:
    sid = "id" + "".join(HIDING)
    call = MessageEntry(message=AssistantMessage(
        content=(TextPart(text=SECRET_TEXT), ToolCall(id="c", name="t" + "\u200b",
                                                      arguments={"q": SECRET_TEXT})),
        stop_reason="tool_use"))
    write(tmp_path, sid, chain(user(SECRET_TEXT), call))
    store = ["--store", str(tmp_path)]
    for argv in (["show", sid], ["tree", sid], ["list"], ["show", sid, "--json"],
                 ["tree", sid, "--json"], ["list", "--json"], ["check"],
                 ["export", sid, "--format", "markdown"]):
        # (check exits 1: the call has no result)
        out = tl(*store, *argv, check=argv != ["check"]).stdout
        for raw, escaped in HIDING.items():
            assert raw not in out, (argv, escaped)
        if "--json" not in argv:
            for escaped in HIDING.values():
                assert escaped in out, (argv, escaped)
    # JSON escapes decode to the very same strings.
    shown = [json.loads(line) for line in tl(*store, "show", sid, "--json").stdout.splitlines()]
    assert shown[0]["message"]["content"] == SECRET_TEXT or shown[0]["message"]["content"][0][
        "text"] == SECRET_TEXT
    listed = json.loads(tl(*store, "list", "--json").stdout)
    assert listed["id"] == sid


def test_s28_negative_tail_and_zero_limit_are_usage_errors(tmp_path: Path) -> None:
    write(tmp_path, "s", chain(user("a"), user("b")))
    store = ["--store", str(tmp_path)]
    for argv in (["show", "s", "--tail", "-1"], ["list", "--limit", "0"],
                 ["list", "--limit", "-5"], ["show", "s", "--tail", "x"]):
        proc = tl(*store, *argv, check=False)
        assert proc.returncode == 2, (argv, proc)
        assert proc.stdout == ""
        # Says what is wrong in the command's terms, not the library's.
        assert not re.search(r"\w+_\w+\(|\w+\(\)|Traceback", proc.stderr), proc.stderr
        assert "--tail" in proc.stderr or "--limit" in proc.stderr
    assert tl(*store, "show", "s", "--tail", "0").returncode == 0
    assert tl(*store, "list", "--limit", "1").returncode == 0


def test_s28_errors_name_commands_not_python_functions(tmp_path: Path) -> None:
    from support.cli import asking_session

    root = tmp_path / "sessions"
    asking_session(root)
    small = tl("--store", str(root), "approve", "t-1", "small", check=False)
    assert small.returncode == 1 and "has no approval request" in small.stderr
    assert "threadline pending" in small.stderr
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    no_key = subprocess.run([*CLI, "--store", str(root), "chat", "--model", "openai:gpt-4o"],
                            check=False, capture_output=True, text=True, input="hi\n",
                            env=env, timeout=60)
    assert no_key.returncode == 1 and "OPENAI_API_KEY" in no_key.stderr
    for err in (small.stderr, no_key.stderr):
        assert not re.search(r"\w+\(\)|\w+=(\s|$|\))", err), err


def test_s28_check_reports_a_torn_line_once(tmp_path: Path) -> None:
    write(tmp_path, "s", chain(user("a"), user("b")))
    with (tmp_path / "s.jsonl").open("ab") as f:
        f.write(b'{"type":"message","id":"torn')
    proc = tl("--store", str(tmp_path), "check", check=False)
    said = proc.stdout + proc.stderr
    assert proc.returncode == 1 and said.count("torn last line") == 1, said


def test_s28_counts_read_as_english(tmp_path: Path) -> None:
    write(tmp_path, "s", chain(user("only one")))
    write(tmp_path, "t", chain(user("a"), user("b"), user("c")))
    store = ["--store", str(tmp_path)]
    assert "s: 1 entry" in tl(*store, "check", "s").stdout
    assert "t: 3 entries" in tl(*store, "check", "t").stdout
    assert "(1 entry)" in tl(*store, "fork", "s", "--id", "f").stdout
    assert "1 earlier entry" in tl(*store, "show", "t", "--tail", "2").stdout
    assert "2 earlier entries" in tl(*store, "show", "t", "--tail", "1").stdout
    said = tl(*store, "show", "t", "--tail", "2").stdout + tl(*store, "check").stdout
    assert not re.search(r"\b1 entries|\(s\)|\(y/ies\)", said), said


def test_s28_tool_arguments_are_whole_on_a_pipe(tmp_path: Path) -> None:
    arguments = {"query": "refund order 12 for the customer who wrote on Tuesday", "limit": 50}
    call = MessageEntry(message=AssistantMessage(
        content=(ToolCall(id="c", name="search", arguments=arguments),), stop_reason="tool_use"))
    write(tmp_path, "s", chain(user("q"), call))
    whole = json.dumps(arguments, separators=(",", ":"))
    assert whole in tl("--store", str(tmp_path), "show", "s").stdout
    assert whole in tl("--store", str(tmp_path), "tree", "s").stdout


def test_s28_pending_lines_up_its_columns(tmp_path: Path) -> None:
    from support.cli import asking_session

    root = tmp_path / "sessions"
    asking_session(root)
    out = tl("--store", str(root), "pending").stdout.splitlines()
    head, rows = out[0], out[1:]
    assert rows, out
    starts = [m.start() for m in re.finditer(r"\S+", head)]
    assert len(starts) == 6, head
    for row in rows:
        for start in starts[1:]:
            assert row[start - 1] == " " and row[start] != " ", (head, row)


def test_s28_custom_message_content_is_shown(tmp_path: Path) -> None:
    note = CustomMessageEntry(kind="memory", content=(TextPart(text="the user is vegan"),))
    write(tmp_path, "s", chain(user("what should I cook?"), note))
    store = ["--store", str(tmp_path)]
    for argv in (["show", "s"], ["tree", "s"], ["export", "s", "--format", "markdown"]):
        out = tl(*store, *argv).stdout
        assert "the user is vegan" in out and "memory" in out, argv


def test_s28_custom_entries_are_hidden_unless_asked_for(tmp_path: Path) -> None:
    extra = CustomEntry(kind="pi.extra", data={"cwd": "/home/ana"})
    plan = CustomEntry(kind="threadline.tool_plan", data=ToolPlan(calls=("c",)))
    write(tmp_path, "s", chain(user("first"), extra, user("second"), plan))
    store = ["--store", str(tmp_path)]
    for verb in ("show", "tree"):
        out = tl(*store, verb, "s").stdout
        assert "first" in out and "second" in out
        assert "pi.extra" not in out, verb
        assert "tracked calls: c" in out  # threadline's own records stay
        assert "1 custom entry hidden" in out and "--custom" in out, out
        shown = tl(*store, verb, "s", "--custom").stdout
        assert "custom (pi.extra)" in shown and "hidden" not in shown
    assert len(tl(*store, "show", "s", "--json").stdout.splitlines()) == 4  # scripts get all


def test_s28_check_reads_the_folder_only_through_the_store(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    write(root, "good", chain(user("hello")))
    secret = tmp_path / "outside.txt"
    secret.write_text("host-secret-4711\n")
    (root / "link.jsonl").symlink_to(secret)
    os.mkfifo(root / "pipe.jsonl")
    (root / "notes.jsonl").write_bytes(b"shopping list\n")
    proc = subprocess.run([*CLI, "--store", str(root), "check"], check=False,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NO_COLOR": "1"})
    assert proc.returncode == 1
    assert "host-secret-4711" not in proc.stdout + proc.stderr
    assert "shopping" not in proc.stdout + proc.stderr
    for name in ("link.jsonl", "pipe.jsonl", "notes.jsonl"):
        assert str(root / name) in proc.stdout, name
    assert "✓ good: 1 entry" in proc.stdout
    listed = subprocess.run([*CLI, "--store", str(root), "check", "--json"], check=False,
                            capture_output=True, text=True, timeout=60)
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(r["ok"] for r in rows) == [False, False, False, True]


def test_s28_approve_says_how_to_continue_and_continue_runs_the_call(tmp_path: Path) -> None:
    from support.cli import asking_session

    root = tmp_path / "sessions"
    asking_session(root)
    (tmp_path / "refunds.py").write_text(
        "from threadline import durable\n"
        "from threadline.ai import ToolContext, tool\n"
        "from threadline.testing import ScriptedModel, Text, Turn\n\n"
        "@tool(side_effects=True, approval=lambda a: a['amount'] > 100)\n"
        "async def refund(amount: int, ctx: ToolContext) -> str:\n"
        '    """Refund."""\n'
        "    return f'refunded {amount}'\n\n"
        "def factory():\n"
        "    return durable.model(ScriptedModel([Turn(Text('Both refunds are done.'))]),"
        " [refund])\n")
    store = ["--store", str(root)]
    done = tl(*store, "approve", "t-1", "big").stdout
    assert "threadline continue t-1" in done
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    out = tl(*store, "continue", "t-1", "--factory", "refunds:factory", env=env).stdout
    assert "refunded 900" in out and "Both refunds are done." in out
    shown = tl(*store, "show", "t-1").stdout
    assert "refunded 900" in shown and shown.count("refunded 900") == 1
    again = tl(*store, "continue", "t-1", "--factory", "refunds:factory", env=env)
    assert "refunded 900" not in again.stdout  # nothing left to continue
    bad = tl(*store, "continue", "t-1", "--factory", "refunds:nothing", env=env, check=False)
    assert bad.returncode == 1 and "refunds:nothing" in bad.stderr
    assert "Traceback" not in bad.stderr
    usage = tl(*store, "continue", "t-1", check=False)
    assert usage.returncode == 2 and "--factory" in usage.stderr


def test_s28_markdown_export_keeps_html_out_of_code_spans(tmp_path: Path) -> None:
    from markdown_it import MarkdownIt

    payload = "`<img src=x onerror=alert(1)>`"
    sid = f"s{payload}``{payload}"
    call = MessageEntry(message=AssistantMessage(
        content=(ToolCall(id="c", name=f"n{payload}", arguments={}),), stop_reason="tool_use"))
    from threadline.ai import ToolResultMessage

    result = MessageEntry(message=ToolResultMessage(tool_call_id="c", tool_name=f"n{payload}",
                                                    content=(TextPart(text="ok"),)))
    custom = CustomEntry(kind=f"k{payload}", data={})
    shown = CustomMessageEntry(kind=f"m{payload}", content=(TextPart(text=payload),))
    write(tmp_path, sid, chain(user(payload), call, result, custom, shown))
    markdown = tl("--store", str(tmp_path), "export", sid, "--format", "markdown").stdout
    html = MarkdownIt("commonmark").render(markdown)
    assert "<img" not in html, html
    # Each name is still there, in one code span, as text.
    assert html.count("&lt;img src=x onerror=alert(1)&gt;") >= 6, html
