"""Print the control plane's OpenAPI schema as JSON: the single source of the side panel's
API types (labextension/src/generated/). Run `scripts/gen-api-types` rather than this alone.

The app is built without a running control plane: `build_app` only reads the URL prefix
from its context, and the schema never calls a handler. Paths are unprefixed (`/api/...`),
as the server extension relays them under `/cellscale/api/...`.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace


def schema() -> dict:
    from cellscale_hub.api import build_app

    return build_app(SimpleNamespace(prefix="")).openapi()


def render() -> str:
    return json.dumps(schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    text = render()
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
