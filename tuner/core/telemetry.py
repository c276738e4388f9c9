"""Prometheus metrics of the processes that are not the API (tuners, workers): an HTTP endpoint
serving one `CollectorRegistry` at `/metrics`, and a bound on label values.

    server = serve_metrics(registry, "127.0.0.1", 9101)   # a daemon thread; server.close()

The endpoint answers GET /metrics (the Prometheus text format) and nothing else; when a metrics
token is set (TUNEFARM_METRICS_TOKEN, as for the API's /metrics) it wants
`Authorization: Bearer <token>`. It binds to 127.0.0.1 unless told otherwise
(TUNEFARM_METRICS_HOST / --metrics-host): a scraper on another host needs 0.0.0.0.
"""

from __future__ import annotations

import hmac
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)

from tuner.core.config import Settings
from tuner.core.errors import TunefarmError

# no `<counter>_created` series (a timestamp per counter and histogram, twice the series for
# nothing a dashboard uses); counters made after this import, by any module, leave them out
disable_created_metrics()

log = logging.getLogger(__name__)

OTHER = "_other"  # the label value of everything past a LabelCap's limit


class LabelCap:
    """Keeps a label's values bounded: the first `limit` distinct values pass, later new ones
    become OTHER (a device key is chosen by whoever submits a job or registers a worker; a
    metric's series must not grow with them without bound)."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()
        self._warned = False

    def __call__(self, value: str) -> str:
        with self._lock:
            if value in self._seen:
                return value
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
            if not self._warned:
                self._warned = True
                log.warning("metrics: more than %d label values; new ones are counted as %r",
                            self.limit, OTHER)
            return OTHER


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    registry: CollectorRegistry
    token: str | None


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self._answer(404, b"not found: the metrics are at /metrics\n")
            return
        token = self.server.token
        if token:
            sent = self.headers.get("Authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                self._answer(401, b"/metrics needs 'Authorization: Bearer <the metrics token>'\n",
                             extra={"WWW-Authenticate": "Bearer"})
                return
        try:
            body = generate_latest(self.server.registry)
        except Exception:  # a collector failed: say so, never kill the server thread
            log.exception("metrics: a collector failed")
            self._answer(500, b"a metrics collector failed (see the process log)\n")
            return
        self._answer(200, body, CONTENT_TYPE_LATEST)

    def _answer(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
                extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("metrics %s - %s", self.address_string(), format % args)


class MetricsServer:
    """The running endpoint (`port`: the bound one, useful when asked for port 0)."""

    def __init__(self, httpd: _Server) -> None:
        self._httpd = httpd
        self.host, self.port = str(httpd.server_address[0]), int(httpd.server_address[1])
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.5},
                                        daemon=True, name="metrics-http")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def serve_metrics(registry: CollectorRegistry, host: str, port: int,
                  token: str | None = None) -> MetricsServer:
    """Serve `registry` at http://host:port/metrics from a daemon thread (port 0: any free one).
    A port that cannot be bound is a TunefarmError naming it."""
    try:
        httpd = _Server((host, port), _Handler)
    except OSError as exc:
        raise TunefarmError(f"cannot serve metrics on {host}:{port}: {exc} (choose another "
                            "--metrics-port / TUNEFARM_METRICS_PORT, or 0 for none)") from exc
    httpd.registry = registry
    httpd.token = token or None
    server = MetricsServer(httpd)
    log.info("metrics at %s", server.url)
    return server


def serve_configured(registry: CollectorRegistry, settings: Settings, port: int | None = None,
                     host: str | None = None) -> MetricsServer | None:
    """Serve `registry` on `port` (default TUNEFARM_METRICS_PORT; 0: none) at `host` (default
    TUNEFARM_METRICS_HOST), with TUNEFARM_METRICS_TOKEN; None when off."""
    port = settings.metrics_port if port is None else port
    if not port:
        return None
    return serve_metrics(registry, host or settings.metrics_host, port, settings.metrics_token)
