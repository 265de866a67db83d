"""The job side of a Dagster step run on cellscale (`cellscale.dagster`).

The step's function runs inside the Dagster Pipes protocol on rank 0 when the step injected a
Pipes context (DAGSTER_PIPES_CONTEXT) and `dagster-pipes` is importable on the node: its logs
and reports travel as JSON lines in the job's log, which the step reads through the control
plane. Without either, the function just runs (its return value still reaches the step as the
job's output). Imports only `dagster-pipes` (no dependencies), never `dagster`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

CONTEXT_ENV = "DAGSTER_PIPES_CONTEXT"


def call(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """`fn(**kwargs)`, inside an opened Pipes context on rank 0 when the step asked for one."""
    if not os.environ.get(CONTEXT_ENV) or os.environ.get("RANK", "0") != "0":
        return fn(**kwargs)
    try:
        from dagster_pipes import open_dagster_pipes
    except ImportError:
        print("[cellscale] dagster-pipes is not installed on this node: the step gets no Pipes messages", flush=True)
        return fn(**kwargs)
    with open_dagster_pipes():
        return fn(**kwargs)
