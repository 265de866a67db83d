"""A minimal ExtensionApp: tells the logged-in user who they are to the control plane.

It calls the control plane with the server's own hub token (whose scopes come from
`Spawner.server_token_scopes`), so the control plane sees the server's user. The side
panel's relay and live fan-out grow from here.
"""

from __future__ import annotations

import os

import httpx
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.application import ExtensionApp
from tornado import web
from traitlets import Unicode, default


class WhoAmIHandler(APIHandler):
    def initialize(self, app: "CellscaleServerApp") -> None:
        self.app = app

    @web.authenticated
    async def get(self) -> None:
        app = self.app
        if not app.control_plane_url:
            raise web.HTTPError(503, "no control plane configured (set CELLSCALE_URL)")
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(
                app.control_plane_url.rstrip("/") + "/api/whoami",
                headers={"Authorization": f"token {app.control_plane_token}"},
            )
        self.set_status(response.status_code)
        self.finish(response.content)


class CellscaleServerApp(ExtensionApp):
    name = "cellscale_server"

    control_plane_url = Unicode(help="The control plane's URL (default: $CELLSCALE_URL).").tag(config=True)
    control_plane_token = Unicode(help="Token for the control plane (default: $JUPYTERHUB_API_TOKEN).").tag(config=True)

    @default("control_plane_url")
    def _url(self) -> str:
        return os.environ.get("CELLSCALE_URL", "")

    @default("control_plane_token")
    def _token(self) -> str:
        return os.environ.get("CELLSCALE_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    def initialize_handlers(self) -> None:
        self.handlers.append(("/cellscale/api/whoami", WhoAmIHandler, {"app": self}))
