"""The jupyter-server extension: relays the side panel's calls to the control plane."""

from cellscale_server.app import CellscaleServerApp


def _jupyter_server_extension_points():
    return [{"module": "cellscale_server", "app": CellscaleServerApp}]
