"""The JupyterLab side panel in a real browser (Debian's Chromium through Playwright), through
the real hub, alice's real server and kernel, and the control plane's local backend: a
%%cluster cell run from a notebook shows up in the panel live; its log streams there while it
runs; its checkpoint appears when committed; a second job that cannot fit says why it waits;
the job's id is copied, an attach cell is inserted into the notebook, and the job is cancelled
from the panel. Then bob (desk-b, another browser
context) does not see alice's job in his desk's list, and the relay tells him it does not exist.

Screenshots go to $CELLSCALE_ARTIFACTS (default test-artifacts/); docs/panel.png is one of them."""

from __future__ import annotations

import json
import re
import time
from urllib.parse import quote

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect

from tests.integration.conftest import ARTIFACTS, PASSWORD, Hub, api

pytestmark = pytest.mark.integration

NOTEBOOK = "panel-test.ipynb"
CELL = """%%cluster --gpus 1 --launcher plain
import tempfile, time, torch
from cellscale.checkpoint import Checkpointer
ckpt = Checkpointer(tempfile.mkdtemp(prefix="panel-test-"))
for step in range(60):
    print(f"step {step} loss {1 / (step + 1):.3f}", flush=True)
    if step == 1:
        print("skipped batch 7: ValueError: shape mismatch", flush=True)
    if step == 3:
        ckpt.save(step, {"w": torch.zeros(256)}, async_=False)
        print("checkpoint committed at step 3", flush=True)
    time.sleep(0.5)
"""


def _notebook(cell: str) -> dict:
    return {
        "type": "notebook",
        "content": {
            "cells": [{"cell_type": "code", "source": cell, "metadata": {}, "outputs": [], "execution_count": None}],
            "metadata": {
                "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
            },
            "nbformat": 4,
            "nbformat_minor": 5,
        },
    }


def open_lab(context: BrowserContext, hub: Hub, user: str, path: str = "lab?reset") -> Page:
    """Sign in at the hub and land in JupyterLab at `path` (the user's server is running)."""
    page = context.new_page()
    page.goto(f"{hub.url}/hub/login?next={quote(f'/user/{user}/{path}', safe='')}")
    page.get_by_label("Username:", exact=True).fill(user)
    page.get_by_label("Password:", exact=True).fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(rf"/user/{user}/lab"), timeout=90_000)  # the spawn, then the server's OAuth
    expect(page.locator("#jupyterlab-splash")).to_have_count(0, timeout=60_000)
    return page


def open_panel(page: Page):
    """The cellscale tab of the left sidebar (activated on start; clicked if something else is)."""
    tab = page.locator('.jp-SideBar.jp-mod-left li[data-id="cellscale-panel"]')
    expect(tab).to_be_visible()
    panel = page.locator("#cellscale-panel")
    # JupyterLab may still be restoring its layout (opening a file shows the file browser), and
    # clicking the tab of the shown panel would collapse it: click only while it is not shown
    for _ in range(5):
        try:
            expect(panel).to_be_visible(timeout=5_000)
            break
        except AssertionError:
            if tab.get_attribute("aria-selected") != "true":
                tab.click()
    expect(panel).to_be_visible()
    return panel


def _watch_console(page: Page) -> list[str]:
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"{m.text} ({m.location.get('url')})") if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    return errors


