"""The dashboard in a real browser (Debian's Chromium, driven by Playwright) against a real farm:
the API, a tuner and a worker as processes on PostgreSQL and a private Redis. A person signs in,
a job submitted from the CLI is watched to its last trial, a worker's page is opened, a job is
cancelled from its page; no page logs a console error. Screenshots at 1280 and 390 px go to
$TUNEFARM_SCREENSHOTS (default: the test's tmp dir; docs/screenshots come from here)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.farm import TARGET, Farm, running_farm
from tests.e2e.ui import Ui

pytestmark = pytest.mark.slow

@pytest.fixture
def farm(pg_url: str, private_redis_url: str, tmp_path: Path) -> Iterator[Farm]:
    with running_farm(pg_url, private_redis_url, tmp_path,
                      TUNEFARM_PEAK_GFLOPS=json.dumps({"e2e": 200.0})) as f:
        yield f


def _cli_submit(farm: Farm, trials: int) -> tuple[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "tuner", "submit", "matmul", "--shape", "64,64,64", "--trials",
         str(trials), "--device-key", "e2e", "--target", json.dumps(TARGET), "--no-follow"],
        env={**farm.env, "TUNEFARM_TOKEN": farm.user_token, "COLUMNS": "200"},
        capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1], out.stderr


def test_a_person_watches_a_cli_job_to_its_last_trial_and_opens_a_worker(
        farm: Farm, browser: Any, shots: Path) -> None:
    farm.start_tuner()
    ui = Ui(browser, farm, 1280)
    ui.sign_in(farm.user_token)
    ui.page.wait_for_selector("main >> text=No jobs match")

    # submitted from the CLI while no worker runs: the page is open before the first trial
    job_id, said = _cli_submit(farm, trials=12)
    assert f"{farm.api_url}/ui#/jobs/{job_id}" in said
    ui.go("#/workers")
    ui.go("#/jobs")
    ui.page.click(f'#jobs-table tr[data-job="{job_id}"] a')
    canvas = ui.page.wait_for_selector("#job-chart canvas[data-points]")
    assert canvas.get_attribute("data-points") == "0"
    farm.start_worker("w1")
    seen: set[int] = set()
    live_best: set[str] = set()  # the header's best while records stream in (not reloaded)
    live_workers: set[str] = set()  # the records table's worker cells, likewise
    deadline = time.monotonic() + 180
    while ui.page.get_attribute("#view", "data-final") is None:
        assert time.monotonic() < deadline, f"the job did not end on the page\n{farm.logs()}"
        n = int(canvas.get_attribute("data-points") or 0)
        seen.add(n)
        if 0 < n < 12:
            live_best.add(ui.page.evaluate(
                "() => document.querySelector('[data-field=\"best\"]').textContent"))
            live_workers.update(ui.page.evaluate(
                "() => [...document.querySelectorAll('#records tbody td:nth-child(8)')]"
                ".map((td) => td.textContent)"))
        time.sleep(0.1)
    assert canvas.get_attribute("data-points") == "12"
    assert seen & set(range(1, 12)), f"no measurement arrived live (counts seen: {seen})"
    assert live_best - {"no valid measurement yet"}, live_best  # the header followed
    assert "w1" in live_workers, live_workers  # live rows name their worker, by its name
    assert ui.text("h1 .badge") == "SUCCEEDED"
    assert "12 / 12" in ui.text('[data-field="progress"]')
    assert "of peak" in ui.text('[data-field="best"]')  # TUNEFARM_PEAK_GFLOPS declares e2e
    assert ui.page.get_attribute(".legend", "data-total") == "12"
    assert ui.page.locator("#records tbody tr").count() == 12
    ui.page.click("#records th >> text=latency")  # sorted by latency, fastest first
    first_row = ui.text("#records tbody tr:first-child td:nth-child(2)")
    best = farm.client().get_job(job_id)["best"]
    assert best["trial_id"].startswith(first_row.strip()), (first_row, best)
    schedule = ui.text("#best-schedule pre")
    assert "sch.get_sblock" in schedule
    ui.page.click("#copy-schedule")
    ui.page.wait_for_selector("#best-schedule >> text=copied")
    assert ui.page.evaluate("navigator.clipboard.readText()") == schedule
    ui.shot(shots / "job-1280.png")

    ui.go("#/jobs")
    ui.page.wait_for_selector(f'#jobs-table tr[data-job="{job_id}"] >> text=SUCCEEDED')
    assert "dtype=float32" in ui.text(f'#jobs-table tr[data-job="{job_id}"]')
    ui.shot(shots / "jobs-1280.png")
    ui.go("#/workers")
    ui.page.click("#workers-table a >> text=w1")
    ui.page.wait_for_selector("#worker-detail")
    detail = ui.text("#worker-detail")
    assert "e2e" in detail and "measurements / min" in detail
    # the worker reports its count with its next heartbeat (1 s here); the page reads it every 3 s
    ui.page.wait_for_function("""() => Number([...document.querySelectorAll('#worker-detail dt')]
        .find((dt) => dt.textContent === 'measured').nextElementSibling.textContent) >= 12""",
                              timeout=20_000)
    ui.shot(shots / "worker-1280.png")
    ui.go("#/best")
    ui.page.wait_for_selector("table.grid >> text=matmul")
    ui.shot(shots / "best-1280.png")

    # a model job: its tasks, their trials, the estimated model latency after each round
    from tests.support.tasks import TASKS

    model = farm.client().submit_model({"name": "tiny", "tasks": TASKS, "target": TARGET,
                                        "device_key": "e2e", "trials": 16, "round_trials": 8})
    ui.go("#/models")
    ui.page.click(f'#models-table a[href="#/models/{model["id"]}"]')
    ui.page.wait_for_selector("h1 .badge >> text=SUCCEEDED", timeout=180_000)
    assert ui.page.locator("#model-tasks tbody tr").count() == len(TASKS)
    assert ui.text('[data-field="estimate"]') not in ("", "–")
    assert int(ui.page.get_attribute("#model-chart canvas", "data-points") or 0) >= 1
    # every task tuned: the "why untuned" column is empty and no warning shows
    assert ui.page.locator('#model-tasks th >> text="why untuned"').count() == 1
    assert ui.page.locator('[data-field="untuned"]').count() == 0
    ui.shot(shots / "model-1280.png")
    # the best schedules name the model's PrimFuncs by their tasks, and fit the page
    ui.go("#/best")
    ui.page.wait_for_selector("#best-table >> text=fused_matmul", timeout=60_000)
    assert ui.page.evaluate("""() => { const w = document.querySelector('#best-table .table-wrap');
        return w.scrollWidth <= w.clientWidth; }"""), "the best table runs off the page"
    ui.shot(shots / "best-model-1280.png")

    # a long job, cancelled from its page
    job = farm.client().submit_job({"workload": {"op": "matmul", "shape": [64, 64, 128]},
                                    "target": TARGET, "device_key": "e2e", "trials": 2000})
    ui.go(f"#/jobs/{job['id']}")
    ui.page.click("#cancel")
    ui.page.wait_for_selector("h1 .badge >> text=CANCELLED", timeout=120_000)
    assert farm.client().get_job(job["id"])["state"] == "CANCELLED"
    assert ui.errors == [], ui.errors
    ui.close()

    phone = Ui(browser, farm, 390)
    phone.sign_in(farm.user_token)
    phone.go(f"#/jobs/{job_id}")
    phone.page.wait_for_selector("#view[data-final]")
    assert phone.page.evaluate("document.documentElement.scrollWidth") <= 390  # no sideways page
    phone.shot(shots / "job-390.png")
    phone.go("#/workers")
    phone.page.wait_for_selector("#workers-table")
    phone.shot(shots / "workers-390.png")
    phone.go("#/best")
    phone.page.wait_for_selector("#best-table table")
    # on a phone the latencies are on screen without scrolling sideways
    right = phone.page.evaluate("""() => Math.max(...[...document.querySelectorAll(
        '#best-table tbody tr')].map((tr) => tr.children[2].getBoundingClientRect().right))""")
    assert right <= 390, right
    phone.shot(shots / "best-390.png")
    assert phone.errors == [], phone.errors
    phone.close()


def test_each_page_keeps_to_the_tokens_scope_and_owner(farm: Farm, browser: Any) -> None:
    from tuner.db import Store
    from tuner.db.tokens import create_token

    store = Store(farm.db_url)
    other = create_token(store, "user", "someone-else")
    store.close()
    theirs = farm.client(other).submit_job({"workload": {"op": "matmul", "shape": [32, 32, 32]},
                                            "target": TARGET, "device_key": "e2e", "trials": 4})

    ui = Ui(browser, farm, 1280)
    ui.page.goto(f"{farm.api_url}/ui")
    ui.page.fill("#token", "tf_not-a-token")
    ui.page.click("form.signin button[type=submit]")
    ui.page.wait_for_selector("text=This token was refused")
    ui.sign_in(farm.worker_token)  # a worker token reads the shared best schedules only
    assert ui.page.is_hidden("#nav a[href='#/jobs']")
    assert ui.page.is_visible("#nav a[href='#/best']")
    ui.go("#/jobs")
    ui.page.wait_for_selector("text=This page needs a user token; yours has scope worker")
    ui.close()

    mine = Ui(browser, farm, 1280)
    mine.sign_in(farm.user_token)
    assert mine.page.locator("#f-owner").count() == 0  # only an admin filters by owner
    # a second tab of the same browser is signed in by the first, with nothing on disk ...
    tab = mine.ctx.new_page()
    tab.goto(f"{farm.api_url}/ui#/jobs")
    tab.wait_for_selector("#signed-in >> text=e2e (user)")
    assert tab.evaluate("Object.keys(localStorage).length") == 0
    # ... another browser profile is not, and signing out in one tab signs out the other
    stranger = Ui(browser, farm, 1280)
    stranger.page.goto(f"{farm.api_url}/ui")
    stranger.page.wait_for_selector("#token")
    stranger.close()
    tab.click("#who button >> text=Sign out")
    mine.page.wait_for_selector("#token")
    tab.close()
    mine.sign_in(farm.user_token)
    mine.go(f"#/jobs/{theirs['id']}")
    mine.page.wait_for_selector(f"text=no job '{theirs['id']}'")  # the API's 404, not the job
    mine.close()

    admin = Ui(browser, farm, 1280)
    admin.sign_in(farm.admin_token)
    admin.page.fill("#f-owner", "someone-else")
    admin.page.click("form.filters button[type=submit]")
    admin.page.wait_for_selector(f'#jobs-table tr[data-job="{theirs["id"]}"]')
    assert admin.page.locator("#jobs-table tbody tr").count() == 1
    admin.close()


def test_a_job_of_ten_thousand_records_renders(farm: Farm, browser: Any, shots: Path) -> None:
    """Not a timed assertion: the time to render is reported (in render-10000.json)."""
    from sqlalchemy import insert, update

    from tests.api.conftest import trivial_trace
    from tuner.db import Store
    from tuner.db import tables as m

    n = 10_000
    spec = {"op": "matmul", "shape": [256, 256, 256]}
    trace = trivial_trace(spec)  # a real one: the page shows the best schedule as Python
    job = farm.client().submit_job({"workload": spec, "target": TARGET, "device_key": "e2e",
                                    "trials": n})
    store = Store(farm.db_url)
    row = store.get_job(job["id"])
    now = m.utcnow()
    rows = [{"trial_id": uuid.uuid4().hex, "job_id": row.id, "workload_id": row.workload_id,
             "target_id": row.target_id, "space": "gemm-x86", "cand_hash": f"{i:032x}",
             "trace_json": trace, "decisions_json": "[]",
             "latencies_json": json.dumps([lat]) if lat else "[]", "median_s": lat,
             "mean_s": lat, "invalidity": "ok" if lat else "run_error", "worker": "w1",
             "build_s": 0.1, "tvm_version": "test", "created_at": now, "measured_at": now}
            for i in range(n) for lat in [None if i % 50 == 7 else 1e-4 * (1 + 1000 / (i + 10))]]
    with store.session() as s:
        s.execute(insert(m.Record), rows)
        s.execute(update(m.Job).where(m.Job.id == row.id).values(
            state="SUCCEEDED", started_at=now, finished_at=now))
    store.close()

    ui = Ui(browser, farm, 1280)
    ui.sign_in(farm.user_token)
    start = time.perf_counter()
    ui.page.goto(f"{farm.api_url}/ui#/jobs/{job['id']}")
    ui.page.reload()  # a cold load of the job page itself
    ui.page.wait_for_selector("#view[data-render-ms]", timeout=60_000)
    wall_ms = (time.perf_counter() - start) * 1000
    in_page_ms = float(ui.page.get_attribute("#view", "data-render-ms") or "nan")
    since_navigation_ms = float(ui.page.evaluate("performance.now()"))
    fetches = ui.page.evaluate("""() => Object.fromEntries(performance.getEntriesByType('resource')
        .filter((e) => e.name.includes('/v1/')).map((e) => [new URL(e.name).pathname.replace(
            /[0-9a-f]{32}/, '{id}'), [Math.round(e.duration), e.encodedBodySize]]))""")
    assert ui.page.get_attribute("#job-chart canvas", "data-points") == str(n)
    assert "500 of 10000 shown" in ui.text("#records")
    assert ui.page.locator("#records tbody tr").count() == 500
    report = {"records": n, "render_ms": in_page_ms, "since_navigation_ms": since_navigation_ms,
              "wall_ms_with_two_loads": wall_ms, "requests_ms_bytes": fetches}
    (shots / "render-10000.json").write_text(json.dumps(report, indent=2))
    print("job page with 10,000 records:", report)
    assert ui.errors == [], ui.errors
    ui.close()


def test_a_job_on_an_emulated_board_says_its_latencies_are_emulations(farm: Farm,
                                                                      browser: Any) -> None:
    """A job of the emulated aarch64 board's device key (TUNEFARM_EMULATED_KEYS): its page says
    that the latencies say nothing about a real board (no worker needed: the job waits)."""
    aarch64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}
    job = farm.client().submit_job({"workload": {"op": "dense", "shape": [64, 256, 128]},
                                    "target": aarch64, "device_key": "qemu-aarch64",
                                    "trials": 4})
    assert job["emulated"] is True
    ui = Ui(browser, farm, 1280)
    ui.sign_in(farm.user_token)
    ui.page.goto(f"{farm.api_url}/ui#/jobs/{job['id']}")
    ui.page.wait_for_selector("#emulated", timeout=30_000)
    assert "say nothing about a real board" in ui.text("#emulated")
    assert ui.errors == [], ui.errors
    ui.close()
