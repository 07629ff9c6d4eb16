"""Encryption at rest: what the store beneath holds, and failing closed at every edge.

A sealed entry is bound to its session, entry, type and time; a wrong or
missing key, a plaintext row and a damaged envelope are each a typed error
naming session and entry, and none of them ever changes a stored byte. A new
key-encryption key rewraps the data keys without touching any store.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from threadline import durable
from threadline.ai import AssistantMessage, TextPart, ToolCall, ToolResultMessage, UserMessage
from threadline.errors import (
    CorruptLog,
    KeyUnavailable,
    MalformedEnvelope,
    PlaintextEntry,
    SessionNotFound,
    StoreError,
)
from threadline.privacy import (
    CIPHER,
    EncryptedStore,
    Keyring,
    LocalKeyProvider,
    migrate_session,
)
from threadline.session import (
    CustomEntry,
    Entry,
    MessageEntry,
    SealedEntry,
    SessionRecord,
    TreeIndex,
    encode_entry,
)
from threadline.stores import FileStore, MemoryStore, SQLiteStore, Store
from threadline.stores._rules import entry_type
from threadline.testing import FaultyStore, ScriptedModel, Turn, sample_entries

MARKER = "MARKER-7f3a9c the card is 4111 1111 1111 1111"
KEK = LocalKeyProvider(b"k" * 32)
OTHER_KEK = LocalKeyProvider(b"o" * 32)


def sealed_store(tmp_path: Path, inner: Store | None = None, provider: Any = KEK,
                 **options: Any) -> EncryptedStore:
    keys = Keyring(tmp_path / "keyring", provider, create=provider is not None)
    return EncryptedStore(inner if inner is not None else FileStore(tmp_path / "sessions"),
                          keys, **options)


def chain(*texts: str, parent: str | None = None) -> list[Entry]:
    out: list[Entry] = []
    for text in texts:
        out.append(MessageEntry(parent_id=parent, message=UserMessage.of(text)))
        parent = out[-1].id
    return out


def snapshot(*roots: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for root in roots for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


async def write_session(store: Store, sid: str, *texts: str) -> list[Entry]:
    await store.create_session(SessionRecord(id=sid))
    entries = chain(*texts)
    await store.append_entries(sid, entries)
    return entries


# -- what the store holds ---------------------------------------------------------------


async def test_the_store_holds_the_header_in_plaintext_and_nothing_else(tmp_path: Path) -> None:
    store = sealed_store(tmp_path)
    entries = [*sample_entries(), MessageEntry(message=UserMessage.of(MARKER))]
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", entries)
    raw = await store.inner.load_entries("s")
    assert all(type(e) is SealedEntry for e in raw)
    # The tree works without keys: ids, parents, times and types are plaintext.
    assert [(e.id, e.parent_id, e.timestamp) for e in raw] == [
        (e.id, e.parent_id, e.timestamp) for e in entries]
    assert [e.of for e in raw] == [entry_type(e) for e in entries]
    assert [e.kind for e in raw if isinstance(e, SealedEntry) and e.of == "custom"] == [
        e.kind for e in entries if isinstance(e, CustomEntry)]
    assert TreeIndex(raw).path()[-1].id == entries[-1].id
    data = (tmp_path / "sessions" / "s.jsonl").read_bytes()
    for secret in (b"MARKER", b"4111", b"What is in this picture", b"Earlier: cats", b"Let me",
                   b"remember", b"Tried a branch", b"\"keep\""):
        assert secret not in data
    assert await store.load_entries("s") == entries
    assert CIPHER == "AES-256-GCM"


async def test_s25_the_same_entry_seals_to_the_same_bytes_and_nowhere_else(
    tmp_path: Path,
) -> None:
    store = sealed_store(tmp_path, MemoryStore())
    entry = MessageEntry(message=UserMessage.of(MARKER))
    for sid in ("a", "b"):
        await store.create_session(SessionRecord(id=sid))
        await store.append_entries(sid, [entry])
    await store.append_entries("a", [entry])  # a retry: recognised, stored once
    (a,) = await store.inner.load_entries("a")
    (b,) = await store.inner.load_entries("b")
    assert encode_entry((await store._seal("a", [entry]))[0]) == encode_entry(a)
    assert isinstance(a, SealedEntry) and isinstance(b, SealedEntry)
    assert a.env != b.env  # another session, another key: nothing in common


# -- bound to where it belongs ----------------------------------------------------------


@pytest.mark.parametrize("change", ["session", "id", "of", "kind", "timestamp", "origin_id"])
async def test_a_sealed_row_moved_or_changed_does_not_open(tmp_path: Path, change: str) -> None:
    inner = MemoryStore()
    store = sealed_store(tmp_path, inner, subject="one user")
    await store.create_session(SessionRecord(id="s"))
    await store.create_session(SessionRecord(id="t"))
    entry = CustomEntry(kind="note", data={"text": MARKER})
    await store.append_entries("s", [entry])
    (sealed,) = await inner.load_entries("s")
    assert isinstance(sealed, SealedEntry)
    target = "s"
    if change == "session":
        target = "t"  # the same key (one subject), another session
    else:
        value = {"id": "another-id", "of": "message", "kind": "other",
                 "timestamp": sealed.timestamp.replace(year=2001),  # type: ignore[union-attr]
                 "origin_id": "forged"}[change]
        sealed = msgspec.structs.replace(sealed, **{change: value})
    inner._logs[target] = [encode_entry(sealed)]
    log = await store.load_entries(target)
    assert list(log) == [sealed]  # the placeholder, as stored
    assert any("does not authenticate" in d and sealed.id in d for d in log.diagnostics)
    with pytest.raises(MalformedEnvelope) as info:
        await store.unseal(target, sealed)
    assert (info.value.session_id, info.value.entry_id) == (target, sealed.id)


async def test_a_new_parent_is_the_one_thing_a_row_may_change(tmp_path: Path) -> None:
    # A linear append re-parents the first entry of its batch inside the store.
    inner = MemoryStore()
    store = sealed_store(tmp_path, inner)
    entries = await write_session(store, "s", "one", "two")
    _, second = await inner.load_entries("s")
    inner._logs["s"][1] = encode_entry(msgspec.structs.replace(second, parent_id=None))
    loaded = await store.load_entries("s")
    assert loaded[1] == msgspec.structs.replace(entries[1], parent_id=None)


# -- fail closed ------------------------------------------------------------------------


async def test_one_malformed_envelope_is_an_error_for_that_entry_only(tmp_path: Path) -> None:
    inner = MemoryStore()
    store = sealed_store(tmp_path, inner)
    entries = await write_session(store, "s", "first", MARKER, "third", "fourth")
    raw = list(await inner.load_entries("s"))
    damaged = []
    for n, env in ((1, lambda b: b[:-1] + bytes([b[-1] ^ 1])),  # a flipped bit
                   (2, lambda b: b[:10]),                          # cut short
                   (3, lambda b: b[:1] + b"\x09" + b[2:])):        # an unknown cipher
        bad = msgspec.structs.replace(raw[n], env=env(raw[n].env))  # type: ignore[union-attr]
        inner._logs["s"][n] = encode_entry(bad)
        damaged.append(bad)
    log = await store.load_entries("s")
    assert log[0] == entries[0] and list(log[1:]) == damaged
    assert len(log.diagnostics) == 3
    for text, bad in zip(log.diagnostics, damaged, strict=True):
        assert bad.id in text and "the other entries read" in text
    for bad, says in zip(damaged, ("does not authenticate", "too short", "cipher 9"),
                         strict=True):
        with pytest.raises(MalformedEnvelope, match=says) as info:
            await store.unseal("s", bad)  # type: ignore[arg-type]
        assert (info.value.session_id, info.value.entry_id) == ("s", bad.id)
    # An agent opens the session; the model never sees the damaged entries.
    agent = await durable.open(None, store=store, session_id="s")
    assert agent.messages() == [entries[0].message]  # type: ignore[attr-defined]


async def test_a_wrong_key_is_a_typed_error_and_changes_nothing(tmp_path: Path) -> None:
    store = sealed_store(tmp_path)
    await write_session(store, "s", MARKER)
    before = snapshot(tmp_path)
    wrong = sealed_store(tmp_path, provider=OTHER_KEK)
    with pytest.raises(KeyUnavailable) as info:
        await wrong.load_entries("s")
    assert info.value.session_id == "s" and info.value.entry_id is not None
    assert "the wrong key?" in str(info.value)
    with pytest.raises(KeyUnavailable):
        await wrong.append_entries("s", chain("more"))
    with pytest.raises(KeyUnavailable):
        await wrong.create_session(SessionRecord(id="t", parent_id="s"))

    class Impostor(LocalKeyProvider):
        """Another key that claims the right key's id."""

        @property
        def key_id(self) -> str:
            return KEK.key_id

    with pytest.raises(KeyUnavailable, match="does not unwrap") as info:
        await sealed_store(tmp_path, provider=Impostor(b"i" * 32)).load_entries("s")
    assert info.value.session_id == "s"
    assert snapshot(tmp_path) == before  # nothing deleted, rewritten or added
    assert [e.message.text for e in await store.load_entries("s")] == [MARKER]  # type: ignore[union-attr]


