"""A store whose database is empty but for the migrations up to one revision: to test what a
later migration does with the rows it finds."""

from __future__ import annotations

from alembic import command
from sqlalchemy import text

from cellscale_hub.store import Store
from cellscale_hub.store.db import alembic_config
from cellscale_hub.store.models import Base


def store_at(store_url: str, revision: str) -> tuple[Store, object]:
    """(the store, its Alembic config) with the schema of `revision` and no rows."""
    store = Store(store_url)
    config = alembic_config(store.engine)
    with store.engine.begin() as conn:  # an empty database (the PostgreSQL one is shared)
        Base.metadata.drop_all(conn)
        conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    command.upgrade(config, revision)
    return store, config
