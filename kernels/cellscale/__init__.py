"""cellscale: run a notebook cell as a gang-scheduled cluster job.

%load_ext cellscale
%%cluster --gpus 2 --launcher torchrun --outputs loss

A sweep, the cell once per point of a grid: `%%cluster map --over grid --max-parallel 8`, or
from code `cellscale.map(fn, grid)`. Inside a job, `cellscale.data("bars")` is where the dataset
of `--data bars=URL@VERSION` is; `cellscale.datasets` reads it, timed into the job's I/O profile.
Light on purpose: what they need is imported when used.
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


def data(name: str) -> str:
    """Inside a job: the directory of its dataset `name` (`--data name=URL@VERSION`), the node's
    staged copy; its fsspec URL when streamed (`--data-mode stream`). `cellscale.datasets.open`
    and `arrow_dataset` read it with their reads timed into the job's I/O profile."""
    from cellscale.datasets import data as location

    return location(name)


def __getattr__(name: str) -> Any:
    if name == "Sweep":
        from cellscale.sweep import Sweep

        return Sweep
    if name == "datasets":
        import cellscale.datasets

        return cellscale.datasets
    raise AttributeError(f"module 'cellscale' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    from cellscale.magics import ClusterMagics

    ipython.register_magics(ClusterMagics(ipython))


def unload_ipython_extension(ipython) -> None:
    pass
