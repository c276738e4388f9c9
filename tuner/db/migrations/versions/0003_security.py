"""security: job owners (idempotency keys per owner), token expiry, issued trials, worker tokens"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0003", "0002"


def _ts(name: str, nullable: bool = False) -> sa.Column:
    """A timezone-aware timestamp column."""
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    # jobs submitted before owners existed belong to the embedded CLI's owner
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(length=128), nullable=False,
                                   server_default="local"))
        batch.drop_constraint("uq_jobs_idempotency_key", type_="unique")
        batch.create_unique_constraint(op.f("uq_jobs_owner_idempotency_key"),
                                       ["owner", "idempotency_key"])
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("owner", server_default=None)
    op.create_index(op.f("ix_jobs_owner"), "jobs", ["owner"], unique=False)

    with op.batch_alter_table("tokens") as batch:
        batch.add_column(_ts("expires_at", nullable=True))
        batch.add_column(sa.Column("device_key", sa.String(length=64), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("token_id", sa.Integer(), nullable=True))

    op.create_table(
        "issued_trials",
        sa.Column("trial_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("device_key", sa.String(length=64), nullable=False),
        sa.Column("cand_hash", sa.String(length=32), nullable=False),
        sa.Column("input_sha256", sa.String(length=64), nullable=False),
        _ts("issued_at"),
        _ts("expires_at"),
        _ts("used_at", nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"],
                                name=op.f("fk_issued_trials_job_id_jobs")),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"],
                                name=op.f("fk_issued_trials_workload_id_workloads")),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"],
                                name=op.f("fk_issued_trials_target_id_targets")),
        sa.PrimaryKeyConstraint("trial_id", name=op.f("pk_issued_trials")),
    )
    op.create_index(op.f("ix_issued_trials_job_id"), "issued_trials", ["job_id"], unique=False)
    op.create_index(op.f("ix_issued_trials_expires_at"), "issued_trials", ["expires_at"],
                    unique=False)


def downgrade() -> None:
    op.drop_table("issued_trials")
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("token_id")
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("device_key")
        batch.drop_column("expires_at")
    op.drop_index(op.f("ix_jobs_owner"), table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint("uq_jobs_owner_idempotency_key", type_="unique")
        batch.create_unique_constraint("uq_jobs_idempotency_key", ["idempotency_key"])
        batch.drop_column("owner")
