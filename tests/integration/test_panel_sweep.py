"""A sweep in a real browser (Debian's Chromium through Playwright), through the real hub,
alice's real server and kernel, and the control plane's local backend (task pools): a
notebook cell defines a grid of 250 points, the next runs `%%cluster map` over it; the
notebook's progress widget counts them to 250/250, and the side panel shows the sweep as ONE
row with its bar and count, its detail the progress line and, on demand, its points (200 a
page, then the rest). A second, small sweep with a failing point (submitted through the API)
shows its failure in another colour, the failed point first, and its traceback on demand.
A job a Dagster run submitted (through the Client, with its origin) says its asset and
partition in its row, and its detail where it comes from, the run a link to Dagster.

Screenshots go to $CELLSCALE_ARTIFACTS (default test-artifacts/)."""

from __future__ import annotations

import re
import time

import httpx
import pytest
from playwright.sync_api import Browser, expect

from cellscale.client import Client
from cellscale.points import manifest
from cellscale.spec import JobSpec, Origin
from tests.integration.conftest import ARTIFACTS, Hub, api
from tests.integration.test_panel import _notebook, _watch_console, _widen_sidebar, open_lab, open_panel

pytestmark = pytest.mark.integration

NOTEBOOK = "sweep-panel-test.ipynb"
GRID_CELL = 'grid = [{"x": i} for i in range(250)]'
MAP_CELL = "%%cluster map --over grid --max-parallel 4 --per-task 10 --outputs y\ny = x * 2"
# run once the sweep is over: the bar's own value, as the kernel holds it (`_` is the handle)
BAR_CELL = 'bar = _._widget.children[0]\nprint(f"bar {bar.value} of {bar.max}")'
FAILING = "import time\ntime.sleep(0.5)\nif x == 1:\n    raise ValueError(f'bad point {x}')\ny = x"
RUN_ID = "3f2a9c1e-5b7d-4e0f-9a21-8c6d0b4e7f13"
ORIGIN = Origin(
    tool="dagster",
    run_id=RUN_ID,
    asset="model",
    partitions=["2026-11-30"],
    partition_count=1,
    url=f"https://dagster.example/runs/{RUN_ID}",
)


def _cells(*sources: str) -> dict:
    notebook = _notebook(sources[0])
    notebook["content"]["cells"] = [
        {"cell_type": "code", "source": source, "metadata": {}, "outputs": [], "execution_count": None}
        for source in sources
    ]
    return notebook


def _submit_failing_sweep(control_plane: httpx.Client) -> str:
    grid = [{"x": i} for i in range(3)]
    bundle = control_plane.post("bundles", content=manifest(grid))
    sha = bundle.raise_for_status().json()["sha256"]
    spec = {
        "name": "sweep-fails",
        "launcher": "plain",
        "source": FAILING,
        "outputs": ["y"],
        "resources": {"cpus_per_task": 1},
        "sweep": {"points": len(grid), "points_sha256": sha, "max_parallel": 3},
    }
    return control_plane.post("jobs", json={"spec": spec}).raise_for_status().json()["id"]


def _submit_from_dagster(hub: Hub, token: str) -> str:
    """A small job as cellscale.dagster submits one: through the Client, with its run's origin."""
    client = Client(hub.service_url, token)
    try:
        return client.submit(JobSpec(name="dagster-model", launcher="plain", source="print('model')", origin=ORIGIN)).id
    finally:
        client.close()


