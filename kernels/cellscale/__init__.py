"""cellscale: run a notebook cell as a gang-scheduled cluster job.

%load_ext cellscale
%%cluster --gpus 2 --launcher torchrun --outputs loss

A sweep, the cell once per point of a grid: `%%cluster map --over grid --max-parallel 8`, or
from code `cellscale.map(fn, grid)`. Light on purpose: what they need is imported when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from cellscale.sweep import Sweep

__version__ = "0.1.0"


def map(  # noqa: A001 - cellscale.map, as the builtin for a grid
    fn: Callable[..., Any],
    grid: Any,
    *,
    gpus: int = 0,
    max_parallel: int = 64,
    per_task: int = 1,
    **options: Any,
) -> Sweep:
    """Run `fn(**point)` once per point of `grid` on the cluster, as ONE job; returns a `Sweep`
    at once (`.df`, `.wait()`, `.failed()`, `.retry()`; shown live in a notebook).

    grid: a list of dicts, a pandas DataFrame (one point per row), or a dict of lists (their
    product). Values are numbers, strings, booleans, None, dates, or lists and dicts of them.
    fn is pickled (cloudpickle) with what it refers to; its return value is the point's `result`
    (a dict's keys become columns of `.df`).

    gpus: GPUs of each point's task; max_parallel: most tasks at once; per_task: points one task
    runs one after another (for tiny points). Other options, as the %%cluster flags: time
    (minutes), cpus, mem ("4G"), env ({"K": "V"}), queue, backend, site, burst, data, priority,
    retries, retries_timeout, retries_user, stall_timeout, name; client= a cellscale Client
    (default: Client.from_env()).
    """
    from cellscale.sweep import run_map

    return run_map(fn, grid, gpus=gpus, max_parallel=max_parallel, per_task=per_task, **options)


def __getattr__(name: str) -> Any:
    if name == "Sweep":
        from cellscale.sweep import Sweep

        return Sweep
    raise AttributeError(f"module 'cellscale' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    from cellscale.magics import ClusterMagics

    ipython.register_magics(ClusterMagics(ipython))


def unload_ipython_extension(ipython) -> None:
    pass
