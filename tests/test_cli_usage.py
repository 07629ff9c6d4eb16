"""``threadline usage`` as a real child process (S66 through the CLI, S28 escaping)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import urllib.request
from pathlib import Path

from support.cli import CLI, tl
from threadline import durable
from threadline.ai import ModelInfo, Usage
from threadline.stores import FileStore
from threadline.testing import ScriptedModel, Turn

HOSTILE = "evil\x1b[31m\u202etxt.exe"


async def build(root: Path) -> None:
    store = FileStore(root)
    model = ScriptedModel([Turn.text("a", usage=Usage(input_tokens=100, output_tokens=10)),
                           Turn.text("b", usage=Usage(input_tokens=200, output_tokens=20))])
    parent = await durable.open(durable.model(model), store=store, session_id="p")
    await parent.run("one").collect()
    await parent.fork("c")
    hostile = ScriptedModel([Turn.text("c", usage=Usage(input_tokens=7, cache_read_tokens=3))],
                            info=ModelInfo(provider="acme", id=HOSTILE))
    child = await durable.open(durable.model(hostile), store=store, session_id="c")
    await child.run("two").collect()
    await parent.run("three").collect()


def test_s66_cli_usage_totals_groups_and_json(tmp_path: Path) -> None:
    root = tmp_path / "s"
    asyncio.run(build(root))
    whole = json.loads(tl("--store", str(root), "usage", "--json").stdout)
    # The fork's copy of the parent's first reply is not counted again.
    assert whole["total"]["total_tokens"] == 110 + 220 + 10
    assert whole["total"]["calls"] == 3 and whole["sessions"] == 2
    forks = json.loads(tl("--store", str(root), "usage", "p", "--scope", "with_forks",
                          "--json").stdout)
    assert forks["total"] == whole["total"]
    path = json.loads(tl("--store", str(root), "usage", "c", "--scope", "path",
                         "--json").stdout)
    assert path["total"]["total_tokens"] == 110 + 10
    by_model = json.loads(tl("--store", str(root), "usage", "--by", "model", "--json").stdout)
    keys = {g["key"]: g["total_tokens"] for g in by_model["groups"]}
    assert keys == {"scripted:scripted-model": 330, f"acme:{HOSTILE}": 10}
    by_day = json.loads(tl("--store", str(root), "usage", "--by", "day", "--json").stdout)
    assert len(by_day["groups"]) == 1 and by_day["groups"][0]["calls"] == 3
    # The table escapes the hostile model name; the JSON escapes it too.
    table = tl("--store", str(root), "usage", "--by", "model").stdout
    assert "\x1b" not in table and "\u202e" not in table
    assert "\\x1b" in table and "\\u202e" in table
    assert "\x1b" not in tl("--store", str(root), "usage", "--by", "model", "--json").stdout


def test_cli_usage_cost_from_a_price_file(tmp_path: Path) -> None:
    root = tmp_path / "s"
    asyncio.run(build(root))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"scripted": {"*": {"input": 1.0, "output": 2.0}}}))
    out = tl("--store", str(root), "usage", "--by", "session", "--prices", str(prices),
             "--json")
    data = json.loads(out.stdout)
    assert data["total"]["cost"] == (300 * 1.0 + 30 * 2.0) / 1_000_000
    assert data["unpriced"] == [f"acme:{HOSTILE}"]
    assert "no price for acme:evil\\x1b" in out.stderr  # named, escaped, not guessed
    table = tl("--store", str(root), "usage", "--prices", str(prices)).stdout
    assert "COST" in table and "0.0004" in table
    bad = tmp_path / "bad.json"
    bad.write_text('{"scripted": {"m": {"input": "free"}}}')
    failed = tl("--store", str(root), "usage", "--prices", str(bad), check=False)
    assert failed.returncode == 1 and "bad.json" in failed.stderr
    assert "Traceback" not in failed.stderr
    missing = tl("--store", str(root), "usage", "nobody", check=False)
    assert missing.returncode == 1 and "nobody" in missing.stderr
    scope = tl("--store", str(root), "usage", "--scope", "path", check=False)
    assert scope.returncode == 1 and "needs a SESSION" in scope.stderr


def test_s66_viewer_usage_table_with_cost_and_escaping(tmp_path: Path) -> None:
    root = tmp_path / "s"
    asyncio.run(build(root))
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"scripted": {"*": {"input": 1.0, "output": 2.0}}}))
    proc = subprocess.Popen(
        [*CLI, "--store", str(root), "serve", "--port", "0", "--prices", str(prices)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200"})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" on ", 1)[1].split(" ", 1)[0]
        with urllib.request.urlopen(url + "session?id=c", timeout=30) as resp:
            page = resp.read().decode()
        with urllib.request.urlopen(url + "session?id=p", timeout=30) as resp:
            parent = resp.read().decode()
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    usage = page.split('<section class="usage"', 1)[1].split("</section>", 1)[0]
    assert "\x1b" not in usage and "\u202e" not in usage and "acme:evil" in usage
    # The child's own call only (10 tokens); its path adds the parent's first reply (110).
    assert ">this session</td>" in usage and ">active path, with forked-from</td>" in usage
    assert "<td class=\"num\">10</td>" in usage and "<td class=\"num\">120</td>" in usage
    assert "no price" in usage  # the hostile model has none: said, not guessed
    parent_usage = parent.split('<section class="usage"', 1)[1].split("</section>", 1)[0]
    assert "<th>cost</th>" in parent_usage and "0.0004" in parent_usage
