"""A record names the knob values of its candidate (records.knobs_json: {knob: value}, as
`tunefarm spaces` names the knobs; "{}" for records measured before); a workload the bytes of
its parameters (workloads.nbytes: the least a run moves, for GB/s; 0 where not known)"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0009", "0008"


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
