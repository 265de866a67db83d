"""HubIdentity's caches: a revoked token or a changed group takes effect within cache_seconds
(ControlPlane.auth_cache_seconds); 0 asks the hub every time. The hub itself is faked here
(tests/integration/test_revocation.py revokes a token on a real one)."""

from __future__ import annotations

import httpx
import pytest
from traitlets import TraitError

from cellscale_hub import auth
from cellscale_hub.app import ControlPlane
from cellscale_hub.auth import HubIdentity, Unauthenticated


class FakeHub:
    api_url = "http://hub.invalid/hub/api"
    api_token = "service-token"

    def __init__(self):
        self.tokens = {"t-alice": "alice"}
        self.groups = {"alice": ["desk-a"]}
        self.token_calls: list[bool] = []
        self.group_calls = 0

    def user_for_token(self, token, use_cache=True, sync=True):
        self.token_calls.append(use_cache)
        name = self.tokens.get(token)
        return {"kind": "user", "name": name, "scopes": ["access:services"]} if name else None

    def get(self, url, headers, timeout):
        self.group_calls += 1
        name = url.rsplit("/", 1)[1]
        return httpx.Response(200, json={"groups": self.groups[name]}, request=httpx.Request("GET", url))


@pytest.fixture
def hub(monkeypatch):
    fake = FakeHub()
    monkeypatch.setattr(auth.httpx, "get", fake.get)
    return fake


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    return now


def test_a_group_change_takes_effect_within_the_cache_period(hub, clock):
    identity = HubIdentity(hub, "cellscale", cache_seconds=5)
    assert identity.principal("t-alice").groups == ("desk-a",)
    hub.groups["alice"] = []  # removed from her desk
    clock[0] += 4.9
    assert identity.principal("t-alice").groups == ("desk-a",)
    clock[0] += 0.2
    assert identity.principal("t-alice").groups == ()
    assert hub.group_calls == 2 and hub.token_calls == [True] * 3


def test_zero_asks_the_hub_every_time(hub, clock):
    identity = HubIdentity(hub, "cellscale", cache_seconds=0)
    identity.principal("t-alice")
    identity.principal("t-alice")
    assert hub.token_calls == [False, False] and hub.group_calls == 2
    del hub.tokens["t-alice"]  # revoked
    with pytest.raises(Unauthenticated):
        identity.principal("t-alice")


def test_the_setting_defaults_to_five_seconds():
    assert ControlPlane().auth_cache_seconds == 5
    assert HubIdentity(FakeHub(), "cellscale").cache_seconds == 5
    with pytest.raises(TraitError):
        ControlPlane(auth_cache_seconds=-1)