def test_panel_follows_a_cell_job_live(hub, token, server, browser: Browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    server("alice")
    alice = {"Authorization": f"token {token('alice')}"}
    with httpx.Client(base_url=f"{hub.url}/user/alice/api/", headers=alice) as lab:
        lab.put(f"contents/{NOTEBOOK}", json=_notebook(CELL)).raise_for_status()
    control_plane = api(hub, token("alice"))

    context = browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme="light")
    context.grant_permissions(["clipboard-read", "clipboard-write"])
    page = open_lab(context, hub, "alice", f"lab/tree/{NOTEBOOK}?reset")
    console = _watch_console(page)
    try:
        panel = open_panel(page)
        # no news prompt: config/labconfig disables JupyterLab's announcements plugin
        page_config = json.loads(page.locator("#jupyter-config-data").text_content())
        assert "@jupyterlab/apputils-extension:announcements" in page_config["disabledExtensions"]
        expect(panel.locator('[data-field="user"]')).to_have_text("alice")
        expect(panel.get_by_role("table", name="Quota of desk-a")).to_be_visible()
        jobs = panel.get_by_role("region", name="Jobs", exact=True)
        expect(jobs.get_by_role("status")).to_have_text("live")
        _widen_sidebar(page)

        # run the cell once its kernel is connected and idle (the status bar says so; the
        # notebook toolbar's indicator reads idle even before a kernel is attached)
        notebook = page.locator(".jp-NotebookPanel")
        kernel_status = page.locator("#jp-main-statusbar").get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Idle"))
        expect(kernel_status).to_be_visible(timeout=60_000)
        notebook.locator(".jp-Cell .cm-content").first.click()
        page.keyboard.press("Shift+Enter")

        # the job appears in the list, live; its detail follows the log while it runs
        row = jobs.locator("button.jp-cellscale-jobrow", has_text="panel-test")
        expect(row).to_have_count(1, timeout=30_000)
        # named by its notebook and cell (no --name): the In [N] the notebook shows, checked once the cell ends
        name = row.locator(".jp-cellscale-jobname")
        expect(name).to_have_text(re.compile(r"^panel-test\.ipynb \[\d+\]$"))
        title = name.text_content()
        busy = page.locator("#jp-main-statusbar").get_by_text(re.compile(r"Python 3 \(ipykernel\) \| Busy"))
        expect(busy).to_be_visible()  # the cell runs while it follows its job
        job_id = row.get_attribute("data-job")
        assert re.fullmatch(r"cs-[0-9a-f]{12}", job_id), job_id
        # a second job that cannot fit beside it (desk-a can get 4 local GPUs at most): it waits
        waiter = control_plane.post(
            "jobs",
            json={
                "spec": {
                    "name": "waiter",
                    "launcher": "plain",
                    "source": "print('never')",
                    "resources": {"gpus_per_node": 4},
                }
            },
        )
        waiter_id = waiter.raise_for_status().json()["id"]
        row.click()
        detail = panel.get_by_role("region", name=f"Job {title}", exact=True)
        log = detail.get_by_role("log", name=f"Log of {title}")
        expect(log).to_have_attribute("aria-live", "off")
        expect(log).to_contain_text("[rank 0] step 2", timeout=60_000)
        expect(busy).to_be_visible()  # still busy with its log streaming into the cell
        expect(detail.locator("[data-phase]").first).to_have_attribute("data-phase", "RUNNING")
        expect(detail.get_by_role("status").filter(has_text=re.compile("^live$"))).to_have_count(1)
        checkpoint = detail.get_by_role("list", name="Checkpoints").locator('li[data-step="3"]')
        expect(checkpoint).to_contain_text(re.compile(r"step 3 · [\d.]+ KiB · (just now|\d+s ago) · attempt 1"))
        expect(log).to_contain_text("[rank 0] step 6")  # still streaming after the checkpoint
        rank = detail.get_by_role("combobox", name="Show the lines of one rank")
        expect(rank.locator("option")).to_have_text(["all ranks", "rank 0"])
        elapsed = jobs.locator(f'button[data-job="{job_id}"] .jp-cellscale-elapsed')
        expect(elapsed).to_have_text(re.compile(r"^(\d+m )?\d+s$"))
        waiting = jobs.locator(f'button[data-job="{waiter_id}"]')
        expect(waiting.locator("[data-phase]")).to_have_attribute("data-phase", "PENDING")
        expect(waiting.locator(".jp-cellscale-elapsed")).to_have_text(re.compile(r"^waiting \d+s$"))
        page.mouse.move(900, 600)  # no hover highlight in the screenshot
        panel.evaluate("el => { el.scrollTop = 0; }")
        panel.screenshot(path=ARTIFACTS / "panel.png")
        page.screenshot(path=ARTIFACTS / "panel-lab.png")

        # one rank's lines; the first error line
        rank.select_option("0")  # the runtime's own lines have no rank: they go
        expect(log.locator(".jp-cellscale-logline").first).to_have_text("[rank 0] step 0 loss 1.000")
        rank.select_option("")
        expect(log.locator(".jp-cellscale-logline").first).to_contain_text("[cellscale]")
        detail.get_by_role("button", name="First error").click()
        error_line = log.locator(".jp-cellscale-logline:focus")
        expect(error_line).to_have_text("[rank 0] skipped batch 7: ValueError: shape mismatch")
        follow = detail.get_by_role("button", name=re.compile("^Follow"))
        expect(follow).to_have_attribute("aria-pressed", "false")  # reading the error: the view stays there
        follow.click()
        expect(follow).to_have_attribute("aria-pressed", "true")

        # why the other one waits, in words
        waiting.click()
        why = panel.get_by_role("region", name="Job waiter", exact=True).get_by_role("note")
        expect(why).to_contain_text("Why it waits")
        expect(why).to_contain_text(
            f"waiting for 4 GPUs at once, 3 free to it: your job {title} holds 1 of the desk's GPUs."
        )
        expect(why).to_contain_text("It is next in its queue.")
        expect(why).to_contain_text("It needs 4 GPUs on local")
        expect(why).to_contain_text("Estimated start:")
        headline, details = control_plane.get(f"jobs/{waiter_id}").json()["pending"]["message"].split(" Details: ")
        paragraphs = why.locator("p")
        expect(paragraphs.first).to_have_text(headline)  # the reason first, its quota details last
        expect(paragraphs.last).to_have_text(f"Details: {details}")
        ahead = why.get_by_role("list", name="Jobs ahead of it")
        expect(ahead).to_have_text(f"{title} ({job_id}, desk-a): 1 GPU, same queue")
        panel.screenshot(path=ARTIFACTS / "panel-pending.png")
        control_plane.post(f"jobs/{waiter_id}/cancel").raise_for_status()
        row.click()
        expect(panel.get_by_role("region", name=f"Job {title}", exact=True)).to_be_visible()

        # copy the id; insert an attach cell into the notebook
        detail.get_by_role("button", name=f"Copy job id {job_id}").click()
        expect(detail.get_by_text(f"Copied {job_id}.")).to_be_visible()
        assert page.evaluate("navigator.clipboard.readText()") == job_id
        detail.get_by_role("button", name="Attach in notebook").click()
        cells = notebook.locator(".jp-Cell .cm-content")
        attach_cell = cells.filter(has_text=re.compile(rf"^%cluster attach {job_id}$"))
        expect(attach_cell).to_have_count(1)

        # cancel, confirmed in a dialog; the panel shows it end and the log complete
        detail.get_by_role("button", name=f"Cancel job {title}").click()
        page.get_by_role("dialog").get_by_role("button", name="Cancel job").click()
        expect(detail.locator("[data-phase]").first).to_have_attribute("data-phase", "CANCELLED", timeout=30_000)
        expect(row.locator("[data-phase]")).to_have_attribute("data-phase", "CANCELLED")
        expect(detail.get_by_role("status").filter(has_text=re.compile("^complete$"))).to_have_count(1, timeout=30_000)
        expect(detail.get_by_role("list", name="Timeline")).to_contain_text("CancelRequested (by alice)")
        attempts = detail.get_by_role("list", name="Attempts")
        expect(attempts.locator("li").first).to_have_text(re.compile(r"^#1 on local · cancelled after \d"))
        expect(detail.get_by_role("button", name=f"Cancel job {title}")).to_be_disabled()
        prompt = notebook.locator(".jp-Cell").first.locator(".jp-InputPrompt")
        expect(prompt).to_have_text(f"[{title.split('[')[1]}:")  # the job's [N] is the cell's In [N]
        detail.get_by_text("Backend script, as run").click()
        expect(detail.get_by_label("Backend script")).to_contain_text("#!")
        page.screenshot(path=ARTIFACTS / "panel-cancelled.png")

        # the desk's view shows it too; the phase filter and the name search narrow the list
        jobs.get_by_role("button", name="Desk").click()
        expect(jobs.get_by_role("button", name="Desk")).to_have_attribute("aria-pressed", "true")
        expect(jobs.locator(f'button[data-job="{job_id}"]')).to_contain_text("alice")
        jobs.get_by_role("combobox", name="Filter jobs by phase").select_option("RUNNING")
        expect(jobs.locator(f'button[data-job="{job_id}"]')).to_have_count(0)
        jobs.get_by_role("combobox", name="Filter jobs by phase").select_option("CANCELLED")
        jobs.get_by_role("searchbox", name="Search jobs by name").fill("panel-te")
        expect(jobs.locator("button.jp-cellscale-jobrow")).to_have_count(1)

        _dark_theme(page, panel)
        assert console == [], console
    except BaseException:
        page.screenshot(path=ARTIFACTS / "panel-failed.png")
        raise
    finally:
        context.close()

    # bob is on desk-b: alice's job is neither in his desk's list nor reachable by id
    server("bob")  # the hub shows "not running" for /user/bob/lab rather than spawning it
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = open_lab(context, hub, "bob")
    try:
        panel = open_panel(page)
        expect(panel.locator('[data-field="desk"]')).to_have_text("desk-b")
        jobs = panel.get_by_role("region", name="Jobs", exact=True)
        jobs.get_by_role("button", name="Desk").click()
        expect(jobs.get_by_role("status")).to_have_text("live")
        expect(jobs.locator(".jp-cellscale-joblist > li").first).to_be_visible()
        expect(jobs.locator(f'button[data-job="{job_id}"]')).to_have_count(0)
        refused = page.request.get(f"{hub.url}/user/bob/cellscale/api/jobs/{job_id}")
        assert refused.status == 404 and job_id in json.loads(refused.text())["detail"]
        page.screenshot(path=ARTIFACTS / "panel-bob.png")
    except BaseException:
        page.screenshot(path=ARTIFACTS / "panel-bob-failed.png")
        raise
    finally:
        context.close()
    print(f"panel test took {time.monotonic() - started:.0f} s")


def _widen_sidebar(page: Page) -> None:
    """Drag the left sidebar's edge so the panel gets room (as a user would)."""
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle").first
    box = handle.bounding_box()
    if box:
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 200)
        page.mouse.down()
        page.mouse.move(box["x"] + 220, box["y"] + 200, steps=5)
        page.mouse.up()


def _dark_theme(page: Page, panel) -> None:
    """Settings > Theme > JupyterLab Dark: the panel follows (it uses JupyterLab's variables only)."""
    page.get_by_role("menuitem", name="Settings").click()
    page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile("^Theme$")).click()
    page.locator(".lm-Menu-itemLabel").filter(has_text=re.compile("^JupyterLab Dark$")).click()
    expect(page.locator("body")).to_have_attribute("data-jp-theme-light", "false")
    background = panel.evaluate("el => getComputedStyle(el).backgroundColor")
    assert background != "rgb(255, 255, 255)", background
    page.screenshot(path=ARTIFACTS / "panel-dark.png")
