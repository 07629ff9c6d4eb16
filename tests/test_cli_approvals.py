"""``threadline pending`` / ``approve`` / ``deny``, and ledger records in ``show``/``tree``,
run as real child processes against a file store (S23, S24)."""

from __future__ import annotations

from pathlib import Path

from support.cli import asking_session, tl


def test_s23_cli_lists_approves_and_shows_the_ledger(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    asking_session(root)
    store = ["--store", str(root)]
    out = tl(*store, "pending").stdout
    assert "t-1" in out and "big" in out and "refund" in out and '{"amount":900}' in out
    assert "big refund" in out
    shown = tl(*store, "show", "t-1").stdout
    assert "approval requested for refund call big" in shown
    assert "started refund call small (attempt 1, key " in shown
    assert "tracked calls: small, big" in shown
    done = tl(*store, "approve", "t-1", "big", "--by", "ann", "--reason", "ok'd by phone")
    assert "approved call big in session t-1" in done.stdout
    assert "approved call big by ann: ok'd by phone" in tl(*store, "tree", "t-1").stdout
    assert "no tool calls await approval" in tl(*store, "pending").stdout


def test_s24_cli_refuses_decisions_with_one_line_errors(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    asking_session(root)
    store = ["--store", str(root)]
    tl(*store, "deny", "t-1", "big", "--reason", "[bold]fraud[/bold]")
    assert "denied call big: [bold]fraud[/bold]" in tl(*store, "show", "t-1").stdout  # literal
    again = tl(*store, "approve", "t-1", "big", check=False)
    assert again.returncode == 1 and "Traceback" not in again.stderr
    assert "already denied" in again.stderr and len(again.stderr.strip().splitlines()) <= 2
    small = tl(*store, "approve", "t-1", "small", check=False)
    assert small.returncode == 1 and "has no approval request" in small.stderr
    missing = tl(*store, "deny", "nope", "big", "--reason", "x", check=False)
    assert missing.returncode == 1 and "nope" in missing.stderr
    assert not (root / "nope.jsonl").exists()  # deciding never creates a session
    usage = tl(*store, "deny", "t-1", "big", check=False)
    assert usage.returncode == 2 and "--reason" in usage.stderr
