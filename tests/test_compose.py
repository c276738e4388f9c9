"""docker-compose.yml cannot be run here (no Docker engine), so check what can be checked: the
services, their start order and healthchecks, that every command is a real tunefarm command
taking the options given, who holds which credentials (Redis needs a password; the worker holds
none), and that the image runs as an unprivileged user."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.main import get_command

from tuner.cli import app

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
REDIS_PASSWORD = "${REDIS_PASSWORD:-change-me}"  # from .env; the default is a placeholder


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
    for name in ("tuner", "api", "migrate"):
        env = SERVICES[name]["environment"]
        assert env["TUNEFARM_DATABASE_URL"].startswith("postgresql://")
    # the worker holds only the API URL and its token: no database or Redis credentials
    assert set(SERVICES["worker"]["environment"]) == {"TUNEFARM_API_URL", "TUNEFARM_TOKEN"}


def test_redis_needs_a_password_that_only_the_api_and_tuner_hold() -> None:
    redis = SERVICES["redis"]
    command = redis["command"]
    assert command[command.index("--requirepass") + 1] == REDIS_PASSWORD
    assert redis["environment"]["REDISCLI_AUTH"] == REDIS_PASSWORD  # for the healthcheck
    for name in ("api", "tuner"):
        url = SERVICES[name]["environment"]["TUNEFARM_REDIS_URL"]
        assert url == f"redis://:{REDIS_PASSWORD}@redis:6379/0", name
    worker = SERVICES["worker"]["environment"]
    assert "TUNEFARM_DATABASE_URL" not in worker and "TUNEFARM_REDIS_URL" not in worker
    assert not any("redis://" in str(v) or "postgresql://" in str(v) for v in worker.values())


def test_the_image_runs_as_an_unprivileged_user() -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    users = [ln.split()[1] for ln in lines if ln.startswith("USER ")]
    assert users and users[-1] == "tunefarm"  # the last USER is the one processes run as
    text = "\n".join(lines)
    assert "useradd" in text and " tunefarm" in text.split("useradd", 1)[1].split("\n")[0]
    assert "chown tunefarm:tunefarm /data" in text and "TUNEFARM_DATA_DIR=/data" in text
    assert lines.index(f"USER {users[-1]}") < lines.index('ENTRYPOINT ["tunefarm"]')


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
    for name in ("migrate", "api", "tuner", "worker"):
        _check(SERVICES[name]["command"])