async def test_a_missing_keyring_is_a_typed_error(tmp_path: Path) -> None:
    store = sealed_store(tmp_path)
    await write_session(store, "s", MARKER)
    for keys in (Keyring(tmp_path / "elsewhere", KEK, create=False),
                 Keyring(tmp_path / "fresh", KEK)):
        with pytest.raises(KeyUnavailable) as info:
            await EncryptedStore(store.inner, keys).load_entries("s")
        assert info.value.session_id == "s"
    # A read never starts a keyring, whatever ``create`` says.
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "fresh").exists()


async def test_without_a_key_what_is_readable_shows_and_the_rest_is_locked(
    tmp_path: Path,
) -> None:
    store = sealed_store(tmp_path)
    entries = await write_session(store, "s", MARKER, "two")
    await write_session(store, "gone", "erased soon")
    await store.erase_subject("gone")
    locked = sealed_store(tmp_path, provider=None, locked="placeholder")
    log = await locked.load_entries("s")
    assert [type(e) for e in log] == [SealedEntry, SealedEntry]
    assert [e.id for e in log] == [e.id for e in entries]
    assert any("2 entries are locked" in d for d in log.diagnostics)
    erased = await locked.load_entries("gone")  # erasure needs no key to be seen
    assert [e.of for e in erased] == ["message"] and type(erased[0]).__name__ == "ErasedEntry"
    with pytest.raises(KeyUnavailable, match="no key-encryption key was given"):
        await locked.append_entries("s", chain("more"))
    with pytest.raises(KeyUnavailable, match="no key-encryption key was given"):
        await sealed_store(tmp_path, provider=None).load_entries("s")


