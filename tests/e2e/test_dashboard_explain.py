"""The dashboard explains a job (Chromium via Playwright, against a real farm): the records
table's knob columns, parallel coordinates, knob importance, a knob slice and predicted
against measured latency, live while the job runs, then checked value by value against the
API's points; the CSV and JSON downloads; two jobs (a template and `auto`) overlaid on the
compare page, following the running one. At 1280 and 390 px, with screenshots."""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.farm import TARGET, Farm, running_farm
from tests.e2e.ui import Ui

pytestmark = pytest.mark.slow

SPEC = {"op": "matmul", "shape": [64, 64, 64]}
# the view's ECharts option, read through the page's own copy of the library
OPTION = """async (sel) => {
  const e = await import('/ui/static/vendor/echarts.esm.min.js');
  return JSON.parse(JSON.stringify(e.getInstanceByDom(document.querySelector(sel)).getOption(),
    (k, v) => (typeof v === 'function' ? undefined : v)));
}"""


@pytest.fixture
def farm(pg_url: str, private_redis_url: str, tmp_path: Path) -> Iterator[Farm]:
    with running_farm(pg_url, private_redis_url, tmp_path,
                      TUNEFARM_PEAK_GBPS=json.dumps({"e2e": 30.0})) as f:
        yield f


def _points(farm: Farm, job_id: str) -> dict[str, Any]:
    resp = httpx.get(f"{farm.api_url}/v1/jobs/{job_id}/points",
                     headers={"Authorization": f"Bearer {farm.user_token}"}, timeout=30)
    resp.raise_for_status()
    return dict(resp.json())


def _label(v: Any) -> str:
    return "×".join(map(str, v)) if isinstance(v, list) else str(v)


def _sig4(x: float) -> float:
    return float(f"{x:.4g}")


def _check_explained(ui: Ui, pts: dict[str, Any]) -> None:
    """Every view of the page shows the API's points: names, values, counts, importance."""
    names = list(pts["knobs"])
    assert len(names) >= 3, pts["knobs"]
    page = ui.page
    assert page.get_attribute("#explain", "data-knobs") == str(len(names))
    heads = [t.rstrip(" ▾▴") for t in page.eval_on_selector_all(
        "#records th", "els => els.map((e) => e.textContent)")]
    assert heads[-len(names):] == names
    # the records table, row by row: the first column is the record's number
    cells = page.eval_on_selector_all("#records tbody tr", """rows => rows.map((tr) =>
        [...tr.children].map((td) => td.textContent))""")
    for row in cells:
        i = int(row[0]) - 1
        assert row[-len(names):] == [_label(pts["knobs"][n][i]) for n in names], row

    imp = json.loads(page.get_attribute("#knob-importance", "data-knobs") or "[]")
    assert {n for n, _ in imp} == set(names)
    for n, w2 in imp:
        assert w2 == pts["knob_importance"][n]
    option = page.evaluate(OPTION, "#knob-importance")
    assert option["yAxis"][0]["data"] == [n for n, _ in imp]

    ok = [i for i, inv in enumerate(pts["invalidity"]) if inv == "ok"]
    option = page.evaluate(OPTION, "#knob-parallel")
    assert [a["name"] for a in option["parallelAxis"]] == [*names, "latency (µs)"]
    lines = option["series"][0]["data"]
    assert len(lines) == len(ok) == int(page.get_attribute("#knob-parallel", "data-lines") or -1)
    assert sorted((*map(str, ln[:-1]), float(ln[-1])) for ln in lines) == sorted(
        (*(_label(pts["knobs"][n][i]) for n in names), _sig4(pts["latency_s"][i] * 1e6))
        for i in ok)

    top = max(names, key=lambda n: pts["knob_importance"][n] or -1)
    assert page.get_attribute("#knob-slice", "data-knob") == top
    other = next(n for n in names if n != top)
    page.select_option("#slice-knob", other)
    assert page.get_attribute("#knob-slice", "data-knob") == other
    option = page.evaluate(OPTION, "#knob-slice")
    assert sorted(map(tuple, option["series"][0]["data"])) == sorted(
        (_label(pts["knobs"][other][i]), _sig4(pts["latency_s"][i] * 1e6)) for i in ok)
    assert set(option["xAxis"][0]["data"]) == {_label(pts["knobs"][other][i]) for i in ok}

    predicted = [i for i in ok if pts["predicted_s"][i]]
    option = page.evaluate(OPTION, "#pred-vs-measured")
    assert sorted(map(tuple, option["series"][0]["data"])) == sorted(
        (_sig4(pts["predicted_s"][i] * 1e6), _sig4(pts["latency_s"][i] * 1e6))
        for i in predicted)
    assert page.get_attribute("#pred-vs-measured", "data-points") == str(len(predicted))


def _no_sideways(ui: Ui, width: int) -> None:
    assert ui.page.evaluate("document.documentElement.scrollWidth") <= width
    for sel in ("#knob-importance", "#knob-parallel", "#knob-slice", "#pred-vs-measured",
                "#compare-chart"):
        box = ui.page.evaluate("""(sel) => { const el = document.querySelector(sel);
            return el ? el.getBoundingClientRect().right : 0; }""", sel)
        assert box <= width, (sel, box)


