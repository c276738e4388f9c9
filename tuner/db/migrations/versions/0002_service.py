"""service: job leases and wall budgets, API tokens, workers"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0002", "0001"


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("lease_owner", sa.String(length=128), nullable=True))
        batch.add_column(_ts("lease_expires_at", nullable=True))
        batch.add_column(sa.Column("wall_budget_s", sa.Float(), nullable=True))
    op.create_index(op.f("ix_jobs_created_at"), "jobs", ["created_at"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        _ts("created_at"),
        _ts("revoked_at", nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_hash", name=op.f("uq_tokens_token_hash")),
    )

    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("device_key", sa.String(length=64), nullable=False),
        sa.Column("target_json", sa.Text(), nullable=False),
        sa.Column("capabilities_json", sa.Text(), nullable=False),
        sa.Column("tvm_version", sa.String(length=64), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("measured", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("infra_failures", sa.Integer(), nullable=False),
        _ts("registered_at"),
        _ts("last_seen_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    op.create_index(op.f("ix_workers_device_key"), "workers", ["device_key"], unique=False)


def downgrade() -> None:
    op.drop_table("workers")
    op.drop_table("tokens")
    op.drop_index(op.f("ix_jobs_created_at"), table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("wall_budget_s")
        batch.drop_column("lease_expires_at")
        batch.drop_column("lease_owner")
