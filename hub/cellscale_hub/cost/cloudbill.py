"""A cloud pool's bill, attributed to the attempts that ran on its instances.

The cloud bills each instance (one node) by the second, from the request for it to its
stop: boot, the jobs it ran, idle gaps, and the idle tail before power-down. The backend's
own accounting says which attempt held the node when. Each instance's dollars go to its
attempts: the seconds an attempt held the node to it; the seconds before an attempt (boot,
an idle gap) to that attempt (it caused the resume); the tail after the last one to that last
one (it kept the node up). An instance no attempt ever held stays unattributed (a resume whose
job went elsewhere): shared cost. The attributed dollars plus the unattributed add up to the
bill exactly.

Pure functions; the controller feeds them the driver's `cloud_instances()` and `node_runs()`
(`Instance` and `Run`, the records a `CloudPool` driver reports: drivers/capabilities.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

from cellscale_hub.drivers.capabilities import Instance, Run


@dataclass(frozen=True)
class Attribution:
    usd: dict[Hashable, float]
    unattributed_usd: float

    @property
    def total_usd(self) -> float:
        return sum(self.usd.values()) + self.unattributed_usd


def attribute(instances: Iterable[Instance], runs: Iterable[Run], now: float) -> Attribution:
    by_node: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        by_node[run.node].append(run)
    usd: dict[Hashable, float] = defaultdict(float)
    unattributed = 0.0
    for inst in instances:
        stop = inst.stopped if inst.stopped is not None else now
        mine = sorted(
            (r for r in by_node.get(inst.node, ()) if r.start < stop and (r.end or now) > inst.requested),
            key=lambda r: r.start,
        )
        shares = _seconds(inst.requested, stop, mine, now)
        total = sum(shares.values())
        if total <= 0:
            unattributed += inst.usd
            continue
        for key, seconds in shares.items():
            usd[key] += inst.usd * seconds / total
    return Attribution(dict(usd), unattributed)


def _seconds(requested: float, stop: float, runs: list[Run], now: float) -> dict[Hashable, float]:
    """Seconds of the instance's life each run answers for: the gap before it and its own
    (time another run already answers for is not counted twice), and the last one the tail."""
    shares: dict[Hashable, float] = defaultdict(float)
    cursor = requested
    for i, run in enumerate(runs):
        end = stop if i == len(runs) - 1 else min(run.end if run.end is not None else now, stop)
        if end > cursor:
            shares[run.key] += end - cursor
            cursor = end
    return shares
