"""The farm's cost models (one versioned model per target), records' predicted latency"""

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0006", "0005"


def upgrade() -> None:
    op.create_table(
        "cost_models",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("target_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("objective", sa.String(length=32), nullable=False),
        sa.Column("feature_dim", sa.Integer(), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("last_record_id", sa.Integer(), nullable=False),
        sa.Column("full", sa.Boolean(), nullable=False),
        sa.Column("booster", sa.LargeBinary(), nullable=False),
        sa.Column("metrics_json", sa.Text(), nullable=False),
        sa.Column("train_s", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["target_id"], ["targets.id"],
                                name=op.f("fk_cost_models_target_id_targets")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cost_models")),
        sa.UniqueConstraint("target_id", "version",
                            name=op.f("uq_cost_models_target_id_version")),
    )
    op.create_index(op.f("ix_cost_models_target_id"), "cost_models", ["target_id"],
                    unique=False)
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("predicted_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.drop_column("predicted_s")
    op.drop_index(op.f("ix_cost_models_target_id"), table_name="cost_models")
    op.drop_table("cost_models")
