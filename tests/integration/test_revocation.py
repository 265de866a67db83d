"""Revocation reaches the control plane within ControlPlane.auth_cache_seconds (5 s): a token
deleted through the hub's API is refused, although the control plane had just accepted (and
cached) it."""

from __future__ import annotations

import time

import pytest

from tests.integration.conftest import USER_SCOPES, api

pytestmark = pytest.mark.integration


def test_a_revoked_token_is_refused_within_5_s(hub):
    made = hub.admin.post("users/alice/tokens", json={"scopes": USER_SCOPES, "note": "revoked by a test"})
    token = made.raise_for_status().json()
    with api(hub, token["token"]) as alice:
        assert alice.get("whoami").status_code == 200  # the control plane caches the hub's answer
        hub.admin.delete(f"users/alice/tokens/{token['id']}").raise_for_status()
        revoked = time.monotonic()
        while (status := alice.get("whoami").status_code) == 200 and time.monotonic() - revoked < 10:
            time.sleep(0.1)
        took = time.monotonic() - revoked
    print(f"a revoked token was refused {took:.1f} s after its revocation")
    assert status == 401
    assert took <= 5.5, f"a revoked token still worked {took:.1f} s after"  # 5 s cache + one request's time
