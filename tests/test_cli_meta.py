"""``threadline meta`` and ``list --owner/--tenant/--label/--sort`` (S61, S62)."""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import tl


def test_s61_meta_sets_and_shows_and_list_filters_and_sorts(tmp_path: Path) -> None:
    store = ["--store", f"sqlite:///{tmp_path / 's.db'}"]
    assert tl(*store, "demo").returncode == 0
    ids = [json.loads(line)["id"] for line in tl(*store, "list", "--json").stdout.splitlines()]
    older, newer = ids[1], ids[0]
    hostile = "Weather \u202e<img onerror=x>\x1b[2J"
    shown = tl(*store, "meta", older, "--title", hostile, "--owner", "ann",
               "--label", "tier=gold", "--label", "x=1")
    assert shown.returncode == 0, shown.stderr
    assert "\u202e" not in shown.stdout and "\x1b" not in shown.stdout
    assert "\\u202e" in shown.stdout and "gold" in shown.stdout
    got = json.loads(tl(*store, "meta", older, "--unlabel", "x", "--json").stdout)
    assert got == {"id": older, "title": hostile, "owner": "ann", "tenant": None,
                   "labels": {"tier": "gold"}}
    listed = [json.loads(line) for line in tl(*store, "list", "--owner", "ann", "--sort",
                                              "activity", "--json").stdout.splitlines()]
    assert [(r["id"], r["title"]) for r in listed] == [(older, hostile)]
    # The change was the newest activity: it leads the activity order.
    by_activity = tl(*store, "list", "--sort", "activity", "--json").stdout.splitlines()
    assert json.loads(by_activity[0])["id"] == older
    assert json.loads(tl(*store, "list", "--json").stdout.splitlines()[0])["id"] == newer
    table = tl(*store, "list", "--label", "tier=gold").stdout
    assert "TITLE" in table and "\\u202e" in table and newer not in table
    # Clearing with '' and bad input.
    assert json.loads(tl(*store, "meta", older, "--title", "", "--json").stdout)["title"] is None
    assert tl(*store, "list", "--label", "novalue", check=False).returncode == 2
    assert tl(*store, "list", "--sort", "size", check=False).returncode == 2
    bad = tl(*store, "meta", older, "--owner", "\udcff", check=False)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert tl(*store, "meta", "no-such-session", check=False).returncode == 1