async def test_a_plaintext_row_fails_closed_until_the_session_is_migrated(tmp_path: Path) -> None:
    plain = FileStore(tmp_path / "sessions")
    entries = await write_session(plain, "s", MARKER, "two")
    record = await plain.load_session("s")
    with pytest.raises(PlaintextEntry) as info:
        await sealed_store(tmp_path).load_entries("s")
    assert (info.value.session_id, info.value.entry_id) == ("s", entries[0].id)
    reading = sealed_store(tmp_path, plaintext="read")
    log = await reading.load_entries("s")
    assert log == entries and any("2 entries are not sealed" in d for d in log.diagnostics)
    later = chain("sealed from the start", parent=entries[-1].id)
    await reading.append_entries("s", later)
    with pytest.raises(PlaintextEntry):
        await sealed_store(tmp_path).load_entries("s")
    assert await migrate_session(reading, "s") == 3
    assert await migrate_session(reading, "s") == 0  # sealed already
    strict = sealed_store(tmp_path)
    assert await strict.load_entries("s") == entries + later
    assert await strict.inner.load_session("s") == record  # type: ignore[attr-defined]
    assert b"MARKER" not in (tmp_path / "sessions" / "s.jsonl").read_bytes()
    assert [p.name for p in (tmp_path / "sessions").iterdir()] == ["s.jsonl"]


