"""The control plane behind a real JupyterHub: hub tokens, custom scopes, groups as tenants."""

import re

import httpx
import pytest

from tests.integration.conftest import USER_SCOPES, api

pytestmark = pytest.mark.integration


def test_no_token_no_access(hub):
    assert httpx.get(f"{hub.service_url}/api/jobs").status_code == 401
    assert httpx.get(f"{hub.service_url}/api/jobs", headers={"Authorization": "token nope"}).status_code == 401


def test_groups_are_tenants(hub, token):
    assert api(hub, token("alice")).get("whoami").json()["tenant"] == "desk-a"
    assert api(hub, token("bob")).get("whoami").json()["tenant"] == "desk-b"


def test_a_token_without_the_custom_scope_is_refused(hub, token):
    read_only = token("carol", ["custom:cellscale:read", "access:services!service=cellscale"])
    response = api(hub, read_only).post("jobs", json={"spec": {"source": "x = 1", "launcher": "plain"}})
    assert response.status_code == 403 and "custom:cellscale:submit" in response.text
    no_access = token("carol", ["custom:cellscale:read"])
    assert api(hub, no_access).get("jobs").status_code == 401


def test_user_in_no_desk_cannot_submit(hub, token):
    response = api(hub, token("dave")).post("jobs", json={"spec": {"source": "x = 1", "launcher": "plain"}})
    assert response.status_code == 403 and "no tenant group" in response.text


def test_more_gpus_than_any_backend_is_refused_at_submit(hub, token):
    response = api(hub, token("alice")).post("jobs", json={"spec": {"source": "x", "resources": {"gpus_per_node": 64}}})
    assert response.status_code == 422 and "ask for at most --gpus 4" in response.text


def test_browsers_are_sent_to_hub_oauth(hub):
    response = httpx.get(f"{hub.service_url}/login", follow_redirects=False)
    assert response.status_code == 302 and "/hub/api/oauth2/authorize" in response.headers["location"]


def test_browser_oauth_sign_in_yields_a_cookie_session(hub):
    with httpx.Client(base_url=hub.url, timeout=30) as browser:
        page = browser.get("/hub/login").text
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
        login = browser.post("/hub/login", data={"username": "bob", "password": "cellscale-demo", "_xsrf": xsrf})
        assert login.status_code == 302
        me = browser.get(
            "/services/cellscale/login", params={"next": "/services/cellscale/api/whoami"}, follow_redirects=True
        )
        assert me.status_code == 200 and me.json()["user"] == "bob", me.text
        assert browser.get("/services/cellscale/api/jobs").status_code == 200  # the cookie alone signs in
        forged = browser.get("/services/cellscale/oauth_callback", params={"code": "x", "state": "forged"})
        assert forged.status_code == 400


def test_server_token_scopes_reach_the_kernel(hub, kernel):
    k = kernel("alice")
    out = k.execute(
        "import os\nprint(os.environ['CELLSCALE_URL'])\nfrom cellscale.client import Client\n"
        "print(Client.from_env().whoami())"
    )
    assert "user='alice'" in out.text and "tenant='desk-a'" in out.text, out.text
    assert USER_SCOPES  # the kernel's token carries these through Spawner.server_token_scopes


def test_server_extension_relays_as_the_logged_in_user(hub, token, server):
    server("alice")
    url = f"{hub.url}/user/alice/cellscale/api/whoami"
    assert httpx.get(url, timeout=30).status_code in (302, 403)  # never served without auth
    response = httpx.get(url, headers={"Authorization": f"token {token('alice')}"}, timeout=30)
    assert response.status_code == 200 and response.json()["tenant"] == "desk-a"
