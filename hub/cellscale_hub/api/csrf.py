"""Cross-site request forgery: a request signed in by the browser cookie may change something
only if it comes from the control plane's own pages.

Cookies are scoped by host, not by port, and SameSite treats every port of a host (and every
subdomain of a site) as the same site: a page served from another port of the hub's host is
sent the cookie with its form posts. So a cookie-authenticated POST, PUT, PATCH or DELETE must
carry both

- an `Origin` (or, failing that, `Referer`) that is the control plane's own public origin:
  scheme, host and port, as the browser addressed it (the Host header, which JupyterHub's
  proxy passes on unchanged, or X-Forwarded-Host / X-Forwarded-Proto set by proxies in front);
- the header `X-CSRF-Token` with the session's token: an HMAC of the session's hub token,
  which the admin page is served with (a meta tag). Another origin cannot read that page, and
  a form cannot set a header; a script on another origin could only with a CORS preflight,
  which this service never grants.

This is jupyter-server's and JupyterHub's rule (an `_xsrf` token bound to the session, checked
on cookie-authenticated requests only), with the Origin check added. Requests that present a
token in the Authorization header (kernels, the server extension, the CLI) are not affected:
a browser never adds that header on its own.
"""

from __future__ import annotations

import hashlib
import hmac
from urllib.parse import urlsplit

from fastapi import HTTPException, Request

HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_PORTS = {"http": "80", "https": "443"}
USE_A_TOKEN = "scripts should send a JupyterHub token (Authorization: token ...) instead of the cookie"


def csrf_token(session_token: str) -> str:
    """The anti-CSRF token of a session: a one-way function of its (secret, HttpOnly) hub
    token, so it is the same in every control plane process and after a restart."""
    return hmac.new(session_token.encode(), b"cellscale-csrf-v1", hashlib.sha256).hexdigest()


def check(request: Request, session_token: str) -> None:
    """Refuse (403) a state-changing request authenticated by the cookie alone that does not
    come from this control plane's own page."""
    if request.method.upper() in SAFE_METHODS:
        return
    origin = _normalize(request.headers.get("origin") or "")
    if origin is None:
        origin = _normalize(request.headers.get("referer") or "")
    if origin is None:
        raise HTTPException(
            403,
            "refused: a change signed in by the browser cookie must come from this control plane's own page, "
            f"and this request names no Origin; {USE_A_TOKEN}",
        )
    own = own_origins(request)
    if origin not in own:
        raise HTTPException(
            403,
            f"refused: this request comes from {origin}, not from this control plane's pages ({own[0]}); "
            "a page on another site or another port may not act with your sign-in",
        )
    sent = request.headers.get(HEADER, "")
    if not sent:
        raise HTTPException(
            403,
            f"refused: a change signed in by the browser cookie needs the {HEADER} header of its page "
            f"(reload the page); {USE_A_TOKEN}",
        )
    if not hmac.compare_digest(sent.encode(), csrf_token(session_token).encode()):
        raise HTTPException(403, f"refused: the {HEADER} header does not match this sign-in; reload the page")


def own_origins(request: Request) -> list[str]:
    """The origins this request may have been addressed to: its Host header, and the hosts and
    schemes proxies in front reported (X-Forwarded-Host, X-Forwarded-Proto). A browser cannot
    set these on a cross-origin request without a CORS preflight, so they are trusted here."""
    forwarded = [s.strip().lower() for s in request.headers.get("x-forwarded-proto", "").split(",") if s.strip()]
    hosts = [h.strip() for h in request.headers.get("x-forwarded-host", "").split(",") if h.strip()]
    hosts.append(request.headers.get("host", ""))
    found: list[str] = []
    for scheme in dict.fromkeys([*forwarded, request.url.scheme]):  # the client-facing one first
        for host in hosts:
            origin = _normalize(f"{scheme}://{host}") if host else None
            if origin and origin not in found:
                found.append(origin)
    return found or ["(none)"]


def _normalize(url: str) -> str | None:
    """`scheme://host[:port]` in lower case without a default port; None if `url` has none
    (an absent header, or the opaque origin `null`)."""
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS or not host:
        return None
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}" if port is None or str(port) == DEFAULT_PORTS[scheme] else f"{scheme}://{host}:{port}"
