"""Where there is no ``fcntl`` (Windows): the package imports, and the stores that need no
``flock`` pass the conformance suite, while ``FileStore`` says clearly why it cannot run.

A child Python runs the suites with a ``sitecustomize`` that makes ``import
fcntl`` fail, as it does on Windows; the child's own child processes (the
suite's multi-process tests) inherit it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_BLOCKER = '''
import sys


class _NoFcntl:
    """As on Windows: the fcntl module does not exist."""

    def find_spec(self, name, path=None, target=None):
        if name == "fcntl":
            raise ModuleNotFoundError("No module named 'fcntl'", name="fcntl")
        return None


sys.modules.pop("fcntl", None)
sys.meta_path.insert(0, _NoFcntl())
'''

_SUITES = '''
import pytest

import threadline
import threadline.durable
import threadline.session
import threadline.stores
from threadline.errors import ConfigError
from threadline.stores import FileStore, MemoryStore, SQLiteStore
from threadline.testing import StoreConformance


def test_fcntl_cannot_be_imported_here():
    with pytest.raises(ImportError):
        import fcntl  # noqa: F401


def test_file_store_refuses_with_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="fcntl"):
        FileStore(tmp_path)


class TestMemoryStoreWithoutFcntl(StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch"})
    shared_instances = False  # each make_store is a store of its own

    async def make_store(self, tmp_path):
        return MemoryStore()


class TestSQLiteStoreWithoutFcntl(StoreConformance):
    capabilities = frozenset({"catalog", "linear", "watch", "multi_process"})

    async def make_store(self, tmp_path):
        return SQLiteStore(tmp_path / "sessions.db")
'''


def test_sqlite_and_memory_stores_pass_the_conformance_suite_without_fcntl(
        tmp_path: Path) -> None:
    (tmp_path / "blocker").mkdir()
    (tmp_path / "blocker" / "sitecustomize.py").write_text(_BLOCKER)
    (tmp_path / "test_without_fcntl.py").write_text(_SUITES)
    path = [str(tmp_path / "blocker"), *filter(None, [os.environ.get("PYTHONPATH")])]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x",
         "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
         str(tmp_path / "test_without_fcntl.py")],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)}, cwd=tmp_path,
        capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
