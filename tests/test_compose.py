"""docker-compose.yml cannot be run here (no Docker engine), so check what can be checked: the
services, their start order and healthchecks, that every command is a real tunefarm command
taking the options given, who holds which credentials (Redis needs a password; the worker holds
none), that the image runs as an unprivileged user, and that the monitoring files beside it
(deploy/) parse, scrape every process on the port its command gives it, and chart only metrics
the code registers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from typer.main import get_command

from tuner.cli import app

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
REDIS_PASSWORD = "${REDIS_PASSWORD:-change-me}"  # from .env; the default is a placeholder


def test_services_start_order_and_healthchecks() -> None:
    assert set(SERVICES) == {"postgres", "redis", "migrate", "api", "tuner", "worker",
                             "prometheus", "grafana"}
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


# --- monitoring: deploy/prometheus.yml and the Grafana dashboard ------------------------------

DEPLOY = ROOT / "deploy"
PROMETHEUS = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
DASHBOARD = json.loads((DEPLOY / "grafana" / "tunefarm-dashboard.json").read_text())


def _option(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_prometheus_scrapes_every_process_on_its_port() -> None:
    jobs = {job["job_name"]: job for job in PROMETHEUS["scrape_configs"]}
    targets: dict[str, tuple[str, int]] = {}
    for name, job in jobs.items():
        assert job.get("metrics_path", "/metrics") == "/metrics"
        for sd in job.get("dns_sd_configs", []):
            (host,) = sd["names"]
            assert sd["type"] == "A"
            targets[name] = (host, int(sd["port"]))
        for static in job.get("static_configs", []):
            (target,) = static["targets"]
            host, port = target.rsplit(":", 1)
            targets[name] = (host, int(port))
    api_port = int(_option(SERVICES["api"]["command"], "--port"))
    assert targets == {
        "tunefarm-api": ("api", api_port),
        "tunefarm-tuner": ("tuner", int(_option(SERVICES["tuner"]["command"], "--metrics-port"))),
        "tunefarm-worker": ("worker",
                            int(_option(SERVICES["worker"]["command"], "--metrics-port")))}
    for name in ("tuner", "worker"):  # reachable from the prometheus container
        assert _option(SERVICES[name]["command"], "--metrics-host") == "0.0.0.0"


def _mounts(service: str) -> dict[str, Path]:
    """{container path: host path} of a service's bind mounts."""
    out = {}
    for volume in SERVICES[service]["volumes"]:
        src, dst = volume.split(":")[:2]
        if src.startswith("./"):
            out[dst] = ROOT / src
    return out


def test_prometheus_and_grafana_are_pinned_and_mount_the_deploy_files() -> None:
    for name in ("prometheus", "grafana"):
        image = SERVICES[name]["image"]
        assert re.fullmatch(r"[a-z/]+:v?\d+\.\d+\.\d+", image), image  # a pinned release
        for host_path in _mounts(name).values():
            assert host_path.exists(), host_path
    assert _mounts("prometheus")["/etc/prometheus/prometheus.yml"] == DEPLOY / "prometheus.yml"
    grafana = _mounts("grafana")
    provisioning = grafana["/etc/grafana/provisioning"]
    sources = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())
    (source,) = sources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((provisioning / "dashboards" / "tunefarm.yml").read_text())
    folder = providers["providers"][0]["options"]["path"]
    dashboards = {dst: src for dst, src in grafana.items() if dst.startswith(folder + "/")}
    assert list(dashboards.values()) == [DEPLOY / "grafana" / "tunefarm-dashboard.json"]
    # every panel queries the provisioned data source
    for panel in DASHBOARD["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == source["uid"], panel["title"]


# A family registered in the code: `Counter("tunefarm_x", ...)`, `GaugeMetricFamily("...")`.
_REGISTERED = re.compile(r"\b(Counter|Gauge|Histogram|Summary|GaugeMetricFamily|"
                         r"CounterMetricFamily)\(\s*\"(tunefarm_\w+)\"")
# the samples a family of each kind exposes: name + suffix
_SUFFIXES = {"Counter": ("_total",), "CounterMetricFamily": ("_total",),
             "Gauge": ("",), "GaugeMetricFamily": ("",),
             "Histogram": ("_bucket", "_count", "_sum"), "Summary": ("_count", "_sum")}


def registered_samples() -> dict[str, str]:
    """{sample name: the file registering it} of every tunefarm metric in the code."""
    out = {}
    for pkg in ("tuner", "workers", "api"):
        for path in (ROOT / pkg).rglob("*.py"):
            for kind, name in _REGISTERED.findall(path.read_text()):
                if _SUFFIXES[kind] == ("_total",):  # a counter may be named with its suffix
                    name = name.removesuffix("_total")
                for suffix in _SUFFIXES[kind]:
                    out[name + suffix] = str(path.relative_to(ROOT))
    return out


def test_the_dashboard_charts_only_registered_metrics() -> None:
    registered = registered_samples()
    # the metrics each process registers, by file (the grep finds them all)
    assert registered["tunefarm_worker_measurements_total"] == "workers/agent_metrics.py"
    assert registered["tunefarm_queue_depth"] == "workers/service_metrics.py"
    assert registered["tunefarm_http_requests_total"] == "api/metrics.py"
    exprs = [t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", [])]
    used = {m for e in exprs for m in re.findall(r"\btunefarm_\w+", e)}
    unknown = sorted(used - set(registered))
    assert not unknown, f"the dashboard queries metrics no code registers: {unknown}"
    # and it charts what the issue asks for
    for sample in ("tunefarm_worker_measurements_total", "tunefarm_worker_build_seconds_bucket",
                   "tunefarm_worker_run_seconds_bucket", "tunefarm_queue_depth",
                   "tunefarm_queue_oldest_age_seconds", "tunefarm_lease_reclaims_total",
                   "tunefarm_dead_letters_total", "tunefarm_cost_model_fit_seconds_bucket",
                   "tunefarm_http_requests_total",
                   "tunefarm_http_request_duration_seconds_bucket"):
        assert sample in used, sample
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids)) and DASHBOARD["uid"] == "tunefarm"
    for panel in DASHBOARD["panels"]:
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]
