"""No single worker sets a best: a farm record is served once a second measurement confirms it
(records.trust, records.confirms, records.confirmed_s; issued_trials.confirms and .avoid)"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0008", "0007"


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("trust", sa.String(length=16), nullable=False,
                                   server_default="local"))
        batch.add_column(sa.Column("confirms", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("confirmed_s", sa.Float(), nullable=True))
    with op.batch_alter_table("issued_trials") as batch:
        batch.add_column(sa.Column("confirms", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("avoid", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("issued_trials") as batch:
        batch.drop_column("avoid")
        batch.drop_column("confirms")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("confirmed_s")
        batch.drop_column("confirms")
        batch.drop_column("trust")
