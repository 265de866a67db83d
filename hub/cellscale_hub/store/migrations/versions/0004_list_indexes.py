"""indexes: a user's and a desk's jobs newest first without sorting all of them; warned jobs
without scanning every job each cycle

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_owner_created", "jobs", ["owner", "created_at", "id"])
    op.create_index("ix_jobs_tenant_created", "jobs", ["tenant", "created_at", "id"])
    op.create_index("ix_jobs_preempt_deadline", "jobs", ["preempt_deadline"])


def downgrade() -> None:
    op.drop_index("ix_jobs_preempt_deadline", table_name="jobs")
    op.drop_index("ix_jobs_tenant_created", table_name="jobs")
    op.drop_index("ix_jobs_owner_created", table_name="jobs")
