"""per-queue totals kept on change (waiting jobs and GPUs, GPU-seconds of ended attempts);
reasons for waiting leave the jobs table (the controller keeps them in memory); indexes for
"my jobs in a phase" and recently ended attempts; a job's inputs bundle as a column (the
bundle sweep reads it for the few jobs that have one, not every job's spec); a job's CPUs
and memory as columns (admission counts them)

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_totals",
        sa.Column("cluster_queue", sa.String(length=63), primary_key=True),
        sa.Column("pending_jobs", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("pending_gpus", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("pending_cpus", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("ended_gpu_seconds", sa.Double(), nullable=False, server_default="0"),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("cpus", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("memory_mb", sa.Integer(), nullable=False, server_default="0"))
    _backfill_cpus()
    _backfill()
    op.create_index("ix_jobs_owner_phase_created", "jobs", ["owner", "phase", "created_at", "id"])
    op.create_index("ix_attempts_ended_at", "attempts", ["ended_at"])
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("pending")
        batch.add_column(sa.Column("inputs_sha256", sa.String(length=64), nullable=True))
        batch.create_index("ix_jobs_inputs_sha256", ["inputs_sha256"])
    inputs = (
        "spec ->> 'inputs_sha256'"
        if op.get_bind().dialect.name == "postgresql"
        else "json_extract(spec, '$.inputs_sha256')"
    )
    op.execute(f"UPDATE jobs SET inputs_sha256 = {inputs} WHERE {inputs} IS NOT NULL")


def _backfill_cpus() -> None:
    """Jobs stored before CPUs were counted asked for one core per process: one per GPU for
    torchrun, else one per node."""
    if op.get_bind().dialect.name == "postgresql":
        launcher, nodes = "spec ->> 'launcher'", "CAST(spec -> 'resources' ->> 'nodes' AS INTEGER)"
    else:
        launcher, nodes = "json_extract(spec, '$.launcher')", "CAST(json_extract(spec, '$.resources.nodes') AS INTEGER)"
    op.execute(
        f"UPDATE jobs SET cpus = CASE WHEN {launcher} = 'torchrun' AND gpus > 0 THEN gpus ELSE coalesce({nodes}, 1) END"
    )


def _backfill() -> None:
    seconds = (
        "EXTRACT(EPOCH FROM a.ended_at - a.started_at)"
        if op.get_bind().dialect.name == "postgresql"
        else "(julianday(a.ended_at) - julianday(a.started_at)) * 86400.0"
    )
    op.execute(
        "INSERT INTO queue_totals (cluster_queue, pending_jobs, pending_gpus, ended_gpu_seconds) "
        "SELECT cluster_queue, 0, 0, 0 FROM jobs WHERE cluster_queue IS NOT NULL GROUP BY cluster_queue"
    )
    op.execute(
        "UPDATE queue_totals SET "
        "pending_jobs = (SELECT count(*) FROM jobs j WHERE j.cluster_queue = queue_totals.cluster_queue "
        "AND j.phase = 'PENDING'), "
        "pending_gpus = (SELECT coalesce(sum(j.gpus), 0) FROM jobs j "
        "WHERE j.cluster_queue = queue_totals.cluster_queue AND j.phase = 'PENDING'), "
        "pending_cpus = (SELECT coalesce(sum(j.cpus), 0) FROM jobs j "
        "WHERE j.cluster_queue = queue_totals.cluster_queue AND j.phase = 'PENDING'), "
        f"ended_gpu_seconds = (SELECT coalesce(sum(j.gpus * {seconds}), 0) FROM attempts a "
        "JOIN jobs j ON j.id = a.job_id WHERE j.cluster_queue = queue_totals.cluster_queue "
        "AND a.started_at IS NOT NULL AND a.ended_at IS NOT NULL)"
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_inputs_sha256")
        batch.drop_column("inputs_sha256")
        batch.drop_column("memory_mb")
        batch.drop_column("cpus")
        batch.add_column(sa.Column("pending", sa.JSON(), nullable=True))
    op.drop_index("ix_attempts_ended_at", table_name="attempts")
    op.drop_index("ix_jobs_owner_phase_created", table_name="jobs")
    op.drop_table("queue_totals")