async def test_a_migration_killed_part_way_is_finished_by_the_next_run(tmp_path: Path) -> None:
    plain = SQLiteStore(tmp_path / "db.sqlite")
    entries = await write_session(plain, "s", MARKER, "two", "three")
    # The second create is the session's own, after its deletion: the worst
    # moment to stop, with the session gone and only the staging copy left.
    dying = FaultyStore(plain, fail_create_on=2)
    with pytest.raises(StoreError, match="injected"):
        await migrate_session(sealed_store(tmp_path, dying, plaintext="read"), "s")
    (staging,) = (await plain.list_sessions()).sessions  # only the staged copy is left
    assert staging.id.startswith("threadline-staged-")
    assert await migrate_session(sealed_store(tmp_path, plain, plaintext="read"), "s") == 3
    assert await sealed_store(tmp_path, plain).load_entries("s") == entries
    assert [r.id for r in (await plain.list_sessions()).sessions] == ["s"]
    await plain.close()


# -- keys -------------------------------------------------------------------------------


async def test_a_new_kek_rewraps_every_data_key_without_touching_the_log(tmp_path: Path) -> None:
    store = sealed_store(tmp_path)
    for n in range(5):
        await write_session(store, f"s{n}", f"{MARKER} {n}")
    logs = snapshot(tmp_path / "sessions")
    done = await Keyring(tmp_path / "keyring", OTHER_KEK, previous=[KEK]).rewrap()
    assert (done.files, done.versions, done.unchanged) == (6, 6, 0)  # 5 keys and the index key
    assert snapshot(tmp_path / "sessions") == logs
    new = sealed_store(tmp_path, provider=OTHER_KEK)
    for n in range(5):
        assert [e.message.text for e in await new.load_entries(f"s{n}")] == [  # type: ignore[union-attr]
            f"{MARKER} {n}"]
    await write_session(new, "after", "written under the new key")
    with pytest.raises(KeyUnavailable, match="the wrong key"):
        await sealed_store(tmp_path).load_entries("s0")  # the old key opens nothing now
    again = await Keyring(tmp_path / "keyring", OTHER_KEK, previous=[KEK]).rewrap()
    assert again.versions == 0 and again.unchanged == 7


async def test_a_subject_rotated_to_a_new_data_key_still_opens_what_it_wrote(
    tmp_path: Path,
) -> None:
    store = sealed_store(tmp_path, MemoryStore())
    entries = await write_session(store, "s", "under version 1")
    assert await store.keys.rotate_subject("s") == 2
    later = chain("under version 2", parent=entries[-1].id)
    await store.append_entries("s", later)
    raw = await store.inner.load_entries("s")
    assert [int.from_bytes(e.env[3:7], "big") for e in raw] == [1, 2]  # type: ignore[union-attr]
    assert await sealed_store(tmp_path, store.inner).load_entries("s") == entries + later


async def test_a_failing_key_provider_is_key_unavailable(tmp_path: Path) -> None:
    class Down:
        """The service is reachable for one of the two calls only."""

        key_id = KEK.key_id

        def __init__(self, failing: str) -> None:
            self.failing = failing

        async def wrap(self, key: bytes, context: bytes) -> bytes:
            if self.failing == "wrap":
                raise ConnectionError("KMS unreachable")
            return await KEK.wrap(key, context)

        async def unwrap(self, wrapped: bytes, context: bytes) -> bytes:
            if self.failing == "unwrap":
                raise ConnectionError("KMS unreachable")
            return await KEK.unwrap(wrapped, context)

    store = sealed_store(tmp_path)
    await write_session(store, "s", MARKER)
    before = snapshot(tmp_path)
    with pytest.raises(KeyUnavailable, match="KMS unreachable") as info:
        await sealed_store(tmp_path, provider=Down("unwrap")).load_entries("s")
    assert isinstance(info.value.__cause__, KeyUnavailable)
    no_wrap = sealed_store(tmp_path, provider=Down("wrap"))
    assert len(await no_wrap.load_entries("s")) == 1
    with pytest.raises(KeyUnavailable, match="could not wrap data key"):
        await no_wrap.create_session(SessionRecord(id="new"))
    with pytest.raises(SessionNotFound):
        await no_wrap.load_entries("new")
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if "/keys/" in k} == {
        k: v for k, v in before.items() if "/keys/" in k}  # no key written


