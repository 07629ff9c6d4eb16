"""What a command is and what it gets: the ``Verb`` record each verb module lists
in its ``VERBS``, and the ``Ctx`` it runs with (arguments, output streams,
the stores it opened).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple, cast

from threadline.cli._output import Out
from threadline.errors import ThreadlineError
from threadline.session._entries import Entry, SealedEntry
from threadline.session._tree import TreeIndex
from threadline.stores._contract import CatalogStore

if TYPE_CHECKING:
    from threadline.privacy import KeyProvider, Keyring

__all__ = ["DEFAULT_STORE", "Ctx", "Verb", "whole_number"]

DEFAULT_STORE = "./threadline-demo"


@dataclass
class Ctx:
    """What a verb gets: its arguments, the two output streams, and store opening."""

    args: argparse.Namespace
    out: Out
    err: Out
    interrupt_hint: str | None = None
    """Said on Ctrl-C (for example, how to resume)."""
    _stores: list[CatalogStore] = field(default_factory=list)

    @property
    def store_url(self) -> str:
        url: str | None = getattr(self.args, "store", None)
        return url or os.environ.get("THREADLINE_STORE") or DEFAULT_STORE

    def open(self, url: str | None = None, *, create: bool = False,
             plaintext: bool = False) -> CatalogStore:
        """The store ``url`` names (default ``--store``); a reader passes ``create=False``.

        With a keyring (``--keyring``), the store is wrapped by the encryption
        layer: with a key-encryption key everything opens (a wrong key is an
        error), without one what is readable shows and the rest is locked.
        With ``--redact``, what is read from ``--store`` is redacted.
        ``plaintext`` reads entries stored before encryption (a copy's source).
        """
        from threadline.stores import open_store

        store = open_store(self.store_url if url is None else url, create=create)
        self._stores.append(store)
        keyring = self.keyring(create=create)
        opened = store
        if keyring is not None:
            from threadline.privacy import EncryptedStore

            opened = cast(CatalogStore, EncryptedStore(
                store, keyring, plaintext="read" if plaintext else "refuse",
                locked="raise" if keyring.provider is not None else "placeholder"))
        if getattr(self.args, "redact", False) and not create:
            # ``--redact`` is about what this command shows and writes out: the
            # stores it reads are read redacted (a copy's source, so a copy can
            # be shared), never one it writes to.
            from threadline.privacy import RedactingStore

            opened = cast(CatalogStore, RedactingStore(opened, on="read"))
        return opened

    def key_provider(self) -> KeyProvider | None:
        """The key-encryption key: ``--key-file``, ``$THREADLINE_KEY_FILE``, ``$THREADLINE_KEY``."""
        from threadline.privacy import LocalKeyProvider

        path = getattr(self.args, "key_file", None) or os.environ.get("THREADLINE_KEY_FILE")
        if path:
            return LocalKeyProvider.from_file(path)
        if os.environ.get("THREADLINE_KEY"):
            return LocalKeyProvider.from_env("THREADLINE_KEY")
        return None

    def keyring(self, *, create: bool = False,
                provider: KeyProvider | None = None) -> Keyring | None:
        """The keyring ``--keyring`` (or ``$THREADLINE_KEYRING``) names, if any."""
        path = getattr(self.args, "keyring", None) or os.environ.get("THREADLINE_KEYRING")
        if not path:
            return None
        from threadline.privacy import Keyring

        provider = provider or self.key_provider()
        return Keyring(path, provider, create=create and provider is not None)

    def notice(self, text: str) -> None:
        self.err.line(("notice: ", "yellow"), text)

    async def load(self, store: CatalogStore, session_id: str) -> list[Entry]:
        """A session's log; what the store recovered from becomes a one-line notice."""
        with warnings.catch_warnings():
            # The file store also warns about a torn tail; its diagnostics say it once.
            warnings.simplefilter("ignore", RuntimeWarning)
            log = await store.load_entries(session_id)
        for diagnostic in getattr(log, "diagnostics", ()):
            self.notice(" ".join(str(diagnostic).split()))
        sealed = sum(type(e) is SealedEntry for e in log)
        if sealed and self.keyring() is None:
            what = "1 entry is" if sealed == 1 else f"{sealed} entries are"
            self.notice(f"session {session_id!r}: {what} encrypted and the content is locked; "
                        f"give --keyring and --key-file (or $THREADLINE_KEYRING and "
                        f"$THREADLINE_KEY) to read them")
        return log

    async def tree(self, store: CatalogStore, session_id: str) -> TreeIndex:
        return TreeIndex(await self.load(store, session_id), session_id=session_id)

    async def close(self) -> None:
        for store in self._stores:
            with contextlib.suppress(ThreadlineError):
                await store.close()


class Verb(NamedTuple):
    """A command: its name, a help line, what adds its arguments, and what runs it."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[Ctx, argparse.Namespace], Awaitable[int | None]]


def whole_number(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least``, else a usage error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
        return value

    parse.__name__ = "whole number"  # what argparse names in its messages
    return parse
