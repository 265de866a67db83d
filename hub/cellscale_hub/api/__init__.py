"""The control plane's HTTP API (FastAPI): thin handlers over the store and controller."""

from cellscale_hub.api.routes import build_app

__all__ = ["build_app"]
