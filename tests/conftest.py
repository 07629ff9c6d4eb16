"""Shared fixtures: the PostgreSQL server the SQL-store tests run against.

The URL comes from ``THREADLINE_TEST_PG_URL`` (default: the local server with
trust auth). When the server cannot be reached the PostgreSQL tests skip, but
under ``CI=true`` they fail: CI must never pass by skipping them.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest
from hypothesis import settings

from support.pgbouncer import PgBouncer, prepared_pgbouncer

if TYPE_CHECKING:
    from support.stores import StoreSpec

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/test"

# Under CI Hypothesis loads its "ci" profile, which fixes every test's examples
# (derandomize) so that a failure there reproduces. .ci/run's second suite
# loads this one instead: as many examples per test, new ones on every run.
settings.register_profile("ci-explore", parent=settings.get_profile("ci"), derandomize=False)


@pytest.fixture(scope="session")
def pg_url() -> str:
    url = os.environ.get("THREADLINE_TEST_PG_URL", DEFAULT_PG_URL)
    try:
        import psycopg

        with psycopg.connect(url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        message = f"PostgreSQL at {url} is not reachable: {exc}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message)
        pytest.skip(message)
    return url


def drop_schema(url: str, schema: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@pytest.fixture
def pg_schema(pg_url: str) -> Iterator[str]:
    """A schema name no other test uses; dropped (with its tables) afterwards."""
    schema = f"tl_test_{secrets.token_hex(6)}"
    yield schema
    drop_schema(pg_url, schema)


def require_or_skip(message: str) -> None:
    """Skip a test whose service or binary is missing; under ``CI=true``, fail it."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def pgbouncer(pg_url: str) -> Iterator[PgBouncer]:
    """A real PgBouncer (transaction pooling) in front of the test server."""
    if shutil.which("pgbouncer") is None:
        require_or_skip("pgbouncer is not installed (apt-get install pgbouncer)")
    parts = urlsplit(pg_url)
    bouncer = PgBouncer(server_host=parts.hostname or "127.0.0.1",
                        server_port=parts.port or 5432,
                        dbname=parts.path.lstrip("/") or "test",
                        user=parts.username or "postgres")
    bouncer.start()
    yield bouncer
    bouncer.close()


@pytest.fixture(scope="session")
def pgbouncer_url(pgbouncer: PgBouncer) -> str:
    return pgbouncer.url


@pytest.fixture(scope="session")
def pgbouncer_prepared(pg_url: str) -> Iterator[PgBouncer]:
    """PgBouncer 1.21 or later, keeping prepared statements (``max_prepared_statements``).

    Three server connections for every client the tests open, so a statement
    prepared on one is soon run on another, which PgBouncer must prepare first.
    """
    binary = prepared_pgbouncer()
    if binary is None:
        require_or_skip("no pgbouncer 1.21 or later here (.ci/run builds 1.24 into /opt)")
    parts = urlsplit(pg_url)
    bouncer = PgBouncer(server_host=parts.hostname or "127.0.0.1",
                        server_port=parts.port or 5432,
                        dbname=parts.path.lstrip("/") or "test",
                        user=parts.username or "postgres", pool_size=3,
                        binary=binary, max_prepared_statements=200)
    bouncer.start()
    yield bouncer
    bouncer.close()
@pytest.fixture(params=["memory", "file", "sqlite", "postgres"])
def store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSpec:
    """Each built-in store in turn, as a spec any thread or process can open."""
    from support.stores import make_spec

    return make_spec(request.param, tmp_path, request)


@pytest.fixture(params=["file", "sqlite", "postgres"])
def shared_store_spec(request: pytest.FixtureRequest, tmp_path: Path) -> StoreSpec:
    """Each built-in store that other processes can open too."""
    from support.stores import make_spec

    return make_spec(request.param, tmp_path, request)
