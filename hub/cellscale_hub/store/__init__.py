"""The durable store: SQLAlchemy models, Alembic migrations, and the queries the API and
controller share."""

from cellscale_hub.store.db import Store

__all__ = ["Store"]