def test_a_sweep_is_one_row_with_its_progress_and_its_points_on_demand(
    hub, token, server, browser: Browser, monkeypatch, tmp_path
):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    server("alice")
    alice = {"Authorization": f"token {token('alice')}"}
    with httpx.Client(base_url=f"{hub.url}/user/alice/api/", headers=alice) as lab:
        lab.put(f"contents/{NOTEBOOK}", json=_cells(GRID_CELL, MAP_CELL, BAR_CELL)).raise_for_status()
    control_plane = api(hub, token("alice"))

    context = browser.new_context(viewport={"width": 1500, "height": 1000}, color_scheme="light")
    page = open_lab(context, hub, "alice", f"lab/tree/{NOTEBOOK}?reset")
    console = _watch_console(page)
    try:
        panel = open_panel(page)
        jobs = panel.get_by_role("region", name="Jobs", exact=True)
        expect(jobs.get_by_role("status")).to_have_text("live")
        _widen_sidebar(page)

        # the grid, then the sweep over it, from the notebook (its kernel connected and idle)
        notebook = page.locator(".jp-NotebookPanel")
        kernel_status = page.locator("#jp-main-statusbar").get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle"))
        expect(kernel_status).to_be_visible(timeout=60_000)
        notebook.locator(".jp-Cell .cm-content").first.click()
        page.keyboard.press("Shift+Enter")
        page.keyboard.press("Shift+Enter")

        # the notebook's widget: one bar and one line, counting to 250/250
        widget = notebook.locator(".cellscale-sweep")
        expect(widget).to_have_count(1, timeout=60_000)
        label = widget.locator(".cellscale-sweep-label")
        expect(label).to_contain_text(re.compile(r"^cs-[0-9a-f]{12}: \d+/250 done"))
        job_id = re.match(r"cs-[0-9a-f]{12}", label.text_content()).group(0)

        # ONE row in the panel for its 250 points, live while they run
        row = jobs.locator(f'button[data-job="{job_id}"]')
        expect(row).to_have_count(1, timeout=30_000)
        expect(row.locator(".jp-cellscale-jobname")).to_have_text(re.compile(r"^sweep-panel-test\.ipynb \[\d+\]$"))
        title = row.locator(".jp-cellscale-jobname").text_content()  # named by its notebook and cell
        expect(row.locator(".jp-cellscale-sweeptext")).to_have_text(re.compile(r"^\d+/250$"))

        expect(label).to_contain_text("250/250 done", timeout=240_000)
        expect(label).to_contain_text("succeeded")
        notebook_bar = widget.locator(".cellscale-sweep-bar .progress-bar")
        expect(notebook_bar).to_have_attribute("style", re.compile(r"width: 100%"))
        page.keyboard.press("Shift+Enter")  # the third cell: the bar's value in the kernel
        expect(notebook.locator(".jp-OutputArea-output").filter(has_text="bar 250 of 250")).to_have_count(1)

        expect(row.locator("[data-phase]")).to_have_attribute("data-phase", "SUCCEEDED", timeout=30_000)
        expect(row.locator(".jp-cellscale-sweeptext")).to_have_text("250/250")
        bar = row.locator(".jp-cellscale-sweepbar")
        expect(bar).to_have_attribute("data-done", "250")
        expect(bar).to_have_attribute("data-failed", "0")
        expect(bar.locator(".jp-cellscale-meter-done")).to_have_attribute("style", "width: 100%")
        # not one row per point: the list holds alice's jobs (other tests' too), far fewer than 250
        assert jobs.locator("button.jp-cellscale-jobrow").count() < 250
        expect(jobs.locator("button.jp-cellscale-jobrow", has_text="250/")).to_have_count(1)

        # its detail: the progress line and bar; the points only when asked, a page at a time
        row.click()
        detail = panel.get_by_role("region", name=f"Job {title}", exact=True)
        points = detail.get_by_role("region", name="Points")
        expect(points.locator(".jp-cellscale-sweepline")).to_have_text(
            re.compile(r"^250/250 done · job succeeded · up to 4 tasks at once$")
        )
        progress = points.get_by_role("progressbar", name=f"Points of {title}")
        expect(progress).to_have_attribute("aria-valuenow", "250")
        expect(progress).to_have_attribute("aria-valuemax", "250")
        table = points.get_by_role("table", name=f"Points of {title}")
        expect(table).to_be_hidden()
        show = points.get_by_role("button", name="Show points")
        expect(show).to_have_attribute("aria-expanded", "false")
        show.click()
        rows = table.locator("tbody tr[data-index]")
        expect(rows).to_have_count(200)
        expect(points.get_by_role("status")).to_have_text("200 of 250 points shown")
        first = rows.first.locator("td")
        expect(first.nth(0)).to_have_text("0")
        expect(first.nth(1)).to_have_text("x=0")
        expect(first.nth(2)).to_have_text("done")
        expect(first.nth(3)).to_have_text("1")
        expect(first.nth(4)).not_to_have_text("–")  # the node it ran on
        expect(first.nth(5)).to_have_text(re.compile(r"^\d+(\.\d)?s$"))
        expect(rows.nth(199).locator("td").nth(1)).to_have_text("x=199")
        points.get_by_role("button", name="More points").click()
        expect(rows).to_have_count(250)
        expect(rows.last.locator("td").nth(1)).to_have_text("x=249")
        expect(points.get_by_role("button", name="More points")).to_be_hidden()
        expect(points.get_by_role("status")).to_have_text("250 of 250 points shown")
        page.mouse.move(900, 600)
        detail.evaluate("el => el.scrollIntoView()")
        page.screenshot(path=ARTIFACTS / "panel-sweep.png")
        panel.screenshot(path=ARTIFACTS / "panel-sweep-points.png")
        points.get_by_role("button", name="Hide points").click()
        expect(table).to_be_hidden()

        # a sweep with a failing point: failed in the bar's other colour, first in its points,
        # its traceback on demand
        failing_id = _submit_failing_sweep(control_plane)
        failing = jobs.locator(f'button[data-job="{failing_id}"]')
        expect(failing.locator("[data-phase]")).to_have_attribute("data-phase", "FAILED", timeout=120_000)
        expect(failing.locator(".jp-cellscale-sweeptext")).to_have_text("2/3 · 1 failed")
        expect(failing.locator(".jp-cellscale-sweepbar")).to_have_attribute("data-failed", "1")
        failed_part = failing.locator(".jp-cellscale-meter-failed")
        assert failed_part.evaluate("el => el.getBoundingClientRect().width") > 0
        colours = failing.locator(".jp-cellscale-sweepbar > div").evaluate_all(
            "els => els.map(el => getComputedStyle(el).backgroundColor)"
        )
        assert colours[0] != colours[1], colours
        failing.click()
        detail = panel.get_by_role("region", name="Job sweep-fails", exact=True)
        points = detail.get_by_role("region", name="Points")
        line = points.locator(".jp-cellscale-sweepline")
        expect(line).to_have_text("2/3 done · 1 failed · job failed · up to 3 tasks at once")
        points.get_by_role("button", name="Show points").click()
        table = points.get_by_role("table", name="Points of sweep-fails")
        rows = table.locator("tbody tr[data-index]")
        expect(rows).to_have_count(3)
        expect(rows.first).to_have_attribute("data-status", "failed")
        expect(rows.first.locator("td").first).to_have_text("1")
        expect(rows.nth(1).locator("td").first).to_have_text("0")
        expect(points.get_by_role("status")).to_have_text("3 of 3 points shown; the 1 failed first")
        expect(rows.first.locator("td").last).to_contain_text("ValueError: bad point 1")
        traceback = table.locator('pre[aria-label="Traceback of point 1"]')
        expect(traceback).to_be_hidden()
        expand = rows.first.get_by_role("button", name="Traceback of point 1")
        expect(expand).to_have_attribute("aria-expanded", "false")
        expand.click()
        expect(expand).to_have_attribute("aria-expanded", "true")
        expect(traceback).to_be_visible()
        expect(traceback).to_contain_text("ValueError: bad point 1")
        expect(traceback).to_contain_text("Traceback (most recent call last)")
        page.mouse.move(900, 600)
        panel.screenshot(path=ARTIFACTS / "panel-sweep-failed.png")

        # a job a Dagster run submitted: its asset and partition in its row; in its detail where
        # it comes from, the run a link to Dagster in a new tab
        monkeypatch.setenv("CELLSCALE_HOME", str(tmp_path))  # the Client keeps its result key there
        dagster_id = _submit_from_dagster(hub, token("alice"))
        from_dagster = jobs.locator(f'button[data-job="{dagster_id}"]')
        expect(from_dagster.locator('[data-field="origin"]')).to_have_text(
            "dagster · model · 2026-11-30", timeout=30_000
        )
        from_dagster.click()
        detail = panel.get_by_role("region", name="Job dagster-model", exact=True)
        expect(detail.locator(".jp-cellscale-from dt")).to_have_text("From")
        origin = detail.locator('dd[data-field="origin"]')
        expect(origin).to_have_text("dagster run 3f2a9c1e, asset model, partition 2026-11-30")
        run = origin.get_by_role("link", name="dagster run 3f2a9c1e", exact=True)
        expect(run).to_have_attribute("href", ORIGIN.url)
        expect(run).to_have_attribute("target", "_blank")
        expect(run).to_have_attribute("rel", "noopener noreferrer")
        page.mouse.move(900, 600)
        panel.screenshot(path=ARTIFACTS / "panel-origin.png")
        assert console == [], console
    except BaseException:
        page.screenshot(path=ARTIFACTS / "panel-sweep-failed-test.png")
        raise
    finally:
        context.close()
    print(f"sweep panel test took {time.monotonic() - started:.0f} s")
