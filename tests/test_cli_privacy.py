"""The command and the viewer on an encrypted store, with a key, without one, after erasure.

Every test runs the real ``threadline`` command in a child process. The key
comes from ``--key-file`` or the environment; without it the tree and the
ids show, the content reads ``[locked]`` and a notice says why.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, urlsplit

import msgspec
import pytest

from support.cli import tl
from threadline import durable
from threadline.ai import UserMessage
from threadline.privacy import EncryptedStore, Keyring, LocalKeyProvider
from threadline.session import SessionRecord
from threadline.stores import FileStore

MARKER = "MARKER-cli-91c2"


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """A file store sealed under keyring/ with kek; sessions a (user-42), its fork, and b."""
    (tmp_path / "kek").write_text(LocalKeyProvider.generate() + "\n")

    async def build() -> None:
        store = EncryptedStore(FileStore(tmp_path / "store"),
                               Keyring(tmp_path / "keyring",
                                       LocalKeyProvider.from_file(tmp_path / "kek")),
                               subject=lambda r: {"a": "user-42", "b": "user-7"}.get(r.id))
        a = await durable.open(None, store=store, session_id="a")
        await a.append(UserMessage.of(f"{MARKER} in a"), UserMessage.of("second of a"))
        fork = await a.fork("a-fork")
        await fork.append(UserMessage.of(f"{MARKER} in the fork"))
        b = await durable.open(None, store=store, session_id="b")
        await b.append(UserMessage.of("b says hello"))

    asyncio.run(build())
    return tmp_path


def keyed(world: Path) -> list[str]:
    return ["--store", str(world / "store"), "--keyring", str(world / "keyring"),
            "--key-file", str(world / "kek")]


def test_with_a_key_on_the_command_line_or_in_the_environment_content_shows(
    world: Path,
) -> None:
    shown = tl(*keyed(world), "show", "a-fork").stdout
    assert f"{MARKER} in a" in shown and f"{MARKER} in the fork" in shown
    env = {"THREADLINE_STORE": str(world / "store"),
           "THREADLINE_KEYRING": str(world / "keyring"),
           "THREADLINE_KEY": (world / "kek").read_text().strip()}
    assert f"{MARKER} in a" in tl("show", "a", env=env).stdout
    assert "b says hello" in tl("export", "b", "--format", "markdown", env=env).stdout
    wrong = {**env, "THREADLINE_KEY": LocalKeyProvider.generate()}
    failed = tl("show", "a", env=wrong, check=False)
    assert failed.returncode == 1 and "the wrong key?" in failed.stderr


def test_without_a_key_the_tree_shows_and_the_content_is_locked(world: Path) -> None:
    store = ["--store", str(world / "store")]
    for options in (store, [*store, "--keyring", str(world / "keyring")]):
        shown = tl(*options, "show", "a")
        assert shown.stdout.count("[locked] message") == 2 and MARKER not in shown.stdout
        assert "locked" in shown.stderr and "notice:" in shown.stderr
        tree = json.loads(tl(*options, "tree", "a", "--json").stdout)
        assert [e["type"] for e in tree["entries"]] == ["sealed", "sealed"]
        listed = {json.loads(line)["id"] for line in tl(*options, "list", "--json").stdout
                  .splitlines()}
        assert listed == {"a", "a-fork", "b"}
    # A write needs the key; without it nothing is written.
    before = sorted(p.name for p in (world / "store").iterdir())
    forked = tl("--store", str(world / "store"), "--keyring", str(world / "keyring"),
                "fork", "a", "--id", "nope", check=False)
    assert forked.returncode == 1 and "key-encryption key" in forked.stderr
    assert sorted(p.name for p in (world / "store").iterdir()) == before


def test_after_erasure_every_view_says_erased(world: Path) -> None:
    asked = tl(*keyed(world), "erase", "--subject", "user-42", check=False)
    assert asked.returncode == 1 and "--yes" in asked.stderr  # stdin is not a terminal
    done = json.loads(tl(*keyed(world), "erase", "--subject", "user-42", "--yes",
                         "--json").stdout)
    assert done["versions"] == 1 and done["sessions"] == ["a", "a-fork"]
    for sid in ("a", "a-fork"):
        shown = tl(*keyed(world), "show", sid).stdout
        assert "[erased] message" in shown and MARKER not in shown
    assert "[erased]" in tl(*keyed(world), "export", "a", "--format", "markdown").stdout
    page = tl(*keyed(world), "export", "a-fork", "--format", "html").stdout
    assert "[erased]" in page and MARKER not in page
    assert "b says hello" in tl(*keyed(world), "show", "b").stdout
    # Without the key-encryption key an erased entry still says erased, not locked.
    unkeyed = tl("--store", str(world / "store"), "--keyring", str(world / "keyring"),
                 "show", "a").stdout
    assert unkeyed.count("[erased] message") == 2


def test_erase_a_session_with_its_forks(world: Path) -> None:
    out = tl(*keyed(world), "erase", "--session", "a", "--with-forks", "--yes", "--json")
    assert [json.loads(line)["deleted"] for line in out.stdout.splitlines()] == ["a", "a-fork"]
    assert "backups" in tl(*keyed(world), "erase", "--session", "b", "--yes").stderr
    assert tl(*keyed(world), "list", "--json").stdout == ""


def test_check_reports_the_one_damaged_envelope(world: Path) -> None:
    path = world / "store" / "a.jsonl"
    lines = path.read_bytes().split(b"\n")
    batch = msgspec.json.decode(lines[1])
    entry = batch["entries"][0] if batch.get("type") == "batch" else batch
    env = bytearray(msgspec.json.decode(msgspec.json.encode(entry["env"]), type=bytes))
    env[-1] ^= 1
    entry["env"] = bytes(env)
    lines[1] = msgspec.json.encode(batch)
    path.write_bytes(b"\n".join(lines))
    checked = tl(*keyed(world), "check", check=False)
    assert checked.returncode == 1
    (bad,) = [line for line in checked.stdout.splitlines() if line.startswith("! a:")]
    assert entry["id"] in bad and "does not authenticate" in bad
    assert "✓ b: 1 entry" in checked.stdout
    shown = tl(*keyed(world), "show", "a").stdout  # the others still read
    assert "second of a" in shown and "[locked]" in shown


def test_export_while_encrypted_imports_elsewhere_still_sealed(world: Path) -> None:
    exported = tl("--store", str(world / "store"), "export", "a").stdout  # no key at all
    assert MARKER not in exported and '"type":"sealed"' in exported
    (world / "a.jsonl").write_text(exported)
    tl("--store", str(world / "elsewhere"), "import", str(world / "a.jsonl"))
    moved = tl("--store", str(world / "elsewhere"), "--keyring", str(world / "keyring"),
               "--key-file", str(world / "kek"), "show", "a").stdout
    assert f"{MARKER} in a" in moved


def test_keys_encrypt_a_plaintext_store_then_rotate_the_kek(tmp_path: Path) -> None:
    async def plain() -> None:
        store = FileStore(tmp_path / "store")
        await store.create_session(SessionRecord(id="old"))
        agent = await durable.open(None, store=store, session_id="old")
        await agent.append(UserMessage.of(f"{MARKER} from before encryption"))

    asyncio.run(plain())
    tl("keys", "generate", str(tmp_path / "k1"))
    assert oct((tmp_path / "k1").stat().st_mode & 0o777) == "0o600"
    assert tl("keys", "generate", str(tmp_path / "k1"), check=False).returncode == 1
    k1 = ["--store", str(tmp_path / "store"), "--keyring", str(tmp_path / "keyring"),
          "--key-file", str(tmp_path / "k1")]
    refused = tl(*k1, "show", "old", check=False)
    assert refused.returncode == 1 and "is not sealed" in refused.stderr
    # Copying into a new store seals the copy; encrypting in place seals the store.
    tl(*k1, "copy", str(tmp_path / "store"), str(tmp_path / "sealed-copy"))
    assert MARKER.encode() not in (tmp_path / "sealed-copy" / "old.jsonl").read_bytes()
    assert "sealed old: rewrote its 1 entries" in tl(*k1, "keys", "encrypt").stdout
    assert MARKER.encode() not in (tmp_path / "store" / "old.jsonl").read_bytes()
    assert f"{MARKER} from before" in tl(*k1, "show", "old").stdout
    tl("keys", "generate", str(tmp_path / "k2"))
    log = (tmp_path / "store" / "old.jsonl").read_bytes()
    rotated = json.loads(tl(*k1, "keys", "rotate", "--new-key-file", str(tmp_path / "k2"),
                            "--json").stdout)
    assert rotated["rewrapped"] == 2 and rotated["unchanged"] == 0  # a data key and the index
    assert (tmp_path / "store" / "old.jsonl").read_bytes() == log
    k2 = [*k1[:4], "--key-file", str(tmp_path / "k2")]
    assert f"{MARKER} from before" in tl(*k2, "show", "old").stdout
    assert "the wrong key?" in tl(*k1, "show", "old", check=False).stderr


def test_the_viewer_serves_an_encrypted_store_with_the_key_from_the_environment(
    world: Path,
) -> None:
    env = {**os.environ, "COLUMNS": "200", "THREADLINE_STORE": str(world / "store"),
           "THREADLINE_KEYRING": str(world / "keyring")}
    pages = {}
    for key in (None, (world / "kek").read_text().strip()):
        run_env = env if key is None else {**env, "THREADLINE_KEY": key}
        proc = subprocess.Popen([sys.executable, "-c", "from threadline.cli import main; main()",
                                 "serve", "--port", "0"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=run_env)
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split(" on ", 1)[1].split(" ", 1)[0]
            parts = urlsplit(url)
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
            conn.request("GET", "/session?id=" + quote("a-fork", safe=""))
            response = conn.getresponse()
            assert response.status == 200
            pages[key is not None] = response.read().decode()
        finally:
            proc.kill()
            proc.communicate(timeout=30)
    assert "[locked]" in pages[False] and MARKER not in pages[False]
    assert f"{MARKER} in the fork" in pages[True] and "[locked]" not in pages[True]
