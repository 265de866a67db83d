"""admission and faults: queue, flavor, priority, pending reasons, preemption, fault classes,
excluded nodes, steps; tenancy revisions and audit

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from cellscale_hub.store.models import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cluster_queue", sa.String(length=63), nullable=True))
        batch.add_column(sa.Column("flavor", sa.String(length=63), nullable=True))
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("borrowed", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("pending", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("preempt_deadline", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("preempt_reason", sa.Text(), nullable=True))
        batch.add_column(sa.Column("excluded_nodes", sa.JSON(), nullable=False, server_default="[]"))
        batch.create_index("ix_jobs_cluster_queue", ["cluster_queue"])
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("last_checkpoint_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("fault", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("failed_nodes", sa.JSON(), nullable=False, server_default="[]"))
        batch.add_column(sa.Column("last_step", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("last_step_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("resumed_step", sa.Integer(), nullable=True))
    op.create_table(
        "tenancy_revisions",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("document", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("at", UTCDateTime(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("target", sa.String(length=255), nullable=False),
        sa.Column("before", sa.JSON(), nullable=True),
        sa.Column("after", sa.JSON(), nullable=True),
        sa.Column("revision", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_audit_events_at", table_name="audit_events")
    op.drop_table("audit_events")
    op.drop_table("tenancy_revisions")
    with op.batch_alter_table("attempts") as batch:
        for column in ("resumed_step", "last_step_at", "last_step", "failed_nodes", "fault", "last_checkpoint_at"):
            batch.drop_column(column)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_cluster_queue")
        for column in (
            "excluded_nodes",
            "preempt_reason",
            "preempt_deadline",
            "pending",
            "borrowed",
            "priority",
            "flavor",
            "cluster_queue",
        ):
            batch.drop_column(column)
