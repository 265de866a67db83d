"""Cross-site request forgery: a change signed in by the browser cookie needs the page's
X-CSRF-Token and an Origin that is the control plane's own; token callers need neither.

The browser here is a TestClient holding the sign-in cookie (TableIdentity maps the cookie's
token to its user, as HubIdentity maps a hub token); its origin is http://testserver."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from cellscale_hub.api.context import OAUTH_COOKIE
from cellscale_hub.api.csrf import csrf_token

OWN = "http://testserver"
QUOTA = "/api/admin/cluster-queues/desk-a/quotas/local"


def browser(plane, user: str) -> TestClient:
    client = TestClient(plane.http.app)
    client.cookies.set(OAUTH_COOKIE, user)
    return client


def page_token(client: TestClient) -> str:
    """What the admin page's script sends: the token in the page's meta tag."""
    page = client.get("/admin")
    assert page.status_code == 200, page.text
    assert "frame-ancestors 'self'" in page.headers["content-security-policy"]
    return re.search(r'<meta name="cellscale-csrf" content="([0-9a-f]{64})">', page.text).group(1)


def test_a_cookie_cancel_needs_the_token_and_our_origin(plane):
    job = plane.submit("alice").json()
    cancel = f"/api/jobs/{job['id']}/cancel"
    alice = browser(plane, "alice")
    assert alice.get(f"/api/jobs/{job['id']}").status_code == 200  # reading needs neither

    bare = alice.post(cancel)  # what a form on another page sends: the cookie, and no Origin we accept
    assert bare.status_code == 403
    assert bare.json()["detail"].startswith("refused: a change signed in by the browser cookie must come from")
    assert "Authorization: token" in bare.json()["detail"]

    no_header = alice.post(cancel, headers={"Origin": OWN})
    assert no_header.status_code == 403
    assert no_header.json()["detail"] == (
        "refused: a change signed in by the browser cookie needs the X-CSRF-Token header of its page "
        "(reload the page); scripts should send a JupyterHub token (Authorization: token ...) instead of the cookie"
    )

    token = csrf_token("alice")
    for origin in ("http://testserver:8001", "https://testserver", "http://evil.example", "null"):
        other = alice.post(cancel, headers={"Origin": origin, "X-CSRF-Token": token})
        assert other.status_code == 403, origin
        if origin != "null":
            assert other.json()["detail"].startswith(f"refused: this request comes from {origin}, not from"), origin
    referer = alice.post(cancel, headers={"Referer": "http://testserver:9999/attack.html", "X-CSRF-Token": token})
    assert referer.status_code == 403 and "http://testserver:9999" in referer.json()["detail"]

    wrong = alice.post(cancel, headers={"Origin": OWN, "X-CSRF-Token": csrf_token("bob")})
    assert wrong.status_code == 403 and "does not match this sign-in" in wrong.json()["detail"]
    assert plane.http.get(f"/api/jobs/{job['id']}", headers=plane.as_("alice")).json()["phase"] == "PENDING"

    ok = alice.post(cancel, headers={"Origin": OWN, "X-CSRF-Token": token})
    assert ok.status_code == 200 and ok.json()["phase"] == "CANCELLED"


def test_the_origin_may_come_from_the_proxy_in_front(plane):
    job = plane.submit("alice").json()
    alice = browser(plane, "alice")
    token = csrf_token("alice")
    behind_tls = {"X-Forwarded-Host": "hub.example", "X-Forwarded-Proto": "https,http", "X-CSRF-Token": token}
    lost = alice.post(f"/api/jobs/{job['id']}/cancel", headers=behind_tls | {"Origin": "https://hub.example:8443"})
    assert lost.status_code == 403 and "(https://hub.example)" in lost.json()["detail"]
    ok = alice.post(f"/api/jobs/{job['id']}/cancel", headers=behind_tls | {"Referer": "https://hub.example:443/x"})
    assert ok.status_code == 200, ok.text


def test_the_admin_page_token_is_what_its_changes_need(plane):
    admin = browser(plane, "admin")
    token = page_token(admin)
    assert token == csrf_token("admin")
    refused = admin.put(QUOTA, json={"nominal": 1}, headers={"Origin": OWN})
    assert refused.status_code == 403 and "X-CSRF-Token" in refused.json()["detail"]
    cross = admin.put(QUOTA, json={"nominal": 1}, headers={"Origin": "http://testserver:9999", "X-CSRF-Token": token})
    assert cross.status_code == 403 and "another port" in cross.json()["detail"]
    view = admin.get("/api/admin/tenancy").json()
    assert view["tenancy"]["cluster_queues"]["desk-a"]["quotas"]["local"]["nominal"] == 2  # nothing changed
    ok = admin.put(QUOTA, json={"nominal": 1}, headers={"Origin": OWN, "X-CSRF-Token": token})
    assert ok.status_code == 200, ok.text
    assert ok.json()["tenancy"]["cluster_queues"]["desk-a"]["quotas"]["local"]["nominal"] == 1


@pytest.mark.parametrize(
    ("user", "method", "path", "body"),
    [
        ("alice", "post", "/api/jobs", {"spec": {"source": "x = 1", "launcher": "plain"}}),
        ("admin", "put", QUOTA, {"nominal": 1}),
    ],
)
def test_token_callers_need_neither(plane, user, method, path, body):
    """Kernels, the server extension and the CLI send their token in the Authorization header:
    no CSRF token, no Origin; the header wins over a cookie of someone else's."""
    client = browser(plane, "bob")
    response = getattr(client, method)(path, json=body, headers=plane.as_(user))
    assert response.status_code in (200, 201), response.text
    if method == "post":
        assert response.json()["owner"] == "alice"
        cancelled = client.post(f"/api/jobs/{response.json()['id']}/cancel", headers=plane.as_("alice"))
        assert cancelled.status_code == 200 and cancelled.json()["phase"] == "CANCELLED"


def test_a_forged_cookie_is_still_unauthenticated(plane):
    stranger = browser(plane, "forged")
    response = stranger.post("/api/jobs/cs-x/cancel", headers={"Origin": OWN, "X-CSRF-Token": csrf_token("forged")})
    assert response.status_code == 401
