"""The admin page in a real browser (Debian's Chromium through Playwright), through the real
hub: OAuth sign-in, the cohort tree, flavors, quotas with usage bars (GPUs, and CPUs and memory
where a quota sets them), the audit log, refused and accepted quota edits (an edit of the GPU
numbers keeps the CPU and memory parts), no console errors, and a 403 for a user who is not a
hub admin. The cost section: a plot of each desk's cost and GPU-hours per day (a line per
desk), the top idle jobs, the fleet's reconciliation, each desk's budget burn, and a budget
edit refused (the API's reason shown) and then saved and audited.

Screenshots go to $CELLSCALE_ARTIFACTS (default test-artifacts/ at the repo root). The quotas
and the budget these tests edit are put back exactly as they were, even when one fails."""

from __future__ import annotations

import os
import re

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect

from cellscale.display import memory_words
from tests.integration.conftest import ARTIFACTS, PASSWORD, Hub, api

pytestmark = pytest.mark.integration

# the hub admin signs in only with the admin password (config/jupyterhub_config.py)
ADMIN_PASSWORD = os.environ.get("CELLSCALE_DEMO_ADMIN_PASSWORD", "cellscale-demo-admin-password-for-local-use")
ADMIN_PATH = "/services/cellscale/admin"
# desk-b's cores and memory on the local flavor, set for this test (and put back after it)
DESK_B_CPU = {"nominal": 8, "borrowing_limit": 4, "lending_limit": None}
DESK_B_MEMORY = {"nominal": 16384, "borrowing_limit": None, "lending_limit": 8192}


def sign_in_through_hub(page: Page, hub: Hub, user: str, password: str) -> None:
    """Open the admin page without a session: the service sends the browser to hub OAuth,
    the hub to its login form; after sign-in the hub sends it back through the callback."""
    page.goto(f"{hub.url}{ADMIN_PATH}")
    expect(page).to_have_url(re.compile(r"/hub/login\?next="))
    page.get_by_label("Username:", exact=True).fill(user)
    page.get_by_label("Password:", exact=True).fill(password)
    page.get_by_role("button", name="Sign in").click()
    authorize = page.get_by_role("button", name="Authorize")  # only if the hub asks to confirm the client
    back = re.compile(re.escape(f"{hub.url}{ADMIN_PATH}") + "$")
    page.wait_for_url(lambda url: bool(back.search(url)) or "/hub/api/oauth2/authorize" in url, wait_until="commit")
    if "/hub/api/oauth2/authorize" in page.url:
        authorize.click()
    expect(page).to_have_url(back)


@pytest.fixture
def admin_api(hub, token):
    with api(hub, token("admin")) as client:
        yield client


@pytest.fixture
def quotas_restored(admin_api):
    """Every cluster queue's quotas as they were before the test (other tests rely on the
    seeded ones, config/tenants.yaml), restored afterwards whatever happened."""

    def quotas() -> dict[tuple[str, str], dict]:
        queues = admin_api.get("admin/tenancy").raise_for_status().json()["tenancy"]["cluster_queues"]
        return {(cq, flavor): q for cq, spec in queues.items() for flavor, q in spec["quotas"].items()}

    before = quotas()
    yield before
    now = quotas()
    changed = [(key, q) for key, q in before.items() if now[key] != q]
    # lower nominal quotas first: the flavors' capacity check applies to every intermediate state
    changed.sort(key=lambda item: item[1]["nominal"] - now[item[0]]["nominal"])
    for (cq, flavor), q in changed:
        admin_api.put(f"admin/cluster-queues/{cq}/quotas/{flavor}", json=q).raise_for_status()
    assert quotas() == before


