"""Shared fixtures.

- `store_url`: parametrized over SQLite and, when CELLSCALE_TEST_POSTGRES_URL is set (scripts/test
  starts a real server), PostgreSQL. With CELLSCALE_REQUIRE_POSTGRES=1 a missing server fails.
- `store`: a migrated Store on a fresh schema for each test.
- every test leaves SIGINT's and SIGTERM's handlers as it found them (`_signal_handlers_kept`).
"""

from __future__ import annotations

import os
import signal

import pytest
from sqlalchemy import text

from cellscale_hub.store import Store
from cellscale_hub.store.models import Base

POSTGRES_URL = os.environ.get("CELLSCALE_TEST_POSTGRES_URL")


@pytest.fixture(autouse=True)
def _signal_handlers_kept():
    """Dagster's in-process execution maps SIGTERM to SIGINT's handler and leaves it so. In a test
    run started in the background SIGINT is ignored, so SIGTERM would be ignored from then on by
    this process and by every child it starts later (a `sleep` a test expects SIGTERM to stop)."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    yield
    for signum, handler in saved.items():
        if handler is not None:
            signal.signal(signum, handler)


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
