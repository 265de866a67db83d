"""What admission that counts GPUs, not nodes, costs where a backend hands out nodes: the
replay of `scheduling_quality.py` (the same windows, loads and policies) on a fleet of 8-GPU
servers, each job placed on nodes as Slurm would place it.

Today cellscale admits a job when its GPUs fit the flavor's total. The backend must then find
them on nodes: a job of up to 8 GPUs on one node with that many free, a larger gang on whole
free nodes (`--exclusive`, as the Slurm driver shapes `--gpus 16` into 2 nodes of 8). A job
admitted that no node can take waits in the backend while its quota counts as taken. This
replay measures that, for two placements the backend may use, side by side:

- **first fit**: the lowest-numbered node with room (Slurm's default node order);
- **best fit**: the node with the least room that still fits (what keeps whole nodes free for
  gangs; Slurm's `CR_Pack_Nodes`/`bf` ordering comes close).

Measured per case: GPU-hours idle while an admitted job waited for a node although the idle
GPUs would have covered it in total (*fragmentation*), as a fraction of the fleet's GPU-hours;
GPU-hours of quota held by jobs waiting for a node; how many jobs waited for one and the p95
of that wait; and the JCT the replay gives with that wait included.

This is a simulation of the backend's placement (no real Slurm): it stays unproven how close
Slurm's own placement is to either policy; `slurm_vs_cellscale.py` runs real Slurm.

    .venv/bin/python benchmarks/fragmentation.py [--windows 25:10,40:10,60:10] [--loads 0.85,1.1]
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import time
from dataclasses import replace

from _common import percentile, print_table, write_results
from scheduling_quality import fleet_for
from trace_replay import HOUR, Sim, cap_jobs, load_trace, nominal_quotas, policies, slice_jobs

NODE_GPUS = 8


class NodeSim(Sim):
    """The replay with each admitted job placed on nodes (`place`); one that no node can take
    waits for one, holding its quota, and is placed as nodes free up (in admission order, a
    later job that fits going first)."""

    def __init__(self, *args, best_fit: bool = True, node_gpus: int = NODE_GPUS, **kwargs):
        super().__init__(*args, **kwargs)
        self.best_fit, self.node_gpus = best_fit, node_gpus
        self.free = [node_gpus] * (self.fleet // node_gpus)
        self.on_nodes: dict[int, list[tuple[int, int]]] = {}  # job -> (node, GPUs) it holds there
        self.unplaced: dict[int, float] = {}  # admitted job waiting for a node -> since when
        self.node_waits: list[float] = []
        self.fragmented_gpu_s = self.unplaced_gpu_s = 0.0

    # -- placement --------------------------------------------------------------------------
    def place(self, i: int) -> bool:
        g = self.jobs[i].gpus
        if g > self.node_gpus:  # a gang on whole free nodes
            whole = [n for n, free in enumerate(self.free) if free == self.node_gpus]
            need = math.ceil(g / self.node_gpus)
            if len(whole) < need:
                return False
            chosen = [(n, self.node_gpus) for n in whole[:need]]
        else:
            fits = [n for n, free in enumerate(self.free) if free >= g]
            if not fits:
                return False
            node = min(fits, key=lambda n: (self.free[n], n)) if self.best_fit else fits[0]
            chosen = [(node, g)]
        for node, taken in chosen:
            self.free[node] -= taken
        self.on_nodes[i] = chosen
        return True

    def run_from(self, i: int, t: float) -> None:
        if self.place(i):
            super().run_from(i, t)
        else:
            self.unplaced[i] = t

    def place_waiting(self, t: float) -> None:
        for i in list(self.unplaced):
            if self.place(i):
                self.node_waits.append(t - self.unplaced.pop(i))
                super().run_from(i, t)
                holder = self.holders.get(i)
                if holder is not None:  # the reference keeps no Holder
                    self.holders[i] = replace(holder, started=t)
                    self.engine.hold(self.holders[i])
                    heapq.heappush(self.marks, (t + self.checkpoint, i, self.gen[i]))

    def _release(self, i: int, t: float) -> None:
        for node, taken in self.on_nodes.pop(i, ()):
            self.free[node] += taken
        if self.unplaced.pop(i, None) is not None:
            self.started[i] = None
        super()._release(i, t)
        self.place_waiting(t)

    def leave(self, i: int, t: float) -> None:
        if self.started[i] is None:  # preempted before a node took it: it ran nothing
            self.started[i] = t
        super().leave(i, t)

    # -- accounting ---------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        dt = t - self.now
        if dt > 0 and self.unplaced:
            sizes = [self.jobs[i].gpus for i in self.unplaced]
            idle = sum(self.free)
            self.unplaced_gpu_s += sum(sizes) * dt
            if min(sizes) <= idle:
                self.fragmented_gpu_s += idle * dt
        super().advance(t)

    def metrics(self) -> dict:
        out = super().metrics()
        span = self.last_finish - self.first_event
        out.pop("per_tenant")
        out["nodes"] = {
            "node_gpus": self.node_gpus,
            "placement": "best fit" if self.best_fit else "first fit",
            "fragmented_idle_fraction": self.fragmented_gpu_s / (self.fleet * span),
            "waiting_for_node_quota_fraction": self.unplaced_gpu_s / (self.fleet * span),
            "jobs_waited_for_node": len(self.node_waits),
            "node_wait_p95_min": percentile(self.node_waits, 95) / 60 if self.node_waits else 0.0,
        }
        return out


def run_case(trace, skip: float, days: float, load: float, names: list[str]) -> dict:
    window = slice_jobs(trace, skip_days=skip, days=days)
    fleet = fleet_for(window, load)
    jobs, _ = cap_jobs(window, fleet)
    nominal = nominal_quotas(jobs, fleet)
    pols = policies(nominal, fleet)
    tenants = sorted(nominal)
    weights = tuple(float(nominal[t]) for t in tenants)
    case = {"window": {"skip_days": skip, "days": days}, "load": load, "fleet_gpus": fleet, "results": {}}
    print(f"\nwindow days {skip:g}-{skip + days:g} at load {load:g}: {len(jobs)} jobs on {fleet} GPUs", flush=True)
    rows = []
    for name in names:
        for best in (False, True):
            t0 = time.perf_counter()
            sim = NodeSim(jobs, pols[name], fleet, tenants, weights, best_fit=best)
            sim.run()
            m = sim.metrics()
            key = f"{name} ({m['nodes']['placement']})"
            case["results"][key] = m
            n = m["nodes"]
            rows.append(
                [
                    key,
                    100 * n["fragmented_idle_fraction"],
                    100 * n["waiting_for_node_quota_fraction"],
                    n["jobs_waited_for_node"],
                    n["node_wait_p95_min"],
                    m["jct_mean_h"],
                    m["short_wait_p95_h"] * 60,
                    time.perf_counter() - t0,
                ]
            )
    print_table(
        [
            "policy (placement)",
            "idle from fragmentation (% of GPU-h)",
            "quota held waiting for a node (%)",
            "jobs that waited for a node",
            "that wait p95 (min)",
            "JCT mean (h)",
            "short wait p95 (min)",
            "wall (s)",
        ],
        rows,
    )
    return case


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--windows", default="25:10,40:10,60:10", help="SKIP_DAYS:DAYS,...")
    parser.add_argument("--loads", default="0.85,1.1")
    parser.add_argument("--policies", default="greedy,tiresias,cellscale")
    parser.add_argument("--out", default="fragmentation")
    args = parser.parse_args()
    windows = [tuple(float(x) for x in w.split(":")) for w in args.windows.split(",")]
    loads = [float(x) for x in args.loads.split(",")]
    trace = load_trace()
    t0 = time.perf_counter()
    cases = [run_case(trace, s, d, load, args.policies.split(",")) for s, d in windows for load in loads]
    print(f"\nwall time {time.perf_counter() - t0:.0f} s")
    write_results(args.out, False, {"node_gpus": NODE_GPUS, "hour_s": HOUR, "cases": cases})


if __name__ == "__main__":
    sys.exit(main())
