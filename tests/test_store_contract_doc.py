"""docs/writing-a-store.md states the Store contract; the suite checks each rule of it."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec

from threadline.errors import SessionExists, SessionNotFound
from threadline.session import SessionRecord
from threadline.stores import CatalogStore, Store
from threadline.testing import StoreConformance

DOC = Path(__file__).resolve().parent.parent / "docs" / "writing-a-store.md"


def _rules() -> list[str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("## The rules", 1)[1].split("\n## ", 1)[0]
    return [item.replace("\n", " ") for item in re.split(r"\n- ", section)[1:]]


SUITE_TESTS = {name for name in dir(StoreConformance) if name.startswith("test_")}


def test_every_rule_names_a_suite_test_that_exists() -> None:
    rules = _rules()
    assert len(rules) >= 10
    for rule in rules:
        named = set(re.findall(r"`(test_\w+)`", rule))
        assert named, f"rule without a test: {rule[:80]}"
        assert named <= SUITE_TESTS, named - SUITE_TESTS


def test_every_suite_test_checks_a_written_rule() -> None:
    named = {t for rule in _rules() for t in re.findall(r"`(test_\w+)`", rule)}
    assert named == SUITE_TESTS


def test_the_contract_is_on_the_protocols_and_errors_too() -> None:
    for text in (Store.__doc__, CatalogStore.__doc__, SessionNotFound.__doc__,
                 SessionExists.__doc__):
        assert text and len(text) > 80
    doc = Store.__doc__ or ""
    for phrase in ("all or nothing", "refused whole", "InvalidSessionId", "CorruptLog",
                   "Durable means", "parent", "stale"):
        assert phrase in doc, phrase


def test_a_session_record_round_trips_through_msgspec_exactly() -> None:
    # The public way to encode and decode a record, as the page says.
    record = SessionRecord(id="é/x", parent_id="p",
                           created_at=datetime(2024, 1, 2, 3, 4, 5, 678901,
                                               tzinfo=timezone(timedelta(hours=5, minutes=30))))
    again = msgspec.json.decode(msgspec.json.encode(record), type=SessionRecord)
    assert again == record and again.created_at.utcoffset() == record.created_at.utcoffset()