def test_admin_page_in_a_browser(hub, browser: Browser, admin_api, quotas_restored):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "admin-page-failed.png").unlink(missing_ok=True)
    assert quotas_restored[("desk-a", "local")] == {"nominal": 2, "borrowing_limit": None, "lending_limit": None}
    assert quotas_restored[("desk-b", "local")]["nominal"] == 2
    desk_b = {**quotas_restored[("desk-b", "local")], "cpu": DESK_B_CPU, "memory": DESK_B_MEMORY}
    admin_api.put("admin/cluster-queues/desk-b/quotas/local", json=desk_b).raise_for_status()

    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(30_000)
    console: list[ConsoleMessage] = []
    errors: list[str] = []
    page.on("console", lambda m: console.append(m) if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    try:
        sign_in_through_hub(page, hub, "admin", ADMIN_PASSWORD)
        _check_page(page, admin_api)
        refused = _refused_edits(page, admin_api)
        page.screenshot(path=ARTIFACTS / "admin-page-refused.png", full_page=True)
        _accepted_edits(page, admin_api)
        page.screenshot(path=ARTIFACTS / "admin-page.png", full_page=True)
        page.emulate_media(color_scheme="dark")
        page.screenshot(path=ARTIFACTS / "admin-page-dark.png", full_page=True)
        # nothing (a long audit value, the whole seeded document) widens the page past the window
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        # Chromium logs every non-2xx fetch; the refused PUTs above are the only ones expected
        errors += [
            f"{m.text} ({m.location.get('url')})"
            for m in console
            if not (
                m.text.startswith("Failed to load resource") and "422" in m.text and m.location.get("url") in refused
            )
        ]
        assert errors == [], errors
    except BaseException:
        page.screenshot(path=ARTIFACTS / "admin-page-failed.png", full_page=True)
        raise
    finally:
        context.close()


def _row(page: Page, queue: str, flavor: str, resource: str = "gpu"):
    return page.get_by_role("table", name="Quotas and usage").locator(
        f'tr[data-queue="{queue}"][data-flavor="{flavor}"][data-resource="{resource}"]'
    )


def _flavor_cells(f: dict) -> list[str]:
    """A row of the Flavors table, as the page should write it from the API's view."""
    configured = bool(f["capacity_gpus"] or f["capacity_cpus"])
    totals = [f"{f['nominal_total']} GPUs"]
    if f["cpu_nominal_total"] is not None:
        totals.append(f"{f['cpu_nominal_total']} CPUs")
    if f["memory_mb_nominal_total"] is not None:
        totals.append(memory_words(f["memory_mb_nominal_total"]))
    counted = [
        "" if not configured else "not counted" if n is None else show(n)
        for n, show in ((f["capacity_cpus"], str), (f["capacity_memory_mb"], memory_words))
    ]
    return [
        f["flavor"] + (" CPU pool" if f["cpu_only"] else ""),
        f["backend"],
        str(f["capacity_gpus"]) if configured else "backend not configured",
        *counted,
        " · ".join(totals),
        f"{f['gpu_hours']:.2f}",
    ]


def _check_page(page: Page, admin_api) -> None:
    view = admin_api.get("admin/tenancy").raise_for_status().json()
    expect(page.get_by_role("heading", name="cellscale admin")).to_be_visible()
    expect(page.get_by_text(re.compile(r"fair-share half-life .* s · preemption grace .* s"))).to_be_visible()

    # the cohort tree: firm > trading > the two desks' cluster queues, with their tenants
    trading = page.locator('[data-node="cohort:firm"] [data-node="cohort:trading"]')
    for desk in ("desk-a", "desk-b"):
        queue = trading.locator(f'[data-node="cq:{desk}"]')
        expect(queue).to_contain_text(f"cluster queue {desk}")
        expect(queue).to_contain_text(f"tenants: {desk}/default")
        expect(queue.get_by_label(f"weight of {desk}", exact=True)).to_have_value("1")
    expect(page.get_by_text("cohort firm", exact=True)).to_be_visible()
    # the tree's short-work share: set on its root cohort, with what it lends on each flavor
    rows = [r for r in view["short_work"] if r["cohort"] == "firm"]
    share = page.locator('[data-short-work="firm"]')
    expect(share.get_by_label("short-work share of firm", exact=True)).to_have_value(str(rows[0]["share"]))
    for r in rows:
        expect(share).to_contain_text(f"{r['flavor']}: lends {r['lent']} of {r['gpus']} GPUs")

    # flavors: what the API says, row by row
    flavors = page.get_by_role("table", name="Flavors").locator("tbody tr")
    expect(flavors).to_have_count(len(view["flavors"]))
    for row, f in zip(flavors.all(), view["flavors"], strict=True):
        expect(row.locator("td")).to_have_text(_flavor_cells(f))
    local = next(f for f in view["flavors"] if f["flavor"] == "local")
    assert (local["capacity_gpus"], local["nominal_total"]) == (4, 4)
    assert (local["cpu_nominal_total"], local["memory_mb_nominal_total"]) == (8, 16384)

    # quotas: inputs with the numbers in force, and a usage bar described for screen readers
    for usage in view["usage"]:
        for f in usage["flavors"]:
            row = _row(page, usage["cluster_queue"], f["flavor"])
            name = f"{usage['cluster_queue']} {f['flavor']}"
            expect(row.get_by_label(f"nominal {name}", exact=True)).to_have_value(str(f["nominal"]))
            expect(row.get_by_label(f"borrowing limit {name}", exact=True)).to_have_value(
                "" if f["borrowing_limit"] is None else str(f["borrowing_limit"])
            )
            expect(row.get_by_role("img")).to_have_attribute(
                "aria-label", f"{f['used']} used of {f['nominal']} nominal, {f['borrowed']} borrowed"
            )
            expect(row.locator(".used")).to_have_text(f"{f['used']} / {f['nominal']}")
            _check_cpu_and_memory(page, usage["cluster_queue"], f)
    # a queue's GPU-hours once beside all of its rows, not repeated on each flavor's
    queue_hours = page.get_by_role("table", name="Quotas and usage").locator('td[data-field="gpu-hours"]')
    expect(queue_hours).to_have_text([f"{usage['gpu_hours']:.2f}" for usage in view["usage"]])
    expect(page.get_by_role("table", name="Audit log")).to_be_visible()
    expect(page.get_by_role("alert")).to_be_hidden()


def _check_cpu_and_memory(page: Page, queue: str, f: dict) -> None:
    """A CPU and a memory row where the quota sets them (desk-b on local, set by this test; the
    Slurm flavors' cores and memory in config/tenants.yaml), none elsewhere."""
    name = f"{queue} {f['flavor']}"
    cpu, memory = _row(page, queue, f["flavor"], "cpu"), _row(page, queue, f["flavor"], "memory")
    if (queue, f["flavor"]) != ("desk-b", "local"):
        expect(cpu).to_have_count(0 if f["cpu_nominal"] is None else 1)
        expect(memory).to_have_count(0 if f["memory_mb_nominal"] is None else 1)
        if f["cpu_nominal"] is not None:
            expect(cpu.get_by_label(f"cpu nominal {name}", exact=True)).to_have_value(str(f["cpu_nominal"]))
        return
    assert (f["cpu_nominal"], f["memory_mb_nominal"]) == (8, 16384)
    expect(cpu.get_by_label(f"cpu nominal {name}", exact=True)).to_have_value("8")
    expect(cpu.get_by_label(f"cpu borrowing limit {name}", exact=True)).to_have_value("4")
    expect(cpu.locator(".used")).to_have_text(f"{f['cpus_used']} / 8")
    expect(cpu.get_by_role("img")).to_have_attribute(
        "aria-label", f"{f['cpus_used']} used of 8 nominal, {max(0, f['cpus_used'] - 8)} borrowed"
    )
    expect(memory.get_by_label(f"memory nominal {name}", exact=True)).to_have_value("16G")
    expect(memory.get_by_label(f"memory lending limit {name}", exact=True)).to_have_value("8G")
    expect(memory.locator(".used")).to_have_text(f"{memory_words(f['memory_mb_used'])} / 16 GiB")


def _audit(admin_api) -> list[dict]:
    return admin_api.get("admin/audit").raise_for_status().json()


def _refused_edits(page: Page, admin_api) -> set[str]:
    """Invalid quotas are refused with an explanation in an alert, and nothing is stored."""
    audit = _audit(admin_api)
    audit_rows = page.get_by_role("table", name="Audit log").locator("tbody tr")
    first_row = audit_rows.first.text_content() if audit else None
    row = _row(page, "desk-a", "local")
    save = page.get_by_role("button", name="save desk-a local quota")
    refused = set()
    for fields, words in (
        ({"lending limit": "3"}, "lending_limit 3 exceeds nominal 2"),
        ({"lending limit": "", "nominal": "5"}, "would sum to 7 GPUs, more than its backend local has (4)"),
    ):
        for field, value in fields.items():
            row.get_by_label(f"{field} desk-a local", exact=True).fill(value)
        with page.expect_response(lambda r: r.request.method == "PUT") as put:
            save.click()
        assert put.value.status == 422
        refused.add(put.value.url)
        alert = page.get_by_role("alert")
        expect(alert).to_be_visible()
        expect(alert).to_contain_text("not saved (desk-a local quota)")
        expect(alert).to_contain_text(words)
        expect(page.get_by_role("status")).to_be_hidden()
    assert _audit(admin_api) == audit
    expect(audit_rows).to_have_count(len(audit))
    if first_row is not None:
        expect(audit_rows.first).to_have_text(first_row)
    return refused


def _accepted_edits(page: Page, admin_api) -> None:
    """Lower desk-b's local nominal to 1, which frees a GPU for desk-a: nominal 3, borrowing 1."""
    notice, alert = page.get_by_role("status"), page.get_by_role("alert")
    _row(page, "desk-b", "local").get_by_label("nominal desk-b local", exact=True).fill("1")
    page.get_by_role("button", name="save desk-b local quota").click()
    expect(notice).to_have_text("saved: desk-b local quota")
    expect(alert).to_be_hidden()
    expect(_row(page, "desk-b", "local").get_by_label("nominal desk-b local", exact=True)).to_have_value("1")
    # the page sent the whole quota: desk-b's cores and memory are still there
    desk_b = admin_api.get("admin/tenancy").raise_for_status().json()["tenancy"]["cluster_queues"]["desk-b"]
    assert desk_b["quotas"]["local"] == {"nominal": 1, "borrowing_limit": None, "lending_limit": None} | {
        "cpu": DESK_B_CPU,
        "memory": DESK_B_MEMORY,
    }

    row = _row(page, "desk-a", "local")
    expect(row.get_by_label("nominal desk-a local", exact=True)).to_have_value("2")  # the refused edits are gone
    row.get_by_label("nominal desk-a local", exact=True).fill("3")
    row.get_by_label("borrowing limit desk-a local", exact=True).fill("1")
    page.get_by_role("button", name="save desk-a local quota").click()
    expect(notice).to_have_text("saved: desk-a local quota")
    expect(alert).to_be_hidden()

    latest = _audit(admin_api)[0]
    assert (latest["actor"], latest["action"], latest["target"]) == (
        "admin",
        "set-quota",
        "cluster_queues/desk-a/quotas/local",
    )
    assert latest["after"] == {"nominal": 3, "borrowing_limit": 1, "lending_limit": None}

    page.reload()  # what the page shows now is what is stored
    row = _row(page, "desk-a", "local")
    expect(row.get_by_label("nominal desk-a local", exact=True)).to_have_value("3")
    expect(row.get_by_label("borrowing limit desk-a local", exact=True)).to_have_value("1")
    expect(row.get_by_label("lending limit desk-a local", exact=True)).to_have_value("")
    expect(row.get_by_role("img")).to_have_attribute("aria-label", re.compile(r"^\d+ used of 3 nominal, \d+ borrowed$"))
    local = page.get_by_role("table", name="Flavors").locator("tbody tr").filter(has_text=re.compile("^local"))
    expect(local.locator("td").nth(5)).to_have_text("4 GPUs · 8 CPUs · 16 GiB")

    first = page.get_by_role("table", name="Audit log").locator("tbody tr").first.locator("td")
    expect(first.nth(1)).to_have_text("admin")
    expect(first.nth(2)).to_have_text("set-quota cluster_queues/desk-a/quotas/local")
    expect(first.nth(3)).to_have_text('{"nominal":2,"borrowing_limit":null,"lending_limit":null}')
    expect(first.nth(4)).to_have_text('{"nominal":3,"borrowing_limit":1,"lending_limit":null}')
    second = page.get_by_role("table", name="Audit log").locator("tbody tr").nth(1).locator("td")
    expect(second.nth(2)).to_have_text("set-quota cluster_queues/desk-b/quotas/local")


@pytest.fixture
def desk_a_cloud_restored(admin_api):
    """desk-a's cloud policy (burst and budget) as it was before the test, restored afterwards."""

    def cloud() -> dict:
        tenant = admin_api.get("admin/tenancy").raise_for_status().json()["tenancy"]["tenants"]["desk-a"]
        return {"burst": tenant.get("burst", "never"), "budget": tenant.get("budget")}

    before = cloud()
    yield before
    if cloud() != before:
        admin_api.put("admin/tenants/desk-a/cloud", json=before).raise_for_status()
    assert cloud() == before


def test_cost_section_plots_desks_and_edits_a_budget(hub, browser: Browser, admin_api, desk_a_cloud_restored):
    tenants = sorted(admin_api.get("admin/tenancy").raise_for_status().json()["tenancy"]["tenants"])
    series = admin_api.get("cost/series", params={"days": 30, "step_s": 86400}).raise_for_status().json()
    # every desk with a quota has a line, spent or not
    assert sorted({p["tenant"] for p in series["points"]}) == tenants
    cost = admin_api.get("cost", params={"days": 30}).raise_for_status().json()

    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(30_000)
    errors: list[str] = []
    refused: set[str] = set()
    page.on("console", lambda m: errors.append(f"{m.text} ({m.location.get('url')})") if m.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(f"uncaught: {exc}"))
    try:
        sign_in_through_hub(page, hub, "admin", ADMIN_PASSWORD)
        expect(page.get_by_role("heading", name="Cost (last 30 days)")).to_be_visible()
        for plot in ("#cost-plot", "#hours-plot"):
            expect(page.locator(f"{plot} svg")).to_have_count(1)
            lines = page.locator(f"{plot} svg polyline")
            expect(lines).to_have_count(len(tenants))
            assert [line.get_attribute("data-tenant") for line in lines.all()] == tenants
            expect(page.locator(f"{plot} .legend span")).to_have_text(tenants)
        expect(page.locator("#fleet")).to_have_text(
            re.compile(r"^fleet \$[\d,.]+ = desks \$[\d,.]+ \+ shared idle -?\$[\d,.]+ \+ overhead -?\$[\d,.]+ · ")
        )
        idle = page.get_by_role("table", name="Top idle jobs (last 30 days)").locator("tbody tr")
        expect(idle).to_have_count(max(1, len(cost["top_idle_jobs"])))

        budgets = page.get_by_role("table", name="Budgets").locator("tbody tr")
        expect(budgets).to_have_count(len(tenants))
        row = page.locator('#budgets tr[data-tenant="desk-a"]')
        save = page.get_by_role("button", name="save budget of desk-a")

        # refused: the API's reason is shown, nothing is stored
        audit = _audit(admin_api)
        row.get_by_label("budget dollars desk-a", exact=True).fill("-5")
        with page.expect_response(lambda r: r.request.method == "PUT") as put:
            save.click()
        assert put.value.status == 422
        refused.add(put.value.url)
        expect(page.get_by_role("alert")).to_contain_text("not saved (budget of desk-a)")
        expect(page.get_by_role("alert")).to_contain_text("budget.usd: Input should be greater than or equal to 0")
        assert _audit(admin_api) == audit

        # saved: the page sends the budget with the desk's burst setting as it was; audited
        row.get_by_label("budget dollars desk-a", exact=True).fill("250")
        row.get_by_label("budget GPU-hours desk-a", exact=True).fill("")
        row.get_by_label("budget period desk-a", exact=True).select_option("day")
        row.get_by_label("budget warn at desk-a", exact=True).fill("0.5, 0.9")
        row.get_by_label("budget hard stop desk-a", exact=True).check()
        save.click()
        expect(page.get_by_role("status")).to_have_text("saved: budget of desk-a")
        expect(page.get_by_role("alert")).to_be_hidden()
        latest = _audit(admin_api)[0]
        assert (latest["actor"], latest["action"], latest["target"]) == ("admin", "set-cloud", "tenants/desk-a/cloud")
        budget = {"usd": 250.0, "period": "day", "warn_at": [0.5, 0.9], "hard_stop": True}
        assert latest["after"] == {"burst": desk_a_cloud_restored["burst"], "budget": budget}
        first = page.get_by_role("table", name="Audit log").locator("tbody tr").first.locator("td")
        expect(first.nth(2)).to_have_text("set-cloud tenants/desk-a/cloud")
        # the burn against the new budget, and the editor showing what is stored
        expect(row.locator(".burn")).to_have_text(re.compile(r"^\$[\d,.]+ / \$250 per day · \d+%$"))
        burn = re.compile(r"^desk-a has spent \d+% of its budget$")
        expect(row.get_by_role("img")).to_have_attribute("aria-label", burn)
        expect(row.get_by_label("budget period desk-a", exact=True)).to_have_value("day")
        expect(row.get_by_label("budget hard stop desk-a", exact=True)).to_be_checked()
        page.screenshot(path=ARTIFACTS / "admin-page-cost.png", full_page=True)
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280
        # Chromium logs every non-2xx fetch; the refused PUT is the only one expected
        expected = [e for e in errors if e.startswith("Failed to load resource") and "422" in e and refused]
        assert len(expected) <= 1 and all(any(u in e for u in refused) for e in expected), errors
        errors = [e for e in errors if e not in expected]
        assert errors == [], errors
    except BaseException:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=ARTIFACTS / "admin-page-cost-failed.png", full_page=True)
        raise
    finally:
        context.close()


def test_a_user_who_is_not_a_hub_admin_gets_403(hub, browser: Browser):
    context = browser.new_context()
    page = context.new_page()
    try:
        with page.expect_response(lambda r: r.url == f"{hub.url}{ADMIN_PATH}" and r.status != 302) as final:
            sign_in_through_hub(page, hub, "alice", PASSWORD)
        assert final.value.status == 403
        expect(page.get_by_role("heading", name="403")).to_be_visible()
        expect(page.get_by_text("for hub admins")).to_be_visible()
        # the session cookie works for the API too, and the API refuses her as well
        assert page.request.get(f"{hub.url}/services/cellscale/api/admin/tenancy").status == 403
    finally:
        context.close()
