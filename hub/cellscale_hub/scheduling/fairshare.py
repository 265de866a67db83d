"""Hierarchical fair share with memory.

A queue's usage is its GPUs in use now plus its *recent* use: GPU-seconds decayed with a
half-life, expressed as average GPUs (a queue that held r GPUs for ever has history r).
A desk that used a lot in the last hour therefore yields to one that did not, and with
half-life 0 only current use counts (Kueue's behaviour).

Ordering is a walk down the cohort tree (as in Slurm's Fair Tree): among siblings, the one
whose usage is smallest relative to its weight goes first; the sort key of a queue is that
ratio at every level from the root down, compared left to right.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from cellscale_hub.tenancy import Tenancy

ROOT = "root"


def decayed_gpu_seconds(gpus: int, start: float, end: float, now: float, half_life: float) -> float:
    """∫ gpus · 2^(-(now - t)/half_life) dt over [start, end]: recent seconds count fully,
    older ones fade."""
    if end <= start:
        return 0.0
    if half_life <= 0:
        return 0.0
    k = math.log(2) / half_life
    return gpus / k * (math.exp(-k * (now - end)) - math.exp(-k * (now - start)))


def average_gpus(decayed: float, half_life: float) -> float:
    """Decayed GPU-seconds as the constant GPU count that would have produced them."""
    return decayed * math.log(2) / half_life if half_life > 0 else 0.0


@dataclass(frozen=True)
class FairTree:
    """The cohort tree flattened for fast share computation."""

    paths: dict[str, tuple[str, ...]]  # cluster queue -> nodes from the top down
    parent: dict[str, str]
    share: dict[str, float]  # node -> its weight as a fraction of its siblings' weights

    @classmethod
    def of(cls, tenancy: Tenancy) -> FairTree:
        paths = {cq: tuple(tenancy.fair_share_path(cq)) for cq in tenancy.cluster_queues}
        parent: dict[str, str] = {}
        for path in paths.values():
            for above, node in itertools.pairwise((ROOT, *path)):
                parent[node] = above
        siblings_weight: dict[str, float] = {}
        for node, above in parent.items():
            siblings_weight[above] = siblings_weight.get(above, 0.0) + tenancy.weight_of(node)
        share = {node: tenancy.weight_of(node) / siblings_weight[above] for node, above in parent.items()}
        return cls(paths=paths, parent=parent, share=share)

    def node_usage(self, queue_usage: Mapping[str, float]) -> dict[str, float]:
        usage: dict[str, float] = {}
        for cq, amount in queue_usage.items():
            for node in self.paths.get(cq, ()):
                usage[node] = usage.get(node, 0.0) + amount
        return usage

    def key(self, cluster_queue: str, node_usage: Mapping[str, float]) -> tuple[float, ...]:
        """Smaller goes first: usage over entitled share at each level, from the top down."""
        return tuple(node_usage.get(node, 0.0) / self.share[node] for node in self.paths[cluster_queue])


class Memory:
    """Each queue's decayed use (`decayed_gpu_seconds` summed over its attempts), kept by events
    and decayed lazily: an ended attempt adds its decayed use to its queue's total, stamped with
    the time it was decayed to; running attempts are two sums per queue (their sizes, and each
    size times e^(k·(start - base))), from which their decayed use at any time is closed form. So
    reading every queue's history costs O(queues), whatever the number of attempts, and nothing is
    rewritten as time passes. `base` moves forward now and then so the exponentials stay small."""

    REBASE = 50.0  # k·(now - base) beyond which the sums are rescaled

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self.k = math.log(2) / half_life if half_life > 0 else 0.0
        self.base: float | None = None
        self.ended: dict[str, tuple[float, float]] = {}  # queue -> (decayed GPU-seconds, as of)
        self.sizes: dict[str, float] = {}  # queue -> sum of its running attempts' sizes
        self.starts: dict[str, float] = {}  # queue -> sum of size · e^(k·(start - base))

    def start(self, queue: str, size: float, started: float) -> None:
        if self.k:
            self._rebase(started)
            self.sizes[queue] = self.sizes.get(queue, 0.0) + size
            self.starts[queue] = self.starts.get(queue, 0.0) + size * math.exp(self.k * (started - self.base))

    def forget(self, queue: str, size: float, started: float) -> None:
        """A running attempt no longer counts as running (it ended: `stop`; or it is re-read)."""
        if self.k:
            self.sizes[queue] -= size
            self.starts[queue] -= size * math.exp(self.k * (started - self.base))

    def stop(self, queue: str, size: float, started: float, ended: float) -> None:
        self.forget(queue, size, started)
        self.seed(queue, decayed_gpu_seconds(size, started, ended, ended, self.half_life), ended)

    def seed(self, queue: str, decayed: float, at: float) -> None:
        """Add decayed GPU-seconds as of `at` (an ended attempt, or the store's history on start)."""
        if self.k:
            value, stamp = self.ended.get(queue, (0.0, at))
            latest = max(at, stamp)
            self.ended[queue] = (
                value * math.exp(-self.k * (latest - stamp)) + decayed * math.exp(-self.k * (latest - at)),
                latest,
            )

    def averages(self, now: float) -> dict[str, float]:
        """Each queue's history at `now`, as `average_gpus`."""
        if not self.k:
            return {}
        self._rebase(now)
        out: dict[str, float] = {}
        for queue, (value, stamp) in self.ended.items():
            out[queue] = value * math.exp(-self.k * (now - stamp))
        decay = math.exp(-self.k * (now - self.base))
        for queue, size in self.sizes.items():
            running = (size - decay * self.starts[queue]) / self.k
            out[queue] = out.get(queue, 0.0) + max(0.0, running)
        return {queue: average_gpus(value, self.half_life) for queue, value in out.items()}

    def _rebase(self, t: float) -> None:
        if self.base is None:
            self.base = t
        elif self.k * (t - self.base) > self.REBASE:
            scale = math.exp(-self.k * (t - self.base))
            self.starts = {queue: value * scale for queue, value in self.starts.items()}
            self.base = t
