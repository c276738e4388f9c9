"""The worker holding an issued trial's lease (only it may answer the trial); why a running job
waits (jobs.message)"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0007", "0006"


def upgrade() -> None:
    with op.batch_alter_table("issued_trials") as batch:
        batch.add_column(sa.Column("holder", sa.String(length=128), nullable=True))
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("message", sa.String(length=500), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("message")
    with op.batch_alter_table("issued_trials") as batch:
        batch.drop_column("holder")