def test_the_job_page_explains_its_knobs_live_and_two_jobs_compare(
        farm: Farm, browser: Any, shots: Path) -> None:
    farm.start_tuner()
    farm.start_worker("w1")
    client = farm.client()
    first = client.submit_job({"workload": SPEC, "target": TARGET, "device_key": "e2e",
                               "trials": 20, "batch_size": 4, "space": "default"})
    ui = Ui(browser, farm, 1280)
    ui.sign_in(farm.user_token)
    ui.go(f"#/jobs/{first['id']}")
    ui.page.wait_for_selector("#knob-parallel")
    seen: set[int] = set()
    deadline = time.monotonic() + 240
    while ui.page.get_attribute("#view", "data-final") is None:
        assert time.monotonic() < deadline, f"the job did not end on the page\n{farm.logs()}"
        seen.add(int(ui.page.get_attribute("#knob-parallel", "data-lines") or 0))
        time.sleep(0.2)
    assert seen & set(range(1, 19)), f"the views did not follow the job live: {seen}"
    pts = _points(farm, first["id"])
    assert len(pts["trial_id"]) == 20 and pts["knob_importance"]
    assert any(pts["predicted_s"]), "no record carries the cost model's prediction"
    _check_explained(ui, pts)
    ui.shot(shots / "explain-1280.png")

    # the downloads are the points: CSV (a column per knob) and JSON
    with ui.page.expect_download() as got:
        ui.page.click("#download-csv")
    rows = list(csv.DictReader(Path(got.value.path()).read_text().splitlines()))
    assert [r["trial_id"] for r in rows] == pts["trial_id"]
    for n in pts["knobs"]:
        assert [r[n] for r in rows] == [json.dumps(v) if isinstance(v, list) else str(v)
                                        for v in pts["knobs"][n]]
    with ui.page.expect_download() as got:
        ui.page.click("#download-json")
    assert json.loads(Path(got.value.path()).read_text()) == pts

    # a second job on MetaSchedule's generated space, compared with the first while it runs
    second = client.submit_job({"workload": SPEC, "target": TARGET, "device_key": "e2e",
                                "trials": 12, "batch_size": 4, "space": "auto"})
    ui.go("#/jobs")
    for job in (first, second):
        ui.page.check(f'#jobs-table tr[data-job="{job["id"]}"] input[type=checkbox]')
    ui.page.click("#compare")
    ui.page.wait_for_selector("#view[data-loaded]")
    counts: set[int] = set()
    deadline = time.monotonic() + 240
    while ui.page.get_attribute("#view", "data-final") is None:
        assert time.monotonic() < deadline, f"the second job did not end\n{farm.logs()}"
        series = json.loads(ui.page.get_attribute("#compare-chart", "data-series") or "[]")
        counts.update(s["points"] for s in series if " auto " in s["name"])
        time.sleep(0.2)
    assert len(counts) >= 2, f"the compare page did not follow the running job: {counts}"
    series = json.loads(ui.page.get_attribute("#compare-chart", "data-series") or "[]")
    option = ui.page.evaluate(OPTION, "#compare-chart")
    assert [s["name"] for s in option["series"]] == [s["name"] for s in series]
    for job, s in zip((first, second), series, strict=True):
        final = client.get_job(job["id"])
        assert s["name"].startswith(job["id"][:8]) and final["space"] in s["name"]
        assert s["best_us"] == _sig4(final["best"]["latency_s"] * 1e6)
        data = next(o for o in option["series"] if o["name"] == s["name"])["data"]
        assert data[-1][0] == final["trials_done"] and len(data) == s["points"]
    assert ui.page.locator("#compare-table tbody tr").count() == 2
    ui.shot(shots / "compare-1280.png")

    # a memory-bound job (softmax: 0.6 flop per byte) is read in GB/s against the bandwidth
    soft = client.submit_job({"workload": {"op": "softmax", "shape": [256, 512]},
                              "target": TARGET, "device_key": "e2e", "trials": 4})
    ui.go(f"#/jobs/{soft['id']}")
    ui.page.wait_for_selector("#view[data-final]", timeout=120_000)
    header = ui.text('[data-field="best"]')
    assert "GB/s" in header and "of bandwidth" in header, header
    assert "GB/s" in ui.text("#records thead") and "GFLOPS" not in ui.text("#records thead")
    final = client.get_job(soft["id"])
    shown = float(header.split("·")[1].split()[0])
    assert shown == pytest.approx(final["best"]["gbps"], rel=0.02), (header, final["best"])
    assert ui.errors == [], ui.errors
    ui.close()

    phone = Ui(browser, farm, 390)
    phone.sign_in(farm.user_token)
    phone.go(f"#/jobs/{first['id']}")
    phone.page.wait_for_selector("#view[data-final]")
    _check_explained(phone, pts)
    _no_sideways(phone, 390)
    phone.shot(shots / "explain-390.png")
    phone.go(f"#/compare/{first['id']},{second['id']}")
    phone.page.wait_for_selector("#view[data-final]")
    assert len(json.loads(phone.page.get_attribute("#compare-chart", "data-series") or "[]")) == 2
    _no_sideways(phone, 390)
    phone.shot(shots / "compare-390.png")
    assert phone.errors == [], phone.errors
    phone.close()
