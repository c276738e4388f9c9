"""The tuning database's records as schedules, for whoever asks: `records` (the best record of a
workload replayed from its trace, for `GET /v1/best`, `tunefarm best` and the CLI's listings),
`ms_database.TunefarmDatabase` (a `meta_schedule.Database` over the SQL store, for
`relax.transform.MetaScheduleApplyDatabase` and `tune_relax`) and `ms_json` (TVM's JSON database
files in and out: `tunefarm db export/import`). They replay traces, so they sit above the
schedules (pyproject.toml's `[tool.tunefarm.layers]`).
"""