def test_a_key_file_must_hold_a_32_byte_key(tmp_path: Path) -> None:
    from threadline.errors import ConfigError

    path = tmp_path / "kek"
    path.write_text(LocalKeyProvider.generate() + "\n")
    assert LocalKeyProvider.from_file(path).key_id.startswith("local:")
    path.write_text("not base64!")
    with pytest.raises(ConfigError, match="32 bytes written as base64"):
        LocalKeyProvider.from_file(path)
    with pytest.raises(ConfigError, match="cannot read"):
        LocalKeyProvider.from_file(tmp_path / "missing")


# -- receipts (S11) ---------------------------------------------------------------------


async def test_s11_nothing_is_forwarded_before_its_ciphertext_is_stored(tmp_path: Path) -> None:
    store = sealed_store(tmp_path)
    script = [Turn.text(f"{MARKER} one"), Turn.text(f"{MARKER} two")]
    agent = await durable.open(durable.model(ScriptedModel(script)), store=store,
                               session_id="s11")
    checker = FileStore(tmp_path / "sessions")
    reader = sealed_store(tmp_path)
    seen: set[str] = set()
    for question in ("first?", "second?"):
        async for event in agent.run(question):
            written = getattr(event, "entries", None)
            if not written:
                continue
            raw = {e.id: e for e in await checker.load_entries("s11")}
            opened = {e.id: e for e in await reader.load_entries("s11")}
            for entry in written:
                assert type(raw[entry.id]) is SealedEntry and opened[entry.id] == entry
                seen.add(entry.id)
    assert len(seen) == 4  # two questions, two answers
    assert b"MARKER" not in (tmp_path / "sessions" / "s11.jsonl").read_bytes()


@pytest.mark.parametrize("k", [1, 2])
async def test_s11_a_failed_sealed_append_is_never_forwarded(tmp_path: Path, k: int) -> None:
    faulty = FaultyStore(FileStore(tmp_path / "sessions"), fail_append_on=k)
    agent = await durable.open(durable.model(ScriptedModel([Turn.text("answer")])),
                               store=sealed_store(tmp_path, faulty), session_id="s")
    forwarded: list[Any] = []
    with pytest.raises(StoreError, match=f"append_entries call {k}"):
        async for event in agent.run("question"):
            forwarded.append(event)
    told = {e.id for event in forwarded for e in getattr(event, "entries", None) or ()}
    stored = await sealed_store(tmp_path).load_entries("s")
    assert len(told) == len(stored) == k - 1  # the k-th append's event never came
    assert told == {e.id for e in stored}


# -- the layer over any store -----------------------------------------------------------


async def test_the_layer_offers_exactly_what_the_store_beneath_has(tmp_path: Path) -> None:
    from threadline.stores import CatalogStore, LinearStore, WatchableStore

    class Minimal:
        """A third party's store: the three methods and nothing else."""

        def __init__(self) -> None:
            self.inner = MemoryStore()

        async def create_session(self, record: SessionRecord) -> None:
            await self.inner.create_session(record)

        async def load_entries(self, session_id: str) -> list[Entry]:
            return await self.inner.load_entries(session_id)

        async def append_entries(self, session_id: str, entries: Sequence[Entry]) -> None:
            await self.inner.append_entries(session_id, entries)

    minimal = sealed_store(tmp_path, Minimal())
    assert not isinstance(minimal, CatalogStore | LinearStore | WatchableStore)
    entries = await write_session(minimal, "s", MARKER)
    assert await minimal.load_entries("s") == entries
    full = sealed_store(tmp_path, MemoryStore())
    assert isinstance(full, CatalogStore) and isinstance(full, LinearStore)
    assert isinstance(full, WatchableStore) and isinstance(full, EncryptedStore)


