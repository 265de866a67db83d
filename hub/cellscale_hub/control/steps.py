"""One step of a reconcile cycle, isolated: a step that fails (a backend that does not answer)
is logged and the rest of the cycle goes on, so one backend never stalls the others."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("cellscale.controller")


def isolated(what: str, backend: str, call: Callable[[], object]) -> None:
    try:
        call()
    except Exception:  # a backend that does not answer must not stall the others
        log.exception("%s on backend %s failed; its attempts keep their last known state", what, backend)
