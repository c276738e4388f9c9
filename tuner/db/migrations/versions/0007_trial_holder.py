"""The worker holding an issued trial's lease (only it may answer the trial); why a running job
waits (jobs.message)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-02 01:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = depends_on = None


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
