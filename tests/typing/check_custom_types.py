"""Static checks, run by mypy in tests/test_typing.py (never imported by pytest).

Each ``assert_type`` is a claim about what a user's type checker infers.
"""

from __future__ import annotations

import dataclasses
from typing import Any, assert_type

import msgspec

from threadline.session._codec import decode_entry, encode_entry
from threadline.session._entries import CustomEntry, Entry, register_custom


class Todo(msgspec.Struct, frozen=True):
    title: str
    done: bool = False


@dataclasses.dataclass(frozen=True)
class Note:
    text: str


register_custom("todo", Todo)
register_custom("note", Note)

todo_entry = CustomEntry(kind="todo", data=Todo(title="ship"))
assert_type(todo_entry, CustomEntry[Todo])
assert_type(todo_entry.data, Todo)
assert_type(todo_entry.data.title, str)

note_entry = CustomEntry(kind="note", data=Note(text="n"))
assert_type(note_entry.data, Note)

explicit: CustomEntry[Todo] = CustomEntry(kind="todo", data=Todo(title="x"), parent_id="p")
assert_type(explicit.parent_id, str | None)

line: bytes = encode_entry(todo_entry)
decoded = decode_entry(line)
assert_type(decoded, Entry)
if isinstance(decoded, CustomEntry):
    assert_type(decoded, CustomEntry[Any])
