"""The blobs level: bytes beside the log under a key (S57, S58).

For a store that declares the "blobs" capability (``BlobStore``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from threadline.errors import BlobNotFound, ConfigError
from threadline.stores._contract import BlobStore, Store
from threadline.testing._conformance._base import SuiteBase

__all__ = ["BAD_BLOB_KEYS", "BlobTests"]

# Keys no store may take: paths, separators, case, control and format
# characters, the lock file's name, too long, not a string.
BAD_BLOB_KEYS: tuple[object, ...] = (
    "", "../" + "a" * 61, "a/b", "a\\b", "..", ".lock", "A" * 64, "a b", "a\x00b", "a\nb",
    "\u202eab", "é" * 4, "a" * 129, "a.tmp", 7, None, b"ab",
)

_FAR = datetime(9999, 1, 1, tzinfo=UTC)
_PAST = datetime(2000, 1, 1, tzinfo=UTC)


def _key(n: int) -> str:
    return f"{n:064x}"


class BlobTests(SuiteBase):
    """Tests of ``put_blob``, ``get_blob``, ``has_blobs``, ``list_blobs``, ``delete_blobs``."""

    def blobs(self, store: Store) -> BlobStore:
        self.require(store, "blobs")
        return cast(BlobStore, store)

    async def test_s57_blob_round_trip(self, store: Store) -> None:
        blobs = self.blobs(store)
        payloads = {_key(1): b"", _key(2): b"\x00\xff" * 7, _key(3): os.urandom(3 << 20)}
        for key, data in payloads.items():
            await blobs.put_blob(key, data)
        for key, data in payloads.items():
            assert await blobs.get_blob(key) == data
        assert await blobs.has_blobs([*payloads, _key(4)]) == set(payloads)
        listed = {i.key: i for i in await blobs.list_blobs()}
        assert set(listed) == set(payloads)
        for key, data in payloads.items():
            assert listed[key].size == len(data)
            assert listed[key].touched_at.tzinfo is not None
        other = await self.another_handle()
        assert await cast(BlobStore, other).get_blob(_key(3)) == payloads[_key(3)]

    async def test_s57_put_again_stores_nothing_new_and_refreshes_the_touch(
        self, store: Store
    ) -> None:
        blobs = self.blobs(store)
        await blobs.put_blob(_key(5), b"first")
        (before,) = await blobs.list_blobs()
        await asyncio.sleep(0.05)  # past the coarsest clock tick a file system stamps with
        await blobs.put_blob(_key(5), b"first")
        (after,) = await blobs.list_blobs()
        assert (after.key, after.size) == (before.key, before.size)
        assert after.touched_at > before.touched_at
        assert await blobs.get_blob(_key(5)) == b"first"
        # The refreshed touch is what an age check sees.
        assert await blobs.delete_blobs([_key(5)], older_than=after.touched_at) == []
        assert await blobs.get_blob(_key(5)) == b"first"

    async def test_s57_missing_blob_is_blob_not_found_naming_the_key(self, store: Store) -> None:
        blobs = self.blobs(store)
        with pytest.raises(BlobNotFound) as caught:
            await blobs.get_blob(_key(6))
        assert caught.value.key == _key(6) and _key(6) in str(caught.value)
        await blobs.put_blob(_key(6), b"x")
        assert await blobs.delete_blobs([_key(6)], older_than=_FAR) == [_key(6)]
        with pytest.raises(BlobNotFound):
            await blobs.get_blob(_key(6))
        assert await blobs.has_blobs([_key(6)]) == set()

    async def test_s57_hostile_keys_are_refused_before_storage(self, store: Store) -> None:
        blobs = self.blobs(store)
        await blobs.put_blob(_key(7), b"kept")
        for bad in BAD_BLOB_KEYS:
            calls: tuple[Callable[[Any], Awaitable[object]], ...] = (
                lambda k: blobs.put_blob(k, b"x"), blobs.get_blob,
                lambda k: blobs.has_blobs([k]),
                lambda k: blobs.delete_blobs([k], older_than=_FAR))
            for call in calls:
                with pytest.raises(ConfigError) as caught:
                    await call(bad)
                assert "\x00" not in str(caught.value) and "\n" not in str(caught.value)
        with pytest.raises(ConfigError):
            await blobs.has_blobs(_key(7))  # a string is not a sequence of keys here
        assert [i.key for i in await blobs.list_blobs()] == [_key(7)]
        assert await blobs.get_blob(_key(7)) == b"kept"

    async def test_s58_delete_takes_only_blobs_touched_before_the_cutoff(
        self, store: Store
    ) -> None:
        blobs = self.blobs(store)
        for n in (8, 9):
            await blobs.put_blob(_key(n), b"%d" % n)
        assert await blobs.delete_blobs([_key(8), _key(9)], older_than=_PAST) == []
        got = await blobs.delete_blobs([_key(8), _key(8), _key(10)], older_than=_FAR)
        assert got == [_key(8)]
        assert await blobs.has_blobs([_key(8), _key(9)]) == {_key(9)}
        assert await blobs.delete_blobs([], older_than=_FAR) == []

    async def test_s58_a_put_racing_a_delete_keeps_its_blob(self, store: Store) -> None:
        # Either the delete goes first and the put stores the blob again, or
        # the put's touch goes first and the delete must then spare it. A
        # store whose age check and delete are two steps loses the blob.
        blobs = self.blobs(store)
        other = cast(BlobStore, await self.another_handle())
        for n in range(20):
            key = _key(100 + n)
            await blobs.put_blob(key, b"raced %d" % n)
            await asyncio.sleep(0.05)
            cutoff = datetime.now(UTC) - timedelta(milliseconds=20)
            await asyncio.gather(other.put_blob(key, b"raced %d" % n),
                                 blobs.delete_blobs([key], older_than=cutoff))
            assert await blobs.get_blob(key) == b"raced %d" % n, f"round {n}"

    async def test_s57_concurrent_puts_of_one_key_store_it_once(self, store: Store) -> None:
        blobs = self.blobs(store)
        handles = [blobs] + [cast(BlobStore, await self.another_handle()) for _ in range(3)]
        data = os.urandom(1 << 20)
        await asyncio.gather(*(h.put_blob(_key(11), data) for h in handles for _ in range(3)))
        assert [(i.key, i.size) for i in await blobs.list_blobs()] == [(_key(11), len(data))]
        assert await blobs.get_blob(_key(11)) == data
