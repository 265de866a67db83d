"""The server extension: the side panel's authenticated relay to the control plane.

It calls the control plane with the server's own hub token (whose scopes come from
`Spawner.server_token_scopes`), so the control plane sees the server's user and applies its
own rules (your jobs, your desk's jobs). The routes are listed in `handlers`.
"""

from __future__ import annotations

import os

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Unicode, default

from cellscale_server.control_plane import ControlPlaneClient
from cellscale_server.handlers import handlers


class CellscaleServerApp(ExtensionApp):
    name = "cellscale_server"

    control_plane_url = Unicode(help="The control plane's URL (default: $CELLSCALE_URL).").tag(config=True)
    control_plane_token = Unicode(
        help="Token for the control plane (default: $CELLSCALE_TOKEN, else $JUPYTERHUB_API_TOKEN)."
    ).tag(config=True)
    jobs_poll_interval_s = Float(
        1.0,
        help="How often the job-list websocket asks the control plane for the "
        "list, in seconds; it pushes only when the list changed.",
    ).tag(config=True)

    @default("control_plane_url")
    def _url(self) -> str:
        return os.environ.get("CELLSCALE_URL", "")

    @default("control_plane_token")
    def _token(self) -> str:
        return os.environ.get("CELLSCALE_TOKEN") or os.environ.get("JUPYTERHUB_API_TOKEN", "")

    _control_plane: ControlPlaneClient | None = None

    @property
    def control_plane(self) -> ControlPlaneClient:
        if self._control_plane is None:
            self._control_plane = ControlPlaneClient(self.control_plane_url, self.control_plane_token)
        return self._control_plane

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers(self))

    async def stop_extension(self) -> None:
        if self._control_plane is not None:
            await self._control_plane.aclose()
