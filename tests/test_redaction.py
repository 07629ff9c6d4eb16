"""Redaction (S71): opt-in on the way into the store, always available on the way out,
and every redaction says which rule made it."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import pytest

from support.cli import tl
from threadline import durable
from threadline.ai import (
    AssistantMessage,
    TextPart,
    ThinkingPart,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from threadline.errors import ConfigError
from threadline.privacy import (
    CARD,
    EMAIL,
    PHONE,
    EncryptedStore,
    Keyring,
    LocalKeyProvider,
    RedactingStore,
    Redactor,
    Rule,
    luhn,
)
from threadline.session import (
    CompactionEntry,
    CustomMessageEntry,
    MessageEntry,
    SealedEntry,
    SessionRecord,
    build_context,
)
from threadline.stores import FileStore
from threadline.testing import assert_valid_for_providers

R = Redactor()
VISA = "4111 1111 1111 1111"  # passes Luhn
NOT_A_CARD = "4111 1111 1111 1112"  # one digit off: fails Luhn
EMAIL_ADDR = "jane.doe+tag@example.co.uk"
PHONE_NO = "+44 20 7946 0958"


def test_s71_builtin_rules_and_the_luhn_check() -> None:
    assert luhn("4111111111111111") and luhn("5500-0000-0000-0004") and luhn("378282246310005")
    assert not luhn("4111111111111112") and not luhn("123") and not luhn("0" * 20)
    text = (f"mail {EMAIL_ADDR}, card {VISA}, also {VISA.replace(' ', '-')}, not {NOT_A_CARD}, "
            f"call {PHONE_NO} or (415) 555-2671 or 415.555.2671")
    counts: Counter[str] = Counter()
    out = R.text(text, counts)
    assert out == ("mail [redacted:email], card [redacted:card], also [redacted:card], "
                   f"not {NOT_A_CARD}, call [redacted:phone] or [redacted:phone] or "
                   "[redacted:phone]")
    assert counts == {"email": 1, "card": 2, "phone": 3}
    # Things that look a little like them are kept.
    for kept in ("2026-06-01", "version 1.2.3", "10.0.0.1", "order 12345678", "a@b",
                 "user@localhost", "x@y.z", "price 1,234,567.89", "id 4111111111111112",
                 "ISBN 978-3-16-148410-0", "@handle", "@@", "email@", "3.14159265358979"):
        assert R.text(kept) == kept, kept


def test_s71_card_like_numbers_that_fail_luhn_are_kept() -> None:
    for number in ("4111111111111112", "5500 0000 0000 0005", "3782-822463-10006",
                   "1234 5678 9012 3456"):
        assert not luhn(number)
        assert R.text(f"ref {number}.") == f"ref {number}."
    assert R.text("4111111111111111") == "[redacted:card]"


def test_s71_unicode_and_hostile_text() -> None:
    bidi = f"\u202e{EMAIL_ADDR}\u202c"
    assert R.text(bidi) == "\u202e[redacted:email]\u202c"
    assert R.text("ünïcødé@exämple.de") == "[redacted:email]"
    assert R.text(f"\x1b[31m{VISA}\x1b[0m") == "\x1b[31m[redacted:card]\x1b[0m"
    assert R.text(f"<b>{PHONE_NO}</b>") == "<b>[redacted:phone]</b>"
    # Full-width and other non-ASCII digits are not card digits.
    assert R.text("４１１１１１１１１１１１１１１１") == "４１１１１１１１１１１１１１１１"
    assert R.text("") == "" and R.text("\x00\ud800") == "\x00\ud800"
    # Long runs that almost match finish (bounded patterns, no quadratic backtracking).
    for hostile in ("a" * 200_000 + "@", "1 " * 100_000, "+1" * 50_000, "@a." * 50_000):
        assert R.text(hostile) == hostile or "[redacted:" in R.text(hostile)
    # A marker already in the text is left as it is.
    assert R.text("[redacted:email]") == "[redacted:email]"


class Names:
    """A stand-in for a real PII detector: finds the names it was given."""

    name = "person"

    def __init__(self, *names: str) -> None:
        self.names = names

    def find(self, text: str) -> Iterable[tuple[int, int, str]]:
        for n in self.names:
            at = text.find(n)
            while at >= 0:
                yield at, at + len(n), "PERSON\x1b[31m<x>"  # a hostile label, cleaned
                at = text.find(n, at + 1)


def test_s71_a_detector_hook_and_overlapping_rules() -> None:
    r = Redactor([*Redactor().rules, Names("Ada Lovelace", "Ada")])
    assert r.text(f"Ada Lovelace <{EMAIL_ADDR}>") == (
        "[redacted:person__31m_x_] <[redacted:email]>")
    overlap = Redactor([Rule("digits", r"\d+"), CARD])
    assert overlap.text("4111111111111111") == "[redacted:digits]"  # first rule, same span
    with pytest.raises(ConfigError):
        Rule("Bad Name!", r"x")
    with pytest.raises(ConfigError):
        Redactor([])
    with pytest.raises(ConfigError):
        Redactor(["not a rule"])  # type: ignore[list-item]
    assert {EMAIL.name, CARD.name, PHONE.name} == {"email", "card", "phone"}


def conversation() -> list[MessageEntry | CustomMessageEntry | CompactionEntry]:
    call = ToolCall(id="call_1", name="send_mail",
                    arguments={"to": EMAIL_ADDR, "cc": [PHONE_NO, 7], "body": {"card": VISA}})
    user = MessageEntry(message=UserMessage.of(f"my card is {VISA}, mail {EMAIL_ADDR}"))
    asks = MessageEntry(parent_id=user.id, message=AssistantMessage(content=(
        ThinkingPart(thinking=f"they gave {VISA}", signature="sig"),
        TextPart(text="sending"), call)))
    done = MessageEntry(parent_id=asks.id, message=ToolResultMessage(
        tool_call_id="call_1", tool_name="send_mail",
        content=(TextPart(text=f"sent to {EMAIL_ADDR}"),), details={"phone": PHONE_NO}))
    note = CustomMessageEntry(parent_id=done.id, kind="note",
                              content=(TextPart(text=f"call {PHONE_NO}"),))
    comp = CompactionEntry(parent_id=note.id, summary=f"user {EMAIL_ADDR} paid",
                           first_kept_entry_id=user.id)
    return [user, asks, done, note, comp]


def test_s71_tool_arguments_results_and_every_text_are_redacted() -> None:
    entries = conversation()
    out = [R.entry(e) for e in entries]
    user, asks, done, note, comp = (e for e, _ in out)
    assert out[0][1] == {"card": 1, "email": 1}
    assert user.message.text == "my card is [redacted:card], mail [redacted:email]"  # type: ignore[union-attr]
    thinking, _, call = asks.message.content  # type: ignore[union-attr]
    assert thinking.thinking == "they gave [redacted:card]" and thinking.signature is None
    assert call.id == "call_1" and call.name == "send_mail"
    assert call.arguments == {"to": "[redacted:email]", "cc": ["[redacted:phone]", 7],
                              "body": {"card": "[redacted:card]"}}
    assert done.message.tool_call_id == "call_1"  # type: ignore[union-attr]
    assert done.message.text == "sent to [redacted:email]"  # type: ignore[union-attr]
    assert done.message.details == {"phone": "[redacted:phone]"}  # type: ignore[union-attr]
    assert note.content[0].text == "call [redacted:phone]"  # type: ignore[union-attr]
    assert comp.summary == "user [redacted:email] paid"  # type: ignore[union-attr]
    for (after, _), before in zip(out, entries, strict=True):
        assert (after.id, after.parent_id, after.timestamp) == (
            before.id, before.parent_id, before.timestamp)
    assert_valid_for_providers(build_context([user, asks, done, note]))
    clean = MessageEntry(message=UserMessage.of("nothing here"))
    assert R.entry(clean) == (clean, Counter())


async def test_s71_on_the_way_in_is_opt_in_and_the_raw_value_never_reaches_the_store(
        tmp_path: Path) -> None:
    inner = FileStore(tmp_path / "s")
    store = RedactingStore(inner)
    agent = await durable.open(None, store=store, session_id="s")
    entries = conversation()
    await store.append_entries("s", entries)
    await store.append_entries("s", entries)  # a retry stores nothing more (S25)
    raw = (tmp_path / "s" / "s.jsonl").read_bytes()
    for secret in (VISA, EMAIL_ADDR, PHONE_NO):
        assert secret.encode() not in raw
    assert raw.count(b"[redacted:") == 10
    assert len(await inner.load_entries("s")) == 5
    await agent.refresh()
    assert "[redacted:card]" in agent.messages()[1].text  # type: ignore[union-attr]
    # Without the layer, nothing is redacted: opting in is the application's choice.
    plain = FileStore(tmp_path / "plain")
    await plain.create_session(SessionRecord(id="s"))
    await plain.append_entries("s", entries[:1])
    assert VISA.encode() in (tmp_path / "plain" / "s.jsonl").read_bytes()
    with pytest.raises(ConfigError):
        RedactingStore(inner, on="sideways")  # type: ignore[arg-type]


async def test_s71_on_the_way_out_the_store_keeps_the_value_and_every_read_is_redacted(
        tmp_path: Path) -> None:
    inner = FileStore(tmp_path / "s")
    await inner.create_session(SessionRecord(id="s"))
    entries = conversation()
    await inner.append_entries("s", entries)
    view = RedactingStore(inner, on="read")
    log = await view.load_entries("s")
    assert "[redacted:card]" in log[0].message.text  # type: ignore[union-attr]
    assert log.diagnostics == ["session 's': redacted on the way out (card 3, email 4, phone 3)"]
    after = await view.load_entries_after("s", entries[0].id)
    assert "[redacted:email]" in after[1].message.text  # type: ignore[union-attr]
    watch = view.watch("s")
    first = await asyncio.wait_for(watch.__anext__(), 10)
    assert "[redacted:card]" in first.message.text  # type: ignore[union-attr]
    await watch.aclose()
    assert VISA.encode() in (tmp_path / "s" / "s.jsonl").read_bytes()
    assert (await view.list_sessions()).sessions[0].id == "s"


async def test_s71_redaction_composes_with_encryption(tmp_path: Path) -> None:
    keys = Keyring(tmp_path / "keys", LocalKeyProvider(b"r" * 32))
    sealed = EncryptedStore(FileStore(tmp_path / "s"), keys)
    store = RedactingStore(sealed)
    await store.create_session(SessionRecord(id="s"))
    await store.append_entries("s", conversation())
    raw = await sealed.inner.load_entries("s")
    assert all(isinstance(e, SealedEntry) for e in raw)
    opened = await sealed.load_entries("s")
    assert opened[0].message.text == (  # type: ignore[union-attr]
        "my card is [redacted:card], mail [redacted:email]")
    # On the way out over an encrypted store that holds the raw value.
    sealed2 = EncryptedStore(FileStore(tmp_path / "t"), keys)
    await sealed2.create_session(SessionRecord(id="t"))
    await sealed2.append_entries("t", conversation())
    shown = await RedactingStore(sealed2, on="read").load_entries("t")
    assert EMAIL_ADDR not in repr(shown) and "[redacted:email]" in repr(shown)
    # Inside the encryption layer it sees only sealed entries, and leaves them.
    inside = RedactingStore(FileStore(tmp_path / "s"), on="read")
    assert [type(e) for e in await inside.load_entries("s")] == [SealedEntry] * 5


def test_s71_threadline_redact_shows_and_exports_redacted(tmp_path: Path) -> None:
    async def build() -> None:
        store = FileStore(tmp_path / "s")
        await store.create_session(SessionRecord(id="s"))
        await store.append_entries("s", conversation())

    asyncio.run(build())
    where = ["--store", str(tmp_path / "s")]
    shown = tl(*where, "show", "s", "--redact").stdout
    assert "[redacted:card]" in shown and VISA not in shown and EMAIL_ADDR not in shown
    exported = tl(*where, "--redact", "export", "s", "--format", "jsonl").stdout
    assert "[redacted:email]" in exported and EMAIL_ADDR not in exported
    assert VISA in tl(*where, "show", "s").stdout  # the store is unchanged
    tl(*where, "--redact", "copy", str(tmp_path / "s"), str(tmp_path / "shared"))
    copied = (tmp_path / "shared" / "s.jsonl").read_text()
    assert "[redacted:phone]" in copied and PHONE_NO not in copied
    assert json.loads(copied.splitlines()[0])["id"] == "s"


def test_s71_the_viewer_serves_redacted(tmp_path: Path) -> None:
    import http.client
    import os
    import subprocess
    import sys
    from urllib.parse import quote, urlsplit

    async def build() -> None:
        store = FileStore(tmp_path / "s")
        await store.create_session(SessionRecord(id="s"))
        await store.append_entries("s", conversation())

    asyncio.run(build())
    proc = subprocess.Popen([sys.executable, "-c", "from threadline.cli import main; main()",
                             "--store", str(tmp_path / "s"), "serve", "--port", "0", "--redact"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ})
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" on ", 1)[1].split(" ", 1)[0]
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        conn.request("GET", "/session?id=" + quote("s", safe=""))
        response = conn.getresponse()
        assert response.status == 200
        page = response.read().decode()
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert "[redacted:card]" in page and "[redacted:email]" in page
    assert VISA not in page and EMAIL_ADDR not in page and PHONE_NO not in page
