"""A record names the knob values of its candidate (records.knobs_json: {knob: value}, as
`tunefarm spaces` names the knobs; "{}" for records measured before)

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


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("knobs_json")
