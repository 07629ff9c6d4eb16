"""MemoryStore: the conformance suite plus what is particular to memory."""

from __future__ import annotations

from pathlib import Path

from threadline.session import MemoryStore, Store
from threadline.testing import StoreConformance


class TestMemoryStore(StoreConformance):
    shared_instances = False

    async def make_store(self, tmp_path: Path) -> Store:
        return MemoryStore()
