"""`tunefarm` command line, the one composition root: the only package that imports the API
app, the tuner service and the worker agent together, and the one that starts them.

- `common.py`: consoles, option types, argument parsing and error reporting the commands share;
- `tune.py`: tune (the embedded search on this machine), best, records, spaces, db upgrade;
- `service.py`: serve, tuner, worker, submit, up;
- `service_jobs.py`: jobs, follow, cancel (the service's jobs, through the API);
- `model.py`: tune-model, build, db export, db import;
- `costmodel.py`: model status, model train (the farm's cost models);
- `tokens.py`: token create/list/revoke, and the tokens `up` keeps and reuses;
- `board.py`: board build/up/down/status (an emulated aarch64 board: workers/board.py).

The command modules define plain functions; this module registers every command, in the order
`tunefarm --help` lists them. Nothing imports `tuner.cli` but the entry points (`tunefarm`,
`python -m tuner`).
"""

from __future__ import annotations

import sys

import typer

from tuner.cli import board, costmodel, model, service, service_jobs, tokens, tune
from tuner.core import lean

# the commands that read model files, which may need torch (`tuner.model.load`)
TORCH_COMMANDS = frozenset({"tune-model", "build"})

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="tunefarm: autotuning of tensor programs on Apache TVM.")
db_app = typer.Typer(no_args_is_help=True, help="Tuning database maintenance.")
token_app = typer.Typer(no_args_is_help=True, help="API bearer tokens.")
model_app = typer.Typer(no_args_is_help=True,
                        help="The farm's cost models, one per target (status, train).")
app.add_typer(db_app, name="db")
app.add_typer(token_app, name="token")
board_app = typer.Typer(no_args_is_help=True,
                        help="An emulated aarch64 board on this machine (build, up, down, status).")
app.add_typer(model_app, name="model")
app.add_typer(board_app, name="board")

app.command()(tune.tune)
app.command()(tune.best)
app.command()(tune.records)
app.command()(tune.spaces)
app.command("tune-model")(model.tune_model)
app.command()(model.build)
db_app.command("upgrade")(tune.db_upgrade)
db_app.command("export")(model.db_export)
db_app.command("import")(model.db_import)
model_app.command("status")(costmodel.model_status)
model_app.command("train")(costmodel.model_train)

board_app.command("build")(board.board_build)
board_app.command("up")(board.board_up)
board_app.command("down")(board.board_down)
board_app.command("status")(board.board_status)
token_app.command("create")(tokens.token_create)
token_app.command("list")(tokens.token_list)
token_app.command("revoke")(tokens.token_revoke)
app.command()(service.serve)
app.command("tuner")(service.tuner_cmd)
app.command()(service.worker)
app.command()(service.submit)
app.command()(service_jobs.jobs)
app.command()(service_jobs.follow)
app.command()(service_jobs.cancel)
app.command()(service.up)


def needs_torch(args: list[str]) -> bool:
    """Whether the command in `args` (the command line after the program name) may import
    torch: only those that read a model file do."""
    command = next((a for a in args if not a.startswith("-")), None)
    return command in TORCH_COMMANDS


def main() -> None:
    # `import tvm` imports torch whenever it is installed (`tuner.core.lean`): ~2 s and ~200 MB in
    # every CLI process (a tuner, a worker, the service) that never uses it
    if not needs_torch(sys.argv[1:]):
        lean.skip_unused()
    app()
