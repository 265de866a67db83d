"""The server extension: the side panel's authenticated relay to the control plane.

It calls the control plane with the server's own hub token (whose scopes come from
`Spawner.server_token_scopes`), so the control plane sees the server's user and applies its
own rules (your jobs, your desk's jobs). The routes are listed in `handlers`.
"""

from __future__ import annotations

import os

from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, List, Unicode, default

from cellscale import personal
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
    _address: tuple[str, str] | None = None
    _retired = List(help="Clients of a personal control plane that has since moved; closed when the server stops.")

    @property
    def control_plane(self) -> ControlPlaneClient | None:
        """The configured control plane. With none (a Jupyter outside a hub): this user's personal
        control plane, the one `%%cluster` starts (with its backends: Slurm on a login node), found
        again in its server.json when it restarts elsewhere; None while it has never run."""
        address = (self.control_plane_url, self.control_plane_token) if self.control_plane_url else personal.current()
        if address is None:
            return None
        if address != self._address:
            if self._control_plane is not None:
                self._retired.append(self._control_plane)  # a request may still use it: closed at the end
            self._control_plane, self._address = ControlPlaneClient(*address), address
        return self._control_plane

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers(self))

    async def stop_extension(self) -> None:
        for client in [*self._retired, *([self._control_plane] if self._control_plane else [])]:
            await client.aclose()
