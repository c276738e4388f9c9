"""MetaSchedule's database contract: records' mean run time, workload hashes per module equality"""

import json

import sqlalchemy as sa
from alembic import op

revision, down_revision = "0004", "0003"

_BATCH = 1000


def _mean(latencies_json: str) -> float | None:
    samples = json.loads(latencies_json)
    return sum(float(x) for x in samples) / len(samples) if samples else None


def upgrade() -> None:
    with op.batch_alter_table("records") as batch:
        batch.add_column(sa.Column("mean_s", sa.Float(), nullable=True))
    op.create_index("ix_records_workload_target_invalidity_mean", "records",
                    ["workload_id", "target_id", "invalidity", "mean_s"], unique=False)

    # the mean of every stored record's samples, in batches (keyset on id)
    records = sa.table("records", sa.column("id", sa.Integer()),
                       sa.column("latencies_json", sa.Text()), sa.column("mean_s", sa.Float()))
    conn = op.get_bind()
    last = 0
    while True:
        rows = conn.execute(sa.select(records.c.id, records.c.latencies_json)
                            .where(records.c.id > last).order_by(records.c.id)
                            .limit(_BATCH)).all()
        if not rows:
            break
        for rid, lat in rows:
            mean = _mean(lat)
            if mean is not None:
                conn.execute(records.update().where(records.c.id == rid).values(mean_s=mean))
        last = rows[-1][0]

    op.create_table(
        "workload_hashes",
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("hash", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"],
                                name=op.f("fk_workload_hashes_workload_id_workloads")),
        sa.PrimaryKeyConstraint("workload_id", "mode", name=op.f("pk_workload_hashes")),
    )
    op.create_index("ix_workload_hashes_mode_hash", "workload_hashes", ["mode", "hash"],
                    unique=False)


def downgrade() -> None:
    op.drop_index("ix_workload_hashes_mode_hash", table_name="workload_hashes")
    op.drop_table("workload_hashes")
    op.drop_index("ix_records_workload_target_invalidity_mean", table_name="records")
    with op.batch_alter_table("records") as batch:
        batch.drop_column("mean_s")
