"""The Store conformance suite: one set of tests every store must pass.

Each test checks one rule of docs/writing-a-store.md (the Store contract);
the page names the test for each rule.

Subclass ``StoreConformance`` in a test module, give it a factory and say
which optional capabilities the store offers::

    from pathlib import Path

    from threadline.testing import StoreConformance

    class TestMyStore(StoreConformance):
        capabilities = {"catalog", "watch", "multi_process"}

        async def make_store(self, tmp_path: Path) -> Store:
            return MyStore(tmp_path / "db")

pytest then collects every ``test_*`` method for your store. The suite needs
``pytest-asyncio`` (its tests are ``async def`` and carry the asyncio mark, so
the plugin's strict mode works as well as auto mode).

Levels. The core tests (``create_session``, ``load_entries``,
``append_entries``) always run. Each capability adds its tests:

- ``"catalog"``: ``load_session``, ``list_sessions``, ``delete_session``, ``close``;
- ``"linear"``: ``append_linear``, ``load_entries_after`` (``LinearStore``);
- ``"watch"``: ``watch`` (``WatchableStore``);
- ``"blobs"``: ``put_blob``, ``get_blob``, ``has_blobs``, ``list_blobs``,
  ``delete_blobs`` (``BlobStore``);
- ``"search"``: ``search`` (``SearchableStore``; with ``"catalog"``);
- ``"multi_process"``: child processes open the same storage.

A declared capability is always tested: a store that lacks one of its
methods, or names it otherwise, fails, saying which. The tests of a
capability that is not declared skip, naming it.

The factory's contract:

- ``make_store(tmp_path)`` returns a handle on storage that is **empty** for a
  fresh ``tmp_path``. Calling it again with the same ``tmp_path`` must return
  a *second handle on the same data* (another connection, another file store
  on the same directory). A store whose instances cannot share data (an
  in-memory store) sets ``shared_instances = False``; the concurrency tests
  then share one instance between tasks and threads.
- Handles are closed by the suite (``await store.close()``) when they have a
  ``close`` method.
- Handles may be opened from other threads, each running its own event loop.

Child processes ("multi_process") run ``make_store(tmp_path)`` (started with
``spawn``) by default, which works when the test class is defined at module
level of an importable test module, as above. Otherwise override
``store_opener(tmp_path)`` to return a picklable zero-argument callable that
opens the same storage, in one line::

    def store_opener(self, tmp_path: Path) -> StoreOpener:
        return functools.partial(MyStore, str(tmp_path / "db"))

``process_count`` / ``process_appends`` size the multi-process append test;
``kill_rounds`` / ``kill_batch`` say how many children the SIGKILL test kills
inside one ``append_entries`` call, and how many entries that call holds.
``watch_appends`` is how many entries the S26 test appends while three
watchers follow (10,000). Those three tests run twice: with these numbers in
every run, and ``stress_scale`` (5) times them under the ``stress`` mark
(``-m stress``; register the mark in your pytest configuration).

Optional hooks for reaching past the store's own checks (tests that need a
hook the store lacks skip, naming the hook):

- ``write_stored(store, session_id, data)``: put ``data`` into the
  session's log as its next stored entry exactly as given, bypassing
  encoding and validation (a raw ``INSERT``, a line appended to a file).
- ``write_format_version(store, session_id, version)``: mark the session as
  written by format ``version``, for stores that keep a format version per
  session (the file store's first line).

To skip a test that cannot apply to your store, override it with a method
marked ``pytest.mark.skip(reason=...)`` and say why. Importing the suite
registers nothing: the custom kind it round-trips is registered only while a
test needs it.
"""

from __future__ import annotations

import pytest

from threadline.testing._conformance._base import CAPABILITY_METHODS, Capability
from threadline.testing._conformance._blobs import BlobTests
from threadline.testing._conformance._catalog import CatalogTests
from threadline.testing._conformance._children import StoreOpener
from threadline.testing._conformance._children import aclose as _aclose
from threadline.testing._conformance._children import process_append as _process_append
from threadline.testing._conformance._core import CoreTests
from threadline.testing._conformance._data import (
    ConformanceNote,
    assert_same_entries,
    check_concurrent_log,
    sample_entries,
)
from threadline.testing._conformance._linear import LinearTests
from threadline.testing._conformance._listing import ListingTests
from threadline.testing._conformance._processes import ProcessTests
from threadline.testing._conformance._search import SearchTests
from threadline.testing._conformance._watch import WatchTests

__all__ = [
    "CAPABILITY_METHODS",
    "BlobTests",
    "Capability",
    "ConformanceNote",
    "StoreConformance",
    "StoreOpener",
    "_aclose",  # imported by this repository's own store tests
    "_process_append",
    "assert_same_entries",
    "check_concurrent_log",
    "sample_entries",
]


@pytest.mark.asyncio
class StoreConformance(CoreTests, CatalogTests, ListingTests, LinearTests, WatchTests,
                       BlobTests, SearchTests, ProcessTests):
    """Subclass this, implement ``make_store`` and declare ``capabilities``.

    See the module docstring of ``threadline.testing._conformance``.
    """
