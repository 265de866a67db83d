"""attained service: per job, the service its ended attempts received, in GPU-equivalent
seconds (least-attained-service ordering within a desk reads it); filled from the attempts
already stored, weighed with the tenancy's resource weights in force

Revision ID: 0008
Revises: 0007
"""

import json

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

DEFAULT_WEIGHTS = {"gpu": 1.0, "cpu": 0.0625, "memory_gib": 0.0078125}  # tenancy.ResourceWeights' defaults now


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("attained_gpu_s", sa.Double(), nullable=False, server_default="0"))
    _backfill()


def _weights() -> dict[str, float]:
    """The newest tenancy revision's resource weights (its document may omit them: the defaults)."""
    document = op.get_bind().execute(sa.text("SELECT document FROM tenancy_revisions ORDER BY id DESC LIMIT 1"))
    document = document.scalar()
    if isinstance(document, str):  # SQLite hands JSON back as text
        document = json.loads(document)
    stored = (document or {}).get("resource_weights") or {}
    return {name: float(stored.get(name, default)) for name, default in DEFAULT_WEIGHTS.items()}


def _backfill() -> None:
    """Each ended attempt's held seconds (the backend's own held_from→held_until when known,
    else started_at→ended_at; none if it never started) × its job's GPU-equivalent weight."""
    if op.get_bind().dialect.name == "postgresql":

        def seconds(start: str, end: str) -> str:
            return f"EXTRACT(EPOCH FROM a.{end} - a.{start})"
    else:

        def seconds(start: str, end: str) -> str:
            return f"(julianday(a.{end}) - julianday(a.{start})) * 86400.0"

    held = (
        "CASE WHEN a.held_from IS NOT NULL AND a.held_until IS NOT NULL THEN "
        f"{seconds('held_from', 'held_until')} "
        f"WHEN a.started_at IS NOT NULL THEN {seconds('started_at', 'ended_at')} ELSE 0 END"
    )
    op.execute(
        sa.text(
            "UPDATE jobs SET attained_gpu_s = "
            "(jobs.gpus * :gpu + jobs.cpus * :cpu + jobs.memory_mb / 1024.0 * :memory_gib) * "
            f"(SELECT coalesce(sum({held}), 0) FROM attempts a WHERE a.job_id = jobs.id AND a.ended_at IS NOT NULL) "
            "WHERE EXISTS (SELECT 1 FROM attempts a WHERE a.job_id = jobs.id AND a.ended_at IS NOT NULL)"
        ).bindparams(**_weights())
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("attained_gpu_s")
