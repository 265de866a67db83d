"""The CSRF attack of issue 18 in a real browser through the real hub: a page on another port of
the hub's host (same site, other origin) signs the visitor in to the control plane silently (an
<img> to its login: the hub skips the OAuth confirmation) and then posts a cancel of a job,
with a no-cors fetch and with an auto-submitting form. Both must be refused and the job left
alone, for a user signed in to the hub and for an admin who has the admin page open."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.integration.conftest import PASSWORD, Hub, api
from tests.integration.test_admin_page import ADMIN_PASSWORD, sign_in_through_hub

pytestmark = pytest.mark.integration

ATTACK = """<!doctype html><title>cute cats</title>
<img src="{service}/login?next=/services/cellscale/api/whoami" alt="">
<form id="f" method="POST" action="{service}/api/jobs/{job}/cancel"></form>
<script>
window.addEventListener("load", async () => {{  // after the <img>'s sign-in round trip
  await fetch("{service}/api/jobs/{job}/cancel", {{method: "POST", mode: "no-cors", credentials: "include"}})
    .catch(() => {{}});
  document.getElementById("f").submit();
}});
</script>
"""


@pytest.fixture(scope="module")
def attacker() -> Iterator[tuple[str, dict[str, str]]]:
    """An HTTP server on another port of 127.0.0.1, serving the pages put in its dict."""
    pages: dict[str, str] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            body = pages.get(self.path, "not found").encode()
            self.send_response(200 if self.path in pages else 404)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pages
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def alices_job(hub, token):
    with api(hub, token("alice")) as alice:
        submitted = alice.post("jobs", json={"spec": {"source": "import time\ntime.sleep(300)", "launcher": "plain"}})
        job = submitted.raise_for_status().json()
        try:
            yield job["id"], alice
        finally:
            alice.post(f"jobs/{job['id']}/cancel")


def visit(page: Page, hub: Hub, attacker, job_id: str) -> list[int]:
    """Open the attack page; the statuses of the cancels it sent (the fetch, then the form)."""
    url, pages = attacker
    pages[f"/{job_id}.html"] = ATTACK.format(service=hub.service_url, job=job_id)
    statuses: list[int] = []
    page.on("response", lambda r: statuses.append(r.status) if r.url.endswith(f"/{job_id}/cancel") else None)
    with page.expect_response(lambda r: r.url.endswith("/cancel") and r.request.resource_type == "document") as form:
        page.goto(f"{url}/{job_id}.html")
    assert form.value.status == 403, form.value.text()
    assert "this request comes from http://127.0.0.1:" in form.value.json()["detail"]
    return statuses


def still_alive(client, job_id: str) -> None:
    job = client.get(f"jobs/{job_id}").raise_for_status().json()
    assert job["phase"] in ("PENDING", "ADMITTED", "STARTING", "RUNNING"), job
    events = client.get(f"jobs/{job_id}/events").raise_for_status().json()
    assert "cancel" not in [e["kind"] for e in events], events


def test_a_signed_in_user_visiting_another_port_keeps_her_job(hub, browser: Browser, attacker, alices_job):
    job_id, alice = alices_job
    context = browser.new_context()
    page = context.new_page()
    try:
        page.goto(f"{hub.url}/hub/login?next=/hub/home")  # signed in to the hub only
        page.get_by_label("Username:", exact=True).fill("alice")
        page.get_by_label("Password:", exact=True).fill(PASSWORD)
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(f"{hub.url}/hub/home")
        assert "cellscale-oauth" not in {c["name"] for c in context.cookies(hub.url)}
        statuses = visit(page, hub, attacker, job_id)
        # the <img> did sign her in to the control plane (the hub asks no confirmation) ...
        assert "cellscale-oauth" in {c["name"] for c in context.cookies(hub.service_url)}
        # ... yet neither the fetch nor the form could cancel: no Origin of ours, no X-CSRF-Token
        assert statuses == [403, 403], statuses
        still_alive(alice, job_id)
    finally:
        context.close()


def test_an_admin_with_the_admin_page_open_cancels_nothing(hub, browser: Browser, attacker, alices_job):
    job_id, alice = alices_job
    context = browser.new_context()
    page = context.new_page()
    try:
        sign_in_through_hub(page, hub, "admin", ADMIN_PASSWORD)
        expect(page.get_by_role("heading", name="cellscale admin")).to_be_visible()
        attack = context.new_page()
        statuses = visit(attack, hub, attacker, job_id)
        assert statuses == [403, 403], statuses
        still_alive(alice, job_id)
    finally:
        context.close()
