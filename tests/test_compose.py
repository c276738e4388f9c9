"""docker-compose.yml cannot be run here (no Docker engine), so check what can be checked: the
services, their start order and healthchecks, and that every command is a real tunefarm command
taking the options given."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml
from typer.main import get_command

from tuner.cli import app

COMPOSE = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]


def test_services_start_order_and_healthchecks() -> None:
    assert set(SERVICES) == {"postgres", "redis", "migrate", "api", "tuner", "worker"}
    for name, svc in SERVICES.items():
        for dep, cond in (svc.get("depends_on") or {}).items():
            assert dep in SERVICES, f"{name} depends on unknown {dep}"
            assert cond["condition"] in ("service_healthy", "service_started",
                                         "service_completed_successfully")
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in SERVICES[dep], f"{dep} has no healthcheck"
    assert SERVICES["api"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    for name in ("tuner", "worker", "api", "migrate"):
        env = SERVICES[name]["environment"]
        assert env["TUNEFARM_DATABASE_URL"].startswith("postgresql://")
        assert env["TUNEFARM_REDIS_URL"] == "redis://redis:6379/0"


def _check(args: list[str]) -> None:
    """Parse `tunefarm ARGS` with the real CLI (options and all) without running the command."""
    import click

    cmd: click.Command = get_command(app)
    rest = list(args)
    while isinstance(cmd, click.Group):
        assert rest and rest[0] in cmd.commands, f"not a tunefarm command: {args}"
        cmd = cmd.commands[rest.pop(0)]
    cmd.make_context(cmd.name or "", rest)  # raises on an unknown option or a bad value


def test_commands_are_tunefarm_commands() -> None:
    for name in ("migrate", "api", "tuner"):
        _check(SERVICES[name]["command"])
    script = SERVICES["worker"]["command"][0].replace("$$", "$")
    token_cmd = script[script.index("$(") + 2:script.index("|")].split()
    assert token_cmd[0] == "tunefarm"
    _check(token_cmd[1:])
    worker_cmd = shlex.split(script[script.index("exec ") + 5:])
    assert worker_cmd[0] == "tunefarm"
    _check(worker_cmd[1:])
