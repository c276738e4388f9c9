"""Load benchmark of the REST service: `python -m bench.load` (not a test).

Starts `tunefarm serve` on a free loopback port against a fresh SQLite database (or `--db`) and
the Redis at TUNEFARM_REDIS_URL (keys under a random prefix, deleted afterwards), tunes a tiny
matmul for a few trials so `GET /v1/best` has a real record, then drives the API open-loop:

1. `GET /v1/best` at `--best-rate` requests/s (default 500) for `--duration` s;
2. `POST /v1/jobs` at `--jobs-rate` requests/s (default 50) for `--duration` s.

Open loop: request i is due at start + i/rate whatever happened before, and its latency counts
from that due time (a slow server cannot hide its backlog). Reports p50/p90/p99/max and errors,
and writes JSON to `--out`. The generator runs in this process on the same machine as the
server (2 cores here), so it competes with it for CPU: the figures are an upper bound.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SPEC = {"op": "matmul", "shape": [64, 64, 64]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _request(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> int:
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    if length:
        await reader.readexactly(length)
    return status


async def _open_loop(port: int, raws: list[bytes], rate: float, conns: int) -> dict[str, Any]:
    clock = time.perf_counter  # uvloop's loop.time() ticks in whole milliseconds
    idle: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = asyncio.Queue()
    for _ in range(conns):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    lat: list[float] = []
    statuses: Counter[str] = Counter()

    async def one(raw: bytes, due: float) -> None:
        reader, writer = await idle.get()
        try:
            statuses[str(await _request(reader, writer, raw))] += 1
        except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
            statuses[type(exc).__name__] += 1
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        lat.append(clock() - due)
        idle.put_nowait((reader, writer))

    start = clock() + 0.05
    tasks = []
    for i, raw in enumerate(raws):
        due = start + i / rate
        delay = due - clock()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(raw, due)))
    await asyncio.gather(*tasks)
    wall = clock() - start
    while not idle.empty():
        idle.get_nowait()[1].close()
    lat.sort()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p / 100 * len(lat)))] * 1e3

    return {"requests": len(lat), "rate_asked": rate, "rate_done": len(lat) / wall,
            "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99), "max_ms": lat[-1] * 1e3,
            "statuses": dict(statuses)}


def _raw(method: str, path: str, token: str, body: bytes = b"") -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _serve(db: str, env: dict[str, str], port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tuner", "serve", "--port", str(port), "--db", db]
    proc = subprocess.Popen(cmd,
                            env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=REPO)
    from api.client import wait_ready

    if wait_ready(f"http://127.0.0.1:{port}", alive=lambda: proc.poll() is None):
        return proc
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit(f"the API did not become ready: {log.read_text()[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n")[0])
    p.add_argument("--db", help="database URL (default: a fresh SQLite file)")
    p.add_argument("--best-rate", type=float, default=500.0)
    p.add_argument("--jobs-rate", type=float, default=50.0)
    p.add_argument("--duration", type=float, default=20.0, help="seconds per phase (20)")
    p.add_argument("--conns", type=int, default=32, help="keep-alive connections (32)")
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "load.json"))
    a = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tunefarm-load-"))
    db = a.db or f"sqlite:///{work / 'load.db'}"
    prefix = f"tunefarm-load-{uuid.uuid4().hex[:8]}:"
    env = {**os.environ, "TUNEFARM_REDIS_PREFIX": prefix, "TUNEFARM_DATA_DIR": str(work),
           "TUNEFARM_MIN_REPEAT_MS": "2", "TUNEFARM_REPEATS": "3",
           # one token drives the whole load: limits high enough that the checks run, never refuse
           "TUNEFARM_RATE_PER_S": "1000000", "TUNEFARM_RATE_BURST": "1000000",
           "TUNEFARM_MAX_QUEUED_JOBS": "1000000", "TUNEFARM_MAX_QUEUED_TRIALS": "100000000"}
    tune = [sys.executable, "-m", "tuner", "tune", "matmul", "--shape", "64,64,64", "--trials", "4",
            "--db", db]
    subprocess.run(tune, env=env, check=True, capture_output=True, cwd=REPO)
    token = subprocess.run([sys.executable, "-m", "tuner", "token", "create", "--scope", "admin",
                            "--db", db], env=env, check=True, capture_output=True, text=True,
                           cwd=REPO).stdout.strip().splitlines()[-1]
    port = _free_port()
    server = _serve(db, env, port, work / "api.log")
    try:
        q = urllib.parse.urlencode({"workload": json.dumps(SPEC), "target": "host"})
        best = [_raw("GET", f"/v1/best?{q}", token)] * int(a.best_rate * a.duration)
        job = json.dumps({"workload": SPEC, "target": "host", "trials": 8}).encode()
        jobs = [_raw("POST", "/v1/jobs", token, job)] * int(a.jobs_rate * a.duration)
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        asyncio.run(_open_loop(port, best[:50], 50, a.conns))  # warm-up: caches, connections
        results = {"best": asyncio.run(_open_loop(port, best, a.best_rate, a.conns)),
                   "jobs": asyncio.run(_open_loop(port, jobs, a.jobs_rate, a.conns))}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=20)
        _cleanup_redis(prefix)
    results["machine"] = {"cpus": os.cpu_count(), "db": db.split(":")[0]}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=2))
    for name in ("best", "jobs"):
        r = results[name]
        print(f"{name:5s} {r['requests']:6d} req at {r['rate_done']:.0f}/s "
              f"(asked {r['rate_asked']:.0f})"
              f"  p50 {r['p50_ms']:.2f} ms  p90 {r['p90_ms']:.2f}  p99 {r['p99_ms']:.2f}"
              f"  max {r['max_ms']:.1f}  statuses {r['statuses']}")
    return 0


def _cleanup_redis(prefix: str) -> None:
    import redis

    from tuner.core.config import get_settings

    client = redis.Redis.from_url(get_settings().redis_url)
    keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


if __name__ == "__main__":
    raise SystemExit(main())