async def test_watch_and_linear_appends_open_what_they_carry(tmp_path: Path) -> None:
    store = sealed_store(tmp_path, MemoryStore())
    entries = await write_session(store, "s", "one")
    watch = store.watch("s")
    assert await anext(watch) == entries[0]
    call = ToolCall(id="c1", name="t", arguments={"q": MARKER})
    batch: list[Entry] = [
        MessageEntry(parent_id="anything", message=AssistantMessage(content=(call,))),
    ]
    batch.append(MessageEntry(parent_id=batch[0].id, message=ToolResultMessage(
        tool_call_id="c1", tool_name="t", content=(TextPart(text=MARKER),))))
    stored = await store.append_linear("s", batch)
    assert stored[0].parent_id == entries[0].id
    assert [await anext(watch), await anext(watch)] == stored
    await watch.aclose()
    assert await store.load_entries_after("s", entries[0].id) == stored
    assert await store.load_entries("s") == [*entries, *stored]


async def test_errors_of_the_store_beneath_pass_through_unchanged(tmp_path: Path) -> None:
    store = sealed_store(tmp_path)
    await store.create_session(SessionRecord(id="s"))
    (tmp_path / "sessions" / "s.jsonl").write_bytes(
        (tmp_path / "sessions" / "s.jsonl").read_bytes() + b"not json\n{}\n")
    with pytest.raises(CorruptLog):
        await store.load_entries("s")


def _docs_adapter() -> dict[str, Any]:
    """The names the KMS adapter example of docs/privacy.md defines."""
    import re

    page = (Path(__file__).resolve().parent.parent / "docs" / "privacy.md").read_text()
    (adapter,) = [b for b in re.findall(r"```python\n(.*?)```", page, re.S) if "Transit" in b]
    namespace: dict[str, Any] = {}
    exec(compile(adapter, "docs/privacy.md", "exec"), namespace)
    return namespace


async def test_the_kms_adapter_of_the_docs_seals_and_opens(tmp_path: Path) -> None:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from threadline.privacy import KeyProvider

    namespace = _docs_adapter()

    class Service:
        """A stand-in for the KMS: its key never leaves it."""

        def __init__(self) -> None:
            self._key = AESGCM(b"s" * 32)

        async def encrypt(self, key_name: str, plaintext: bytes, context: bytes) -> bytes:
            return b"n" * 12 + self._key.encrypt(b"n" * 12, plaintext, key_name.encode() + context)

        async def decrypt(self, key_name: str, ciphertext: bytes, context: bytes) -> bytes:
            return self._key.decrypt(ciphertext[:12], ciphertext[12:],
                                     key_name.encode() + context)

    provider = namespace["provider"](Service())
    assert isinstance(provider, KeyProvider) and provider.key_id == "transit:threadline"
    store = sealed_store(tmp_path, MemoryStore(), provider=provider)
    entries = await write_session(store, "s", MARKER)
    assert await sealed_store(tmp_path, store.inner, provider=provider).load_entries("s") == entries


def test_blob_addresses_are_per_subject_and_a_blob_opens_only_where_it_was_stored() -> None:
    # The blob half of the shared design (blobs are stored by another part):
    # the address and the envelope.
    import hashlib
    import re

    from threadline.privacy._envelope import (
        DataKey,
        blob_key,
        blob_version,
        open_blob,
        seal_blob,
    )

    mine, theirs = DataKey("mine", 3, b"a" * 32), DataKey("theirs", 1, b"b" * 32)
    sha = hashlib.sha256(MARKER.encode()).hexdigest()
    here, there = blob_key(mine, sha), blob_key(theirs, sha)
    assert here == blob_key(mine, sha) and here != there  # stored once per subject
    assert re.fullmatch(r"s[0-9a-f]{64}", here) and sha not in here
    stored = seal_blob(mine, here, "image/png", MARKER.encode())
    assert MARKER.encode() not in stored and blob_version(stored, here) == ("mine", 3)
    assert open_blob(mine, here, "image/png", stored) == MARKER.encode()
    for key, address, media in ((mine, there, "image/png"), (mine, here, "image/jpeg"),
                                (theirs, here, "image/png")):
        with pytest.raises(MalformedEnvelope, match="does not authenticate"):
            open_blob(key, address, media, stored)
    with pytest.raises(MalformedEnvelope):
        blob_version(b"\x07" + stored[1:], here)
