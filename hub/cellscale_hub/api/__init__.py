"""The control plane's HTTP API (FastAPI): thin handlers over the store and the drivers (the
controller is reached only through the context's wake() and published reasons), one router per
resource (desk, bundles, jobs, admin, cost, points), put together by `build_app`."""

from __future__ import annotations

from fastapi import FastAPI

from cellscale.spec import MAX_INPUTS_BYTES
from cellscale_hub.api import admin, bundles, cost, desk, jobs, oauth, points
from cellscale_hub.api.context import Context
from cellscale_hub.api.edge import DEFAULT_MAX_BODY_BYTES, InputEdge
from cellscale_hub.api.errors import install_error_handlers

RESOURCES = (desk.router, bundles.router, jobs.router, admin.router, cost.router, points.router)
"""The API's routers, under `<prefix>/api`, in the order the schema lists their paths."""


def build_app(ctx: Context, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> FastAPI:
    """The API, behind the input edge (api/edge.py): JSON bodies up to `max_body_bytes`, an
    inputs bundle up to MAX_INPUTS_BYTES."""
    prefix = ctx.prefix.rstrip("/")
    app = FastAPI(
        title="cellscale control plane",
        version="1",
        openapi_url=f"{prefix}/api/openapi.json",
        docs_url=f"{prefix}/api/docs",
        redoc_url=None,
    )
    install_error_handlers(app)
    upload = f"{prefix}/api/bundles"
    too_large = f"inputs are larger than {MAX_INPUTS_BYTES // 2**20} MiB; ship big data by URL"
    app.add_middleware(InputEdge, max_body_bytes=max_body_bytes, raw={upload: (MAX_INPUTS_BYTES, too_large)})
    app.state.ctx = ctx
    for router in RESOURCES:
        app.include_router(router, prefix=f"{prefix}/api")
    app.include_router(admin.page(prefix))
    app.include_router(oauth.router(prefix))
    return app
