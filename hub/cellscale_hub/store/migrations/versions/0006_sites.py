"""sites: a job's choice of sites (the backends admission may place it on, the data it
reads); per attempt the size of its newest checkpoint (moving it to another site costs), the
nodes it held, and its share of a cloud pool's bill

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("placement", sa.JSON(), nullable=True))
    with op.batch_alter_table("attempts") as batch:
        batch.add_column(sa.Column("checkpoint_bytes", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("nodes", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("cloud_usd", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("attempts") as batch:
        batch.drop_column("cloud_usd")
        batch.drop_column("nodes")
        batch.drop_column("checkpoint_bytes")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("placement")
