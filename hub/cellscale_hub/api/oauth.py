"""Browser sign-in through JupyterHub OAuth: a browser without a token is sent to the hub,
and the hub's code is exchanged for a token kept in an HttpOnly cookie."""

from __future__ import annotations

import secrets
from urllib.parse import urlencode

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import RedirectResponse

from cellscale_hub.api.context import OAUTH_COOKIE

STATE_COOKIE = "cellscale-oauth-state"


def router(prefix: str) -> APIRouter:
    r = APIRouter(prefix=prefix)

    @r.get("/login", include_in_schema=False)
    def login(request: Request, next: str = "/"):
        hub = request.app.state.ctx.hub_oauth
        if hub is None:
            raise HTTPException(404, "this control plane runs without a hub: use its token")
        state = secrets.token_urlsafe(24)
        url = (
            hub.oauth_authorization_url
            + "?"
            + urlencode(
                {
                    "client_id": hub.oauth_client_id,
                    "redirect_uri": hub.oauth_redirect_uri,
                    "response_type": "code",
                    "state": state,
                }
            )
        )
        response = RedirectResponse(url, status_code=302)
        safe_next = next if next.startswith(prefix + "/") else prefix + "/api/whoami"
        response.set_cookie(
            STATE_COOKIE, f"{state}|{safe_next}", httponly=True, samesite="lax", path=prefix, max_age=600
        )
        return response

    @r.get("/oauth_callback", include_in_schema=False)
    def callback(request: Request, code: str, state: str):
        hub = request.app.state.ctx.hub_oauth
        expected, _, next_url = request.cookies.get(STATE_COOKIE, "").partition("|")
        if hub is None or not expected or not secrets.compare_digest(expected, state):
            raise HTTPException(400, "OAuth state mismatch: start again from the login page")
        token = hub.token_for_code(code, sync=True)
        response = RedirectResponse(next_url, status_code=302)
        response.delete_cookie(STATE_COOKIE, path=prefix)
        # Lax, not Strict: Strict is never sent along a redirect chain that began on another site
        # (a link to the admin page from a wiki), so that sign-in would loop through the hub until
        # the browser gives up; and it would not stop a page on another port of this host (the
        # same site). What stops forged changes is api/csrf.py (docs/security.md).
        response.set_cookie(OAUTH_COOKIE, token, httponly=True, samesite="lax", path=prefix)
        return response

    return r
