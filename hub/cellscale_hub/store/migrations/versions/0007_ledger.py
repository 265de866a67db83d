"""ledger: what a job was expected to cost at submit; the cost ledger (one row per attempt and
metering interval; one per flavor's capacity span); per attempt the backend's own start and
end of its allocation, how far the ledger covers it, and what it used so far (cumulative, from its nodes' usage records)

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("estimate", sa.JSON(), nullable=True))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("flavor", sa.String(63), nullable=True))
        batch.add_column(sa.Column("held_from", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("held_until", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("metered_until", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("gpu_used_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("cpu_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("memory_peak_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("usd", sa.Double(), nullable=True))
    op.create_table(
        "ledger",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("attempt_id", sa.Integer(), sa.ForeignKey("attempts.id", ondelete="CASCADE"), nullable=False),
        sa.Column("job_id", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("tenant", sa.String(255), nullable=False),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("backend", sa.String(63), nullable=False),
        sa.Column("flavor", sa.String(63), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_s", sa.Double(), nullable=False),
        sa.Column("gpu_used_s", sa.Double(), nullable=True),
        sa.Column("cpu_s", sa.Double(), nullable=False),
        sa.Column("usd_per_gpu_hour", sa.Double(), nullable=False),
        sa.Column("usd", sa.Double(), nullable=False),
    )
    op.create_index("ix_ledger_attempt_id", "ledger", ["attempt_id"])
    op.create_index("ix_ledger_job_id", "ledger", ["job_id"])
    op.create_index("ix_ledger_end", "ledger", ["end"])
    op.create_index("ix_ledger_tenant_end", "ledger", ["tenant", "end"])
    op.create_table(
        "ledger_hours",
        sa.Column("tenant", sa.String(255), primary_key=True),
        sa.Column("hour", sa.DateTime(timezone=True), primary_key=True),
        sa.Column("owner", sa.String(255), primary_key=True),
        sa.Column("backend", sa.String(63), primary_key=True),
        sa.Column("flavor", sa.String(63), primary_key=True),
        sa.Column("gpu_s", sa.Double(), nullable=False),
        sa.Column("gpu_used_s", sa.Double(), nullable=False),
        sa.Column("usd", sa.Double(), nullable=False),
    )
    op.create_table(
        "ledger_capacity",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("flavor", sa.String(63), nullable=False),
        sa.Column("backend", sa.String(63), nullable=False),
        sa.Column("start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("usd_per_gpu_hour", sa.Double(), nullable=False),
    )
    op.create_index("ix_ledger_capacity_end", "ledger_capacity", ["end"])


def downgrade() -> None:
    op.drop_table("ledger_capacity")
    op.drop_table("ledger_hours")
    op.drop_table("ledger")
    with op.batch_alter_table("attempts") as batch:
        for column in (
            "usd",
            "memory_peak_bytes",
            "cpu_s",
            "gpu_used_s",
            "metered_until",
            "held_until",
            "held_from",
            "flavor",
        ):
            batch.drop_column(column)
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("estimate")
