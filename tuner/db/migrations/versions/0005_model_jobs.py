"""Model jobs: a parent job per model, its tasks, and the task jobs' link to it"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0005", "0004"


def _ts(name: str, nullable: bool = False) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "model_jobs",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("model_key", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("owner", sa.String(length=128), nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("space", sa.String(length=64), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("round_trials", sa.Integer(), nullable=False),
        sa.Column("options_json", sa.Text(), nullable=False),
        sa.Column("wall_budget_s", sa.Float(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("estimates_json", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("request_hash", sa.String(length=64), nullable=True),
        _ts("created_at"),
        _ts("updated_at"),
        _ts("started_at", True),
        _ts("finished_at", True),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"],
                                name=op.f("fk_model_jobs_target_id_targets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_jobs")),
        sa.UniqueConstraint("owner", "idempotency_key",
                            name=op.f("uq_model_jobs_owner_idempotency_key")),
    )
    for col in ("model_key", "owner", "state", "created_at"):
        op.create_index(op.f(f"ix_model_jobs_{col}"), "model_jobs", [col], unique=False)
    op.create_table(
        "model_tasks",
        sa.Column("model_id", sa.String(length=32), nullable=False),
        sa.Column("idx", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("space", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=True),
        sa.Column("prior_trials", sa.Integer(), nullable=False),
        sa.Column("history_json", sa.Text(), nullable=False),
        sa.Column("round_from", sa.Integer(), nullable=False),
        sa.Column("done", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name=op.f("fk_model_tasks_job_id_jobs")),
        sa.ForeignKeyConstraint(["model_id"], ["model_jobs.id"],
                                name=op.f("fk_model_tasks_model_id_model_jobs")),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"],
                                name=op.f("fk_model_tasks_workload_id_workloads")),
        sa.PrimaryKeyConstraint("model_id", "idx", name=op.f("pk_model_tasks")),
    )
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("model_id", sa.String(length=32), nullable=True))
        batch.create_foreign_key(op.f("fk_jobs_model_id_model_jobs"), "model_jobs",
                                 ["model_id"], ["id"])
        batch.create_index(op.f("ix_jobs_model_id"), ["model_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index(op.f("ix_jobs_model_id"))
        batch.drop_constraint(op.f("fk_jobs_model_id_model_jobs"), type_="foreignkey")
        batch.drop_column("model_id")
    op.drop_table("model_tasks")
    for col in ("model_key", "owner", "state", "created_at"):
        op.drop_index(op.f(f"ix_model_jobs_{col}"), table_name="model_jobs")
    op.drop_table("model_jobs")
