"""Who is calling, and what they may do.

Callers present a JupyterHub API token (header `Authorization: token ...` or `Bearer`),
or, in a browser, the cookie set by the OAuth flow. The hub tells us the token's user and
scopes; the user's groups decide their tenants. In a personal control plane (no hub), one
static token stands for the local user.
"""

from __future__ import annotations

import hmac
import threading
import time
from dataclasses import dataclass, field

import httpx
from jupyterhub.services.auth import HubOAuth

SCOPE_SUBMIT = "custom:cellscale:submit"
SCOPE_READ = "custom:cellscale:read"
SCOPE_ADMIN = "custom:cellscale:admin"
ALL_SCOPES = frozenset({SCOPE_SUBMIT, SCOPE_READ, SCOPE_ADMIN})


@dataclass(frozen=True)
class Principal:
    user: str
    groups: tuple[str, ...]
    scopes: frozenset[str]
    admin: bool = False
    tenants: tuple[str, ...] = field(default=())

    @property
    def tenant(self) -> str | None:
        return self.tenants[0] if self.tenants else None

    def can(self, scope: str) -> bool:
        return self.admin or scope in self.scopes


class Unauthenticated(Exception):
    pass


class Identity:
    """Turns a presented token into a Principal (tenants still unresolved)."""

    blocks = True
    """Whether `principal` may wait (on the hub): the API then calls it off the event loop."""

    def principal(self, token: str) -> Principal:
        raise NotImplementedError


class StaticTokenIdentity(Identity):
    """A personal control plane: one token, one user who is also its admin."""

    blocks = False

    def __init__(self, token: str, user: str, groups: tuple[str, ...]):
        self._token, self._user, self._groups = token, user, groups

    def principal(self, token: str) -> Principal:
        if not token or not hmac.compare_digest(token, self._token):
            raise Unauthenticated("invalid token")
        return Principal(user=self._user, groups=self._groups, scopes=ALL_SCOPES, admin=True)


class HubIdentity(Identity):
    """Tokens checked against JupyterHub; groups looked up with the service's own token.

    Both answers are reused for `cache_seconds` (ControlPlane.auth_cache_seconds, 5 s): a token
    revoked on the hub, or a user removed from a group, loses access at most that long after.
    The token's own cache is HubOAuth's (`cache_max_age`, set to the same period); 0 asks the
    hub on every request. The cost is one hub API call per active token and one per active user
    per period (measured in docs/security.md)."""

    def __init__(self, hub_auth: HubOAuth, service_name: str, cache_seconds: float = 5):
        self.hub_auth = hub_auth
        self.service_name = service_name
        self.cache_seconds = cache_seconds
        self._groups: dict[str, tuple[float, tuple[str, ...], bool]] = {}
        # HubAuth sets up its background event loop lazily on the first sync call, and
        # concurrent first calls race on it ("This event loop is already running"): the
        # panel's first load makes several at once. Token lookups are cached, so
        # serialising them costs little.
        self._lock = threading.Lock()

    def principal(self, token: str) -> Principal:
        with self._lock:
            model = self.hub_auth.user_for_token(token, use_cache=self.cache_seconds > 0, sync=True) if token else None
        if not model or model.get("kind", "user") != "user":
            raise Unauthenticated("invalid or expired JupyterHub token")
        scopes = frozenset(model.get("scopes", []))
        if not self._may_access(scopes):
            raise Unauthenticated(f"token lacks access:services!service={self.service_name}")
        groups, admin = self._user_groups(model["name"])
        return Principal(user=model["name"], groups=groups, scopes=scopes & ALL_SCOPES, admin=admin)

    def _may_access(self, scopes: frozenset[str]) -> bool:
        return bool({"access:services", f"access:services!service={self.service_name}"} & scopes)

    def _user_groups(self, name: str) -> tuple[tuple[str, ...], bool]:
        cached = self._groups.get(name)
        if cached and time.monotonic() - cached[0] < self.cache_seconds:
            return cached[1], cached[2]
        response = httpx.get(
            f"{self.hub_auth.api_url.rstrip('/')}/users/{name}",
            headers={"Authorization": f"token {self.hub_auth.api_token}"},
            timeout=10,
        )
        response.raise_for_status()
        model = response.json()
        groups, admin = tuple(sorted(model.get("groups", []))), bool(model.get("admin"))
        self._groups[name] = (time.monotonic(), groups, admin)
        return groups, admin
