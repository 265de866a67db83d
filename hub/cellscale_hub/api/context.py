"""What the handlers share: the store, the drivers, tenancy, identity, the settings they
report, the followed logs, a way to wake the controller and the reasons it publishes. The
API never reaches into the controller."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from starlette.concurrency import run_in_threadpool

from cellscale_hub.api import csrf
from cellscale_hub.api.logwatch import LogWatch
from cellscale_hub.auth import SCOPE_READ, SCOPE_SUBMIT, Identity, Principal, Unauthenticated
from cellscale_hub.bundles import BundleStore
from cellscale_hub.drivers import Driver
from cellscale_hub.metrics import Metrics
from cellscale_hub.settings import Settings
from cellscale_hub.store import Store
from cellscale_hub.store.tenancy_book import TenancyBook
from cellscale_hub.waiting import WaitingBoard

OAUTH_COOKIE = "cellscale-oauth"


@dataclass
class Context:
    store: Store
    wake: Callable[[], None]  # run a controller cycle now (after a submit, cancel or tenancy change)
    drivers: dict[str, Driver]
    tenancy: TenancyBook
    identity: Identity
    jobs_root: Path
    bundles: BundleStore
    prefix: str
    settings: Settings = Settings()
    hub_oauth: object | None = None
    waiting: WaitingBoard = field(default_factory=WaitingBoard)  # the controller's: why pending jobs wait
    metrics: Metrics = field(default_factory=Metrics)  # the controller's instruments, shown at /metrics
    log_watch: LogWatch = field(init=False)  # the followed logs; told of jobs' ends by the store

    def __post_init__(self) -> None:
        self.log_watch = LogWatch(self.store)

    def new_job_id(self) -> str:
        return "cs-" + secrets.token_hex(6)


async def context(request: Request) -> Context:
    """The app's context (async, like `check` below: a sync dependency is a round trip through
    the thread pool, and every thread switch waits for the GIL)."""
    return request.app.state.ctx


def presented_token(request: Request) -> str | None:
    return presented(request)[0]


def presented(request: Request) -> tuple[str | None, bool]:
    """The caller's token, and whether it came from the browser's sign-in cookie (rather than
    an Authorization header, which a browser never adds on its own)."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() in ("token", "bearer") and value.strip():
        return value.strip(), False
    cookie = request.cookies.get(OAUTH_COOKIE)
    return cookie, bool(cookie)


async def principal(request: Request, ctx: Context = Depends(context)) -> Principal:
    token, from_cookie = presented(request)
    if not token:
        raise HTTPException(401, "authentication required: send a JupyterHub API token (Authorization: token ...)")
    if from_cookie:
        csrf.check(request, token)  # a change signed in by the cookie must come from our own page
    try:
        if ctx.identity.blocks:  # it may ask the hub: not on the event loop
            who = await run_in_threadpool(ctx.identity.principal, token)
        else:
            who = ctx.identity.principal(token)
    except Unauthenticated as exc:
        raise HTTPException(401, str(exc)) from exc
    return Principal(
        user=who.user,
        groups=who.groups,
        scopes=who.scopes,
        admin=who.admin,
        tenants=tuple(ctx.tenancy.current.tenants_of(list(who.groups))),
    )


def require(scope: str):
    async def check(who: Principal = Depends(principal)) -> Principal:
        if not who.can(scope):
            raise HTTPException(403, f"your token lacks the {scope} scope")
        return who

    return check


Ctx = Annotated[Context, Depends(context)]
Reader = Annotated[Principal, Depends(require(SCOPE_READ))]
Submitter = Annotated[Principal, Depends(require(SCOPE_SUBMIT))]
