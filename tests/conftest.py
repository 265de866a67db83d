"""Shared fixtures.

- `store_url`: parametrized over SQLite and, when CELLSCALE_TEST_POSTGRES_URL is set (scripts/test
  starts a real server), PostgreSQL. With CELLSCALE_REQUIRE_POSTGRES=1 a missing server fails.
- `store`: a migrated Store on a fresh schema for each test.
"""

from __future__ import annotations

import os

import pytest
from sqlalchemy import text

from cellscale_hub.store import Store
from cellscale_hub.store.models import Base

POSTGRES_URL = os.environ.get("CELLSCALE_TEST_POSTGRES_URL")


def _store_params():
    params = [pytest.param("sqlite", id="sqlite")]
    if POSTGRES_URL or os.environ.get("CELLSCALE_REQUIRE_POSTGRES") == "1":
        params.append(pytest.param("postgres", id="postgres", marks=pytest.mark.postgres))
    return params


@pytest.fixture(params=_store_params())
def store_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'cellscale.sqlite'}"
    if not POSTGRES_URL:
        pytest.fail("CELLSCALE_REQUIRE_POSTGRES=1 but CELLSCALE_TEST_POSTGRES_URL is not set (run scripts/test)")
    return POSTGRES_URL


@pytest.fixture
def store(store_url):
    s = Store(store_url)
    if s.engine.dialect.name == "postgresql":
        with s.engine.begin() as conn:
            Base.metadata.drop_all(conn)
            conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    s.migrate()
    yield s
    s.dispose()
