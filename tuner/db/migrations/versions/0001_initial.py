"""initial schema: workloads, targets, jobs, records"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0001", None


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("op", sa.String(length=32), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("shash", sa.String(length=16), nullable=False),
        sa.Column("mod_json", sa.Text(), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("flops", sa.BigInteger(), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workloads")),
        sa.UniqueConstraint("key", name=op.f("uq_workloads_key")),
    )
    op.create_index(op.f("ix_workloads_shash"), "workloads", ["shash"], unique=False)

    op.create_table(
        "targets",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("target_json", sa.Text(), nullable=False),
        sa.Column("device_key", sa.String(length=64), nullable=False),
        _ts("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_targets")),
        sa.UniqueConstraint("key", name=op.f("uq_targets_key")),
    )

    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("job_key", sa.String(length=64), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("space", sa.String(length=64), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("options_json", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        _ts("started_at", nullable=True),
        _ts("finished_at", nullable=True),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"],
                                name=op.f("fk_jobs_workload_id_workloads")),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"],
                                name=op.f("fk_jobs_target_id_targets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_jobs_idempotency_key")),
    )
    op.create_index(op.f("ix_jobs_job_key"), "jobs", ["job_key"], unique=False)
    op.create_index(op.f("ix_jobs_state"), "jobs", ["state"], unique=False)

    op.create_table(
        "records",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("trial_id", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("space", sa.String(length=64), nullable=False),
        sa.Column("cand_hash", sa.String(length=32), nullable=False),
        sa.Column("trace_json", sa.Text(), nullable=False),
        sa.Column("decisions_json", sa.Text(), nullable=False),
        sa.Column("latencies_json", sa.Text(), nullable=False),
        sa.Column("median_s", sa.Float(), nullable=True),
        sa.Column("cv", sa.Float(), nullable=True),
        sa.Column("invalidity", sa.String(length=16), nullable=False),
        sa.Column("error_msg", sa.Text(), nullable=True),
        sa.Column("worker", sa.String(length=128), nullable=True),
        sa.Column("build_s", sa.Float(), nullable=True),
        sa.Column("features", sa.LargeBinary(), nullable=True),
        sa.Column("tvm_version", sa.String(length=64), nullable=False),
        _ts("created_at"),
        _ts("measured_at"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_records_job_id_jobs")),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"],
                                name=op.f("fk_records_workload_id_workloads")),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"],
                                name=op.f("fk_records_target_id_targets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_records")),
        sa.UniqueConstraint("trial_id", name=op.f("uq_records_trial_id")),
    )
    op.create_index(op.f("ix_records_job_id"), "records", ["job_id"], unique=False)
    op.create_index("ix_records_workload_target_cand", "records",
                    ["workload_id", "target_id", "cand_hash"], unique=False)
    op.create_index("ix_records_workload_target_invalidity_median", "records",
                    ["workload_id", "target_id", "invalidity", "median_s"], unique=False)


def downgrade() -> None:
    op.drop_table("records")  # drops its indexes too
    op.drop_table("jobs")
    op.drop_table("targets")
    op.drop_table("workloads")
