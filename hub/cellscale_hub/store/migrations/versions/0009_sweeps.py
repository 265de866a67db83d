"""sweeps: a job's points (status, tries, where the result is; the result cache by owner and
key) and the arrays that ran them; jobs.sweep keeps a sweep's counts by status

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

UTC_DATETIME = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("sweep", sa.JSON(), nullable=True))
    op.create_table(
        "sweep_points",
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("index", sa.Integer(), primary_key=True),
        sa.Column("owner", sa.String(255), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("tries", sa.Integer(), nullable=False),
        sa.Column("faults", sa.JSON(), nullable=False),
        sa.Column("array", sa.Integer(), nullable=True),
        sa.Column("node", sa.String(255), nullable=True),
        sa.Column("wall_s", sa.Double(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column("result_job", sa.String(32), nullable=True),
        sa.Column("result_array", sa.Integer(), nullable=True),
        sa.Column("result_point", sa.Integer(), nullable=True),
        sa.Column("stamp", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_sweep_points_cache", "sweep_points", ["owner", "key", "status"])
    op.create_index("ix_sweep_points_job_stamp", "sweep_points", ["job_id", "stamp"])
    op.create_table(
        "sweep_arrays",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String(32), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("offset", sa.Integer(), nullable=False),
        sa.Column("tasks", sa.JSON(), nullable=False),
        sa.Column("excluded_nodes", sa.JSON(), nullable=False),
        sa.Column("throttle", sa.Integer(), nullable=False),
        sa.Column("backend_ref", sa.String(255), nullable=True),
        sa.Column("ended", sa.Boolean(), nullable=False),
        sa.Column("submitted_at", UTC_DATETIME, nullable=True),
        sa.UniqueConstraint("job_id", "number", name="uq_sweep_arrays_job_number"),
    )
    op.create_index("ix_sweep_arrays_job_id", "sweep_arrays", ["job_id"])


def downgrade() -> None:
    op.drop_table("sweep_arrays")
    op.drop_table("sweep_points")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("sweep")
