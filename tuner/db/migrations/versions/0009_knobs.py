"""A record names the knob values of its candidate (records.knobs_json: {knob: value}, as
`tunefarm spaces` names the knobs; "{}" for records measured before); a workload the bytes of
its parameters (workloads.nbytes: the least a run moves, for GB/s; 0 where not known)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-06 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("knobs_json", sa.Text(), nullable=False, server_default="{}"))
    with op.batch_alter_table("workloads") as batch:
        batch.add_column(sa.Column("nbytes", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    with op.batch_alter_table("workloads") as batch:
        batch.drop_column("nbytes")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("knobs_json")
