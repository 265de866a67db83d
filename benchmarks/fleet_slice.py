"""A slice of the fleet replay (`fleet_replay.py`) from a saved state: profile one contended
stretch, or check that a change to the scheduling code keeps every decision.

    # replay days 2-8.5 of the scaled trace under a policy up to replay day 1.95, save the state
    nice .venv/bin/python benchmarks/fleet_slice.py save --policy sites --from-day 2 --to-day 8.5 \\
        --at 1.95 --state /tmp/fleet_state_sites.pkl
    # replay 3 simulated hours from it: CPU time, cycle times, and a digest of the decisions
    nice .venv/bin/python benchmarks/fleet_slice.py slice --state /tmp/fleet_state_sites.pkl --hours 3 [--profile]

Equal digests from the same state, before and after a change: the same admissions and
preemptions at the same times and sites, in the same order.
"""

from __future__ import annotations

import argparse
import cProfile
import pickle
import pstats
import sys
import time
from pathlib import Path

from _common import percentile
from fleet_replay import DAY, HOUR, TRACE, FleetConfig, fleet_jobs, make_sim
from trace_replay import load_trace


def save(args) -> None:
    cfg = FleetConfig()
    jobs, desks = fleet_jobs(load_trace(TRACE), cfg)
    jobs = [j for j in jobs if args.from_day * DAY <= j.submit < args.to_day * DAY]
    t0 = jobs[0].submit
    for j in jobs:
        j.submit -= t0
    sim = make_sim(jobs, desks, cfg, args.policy)
    w0 = time.process_time()
    sim.run(until=args.at * DAY)
    pending = sum(len(v) for v in sim.pending.values())
    print(
        f"replay day {sim.now / DAY:.3f} after {time.process_time() - w0:.0f} s CPU: {pending} waiting, "
        f"{len(sim.holders)} holders, held {dict(sim.held_f)}"
    )
    args.state.write_bytes(pickle.dumps(sim))


def replay_slice(args) -> None:
    sim = pickle.loads(args.state.read_bytes())
    n0, c0 = len(sim.decisions), len(sim.cycle_s)
    start, until = sim.now, sim.now + args.hours * HOUR
    waiting0 = sim.max_pending = sum(len(v) for v in sim.pending.values())
    cpu0 = time.process_time()
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(sim.run, until)
    else:
        sim.run(until)
    cpu = time.process_time() - cpu0
    ms = [s * 1000 for s in sim.cycle_s[c0:]]
    print(
        f"{sim.policy}: {args.hours:g} h from replay day {(until - args.hours * HOUR) / DAY:.3f}: {cpu:.1f} s CPU, "
        f"{len(ms)} cycles, CPU per cycle mean {sum(ms) / max(len(ms), 1):.1f} ms, p50 {percentile(ms, 50):.1f}, "
        f"p95 {percentile(ms, 95):.1f}; {len(sim.decisions) - n0} decisions, digest {sim.digest(n0)}"
    )
    print(slice_jobs(sim, start, until, waiting0))
    if args.profile:
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


def slice_jobs(sim, start: float, until: float, waiting0: int) -> str:
    """What the slice did to the waiting: how many waited at its start, at most and at its end;
    of the jobs submitted in it, the mean wait for a first start (those still waiting: until the
    end, a lower bound) and the mean JCT of those that finished in it."""
    ids = [i for i, j in enumerate(sim.jobs) if start <= j.submit < until]
    waits = [((sim.first_start[i] if sim.first_start[i] is not None else until) - sim.jobs[i].submit) for i in ids]
    done = [sim.finish[i] - sim.jobs[i].submit for i in ids if sim.finish[i] is not None]
    unstarted = sum(1 for i in ids if sim.first_start[i] is None)
    waiting = sum(len(v) for v in sim.pending.values())
    return (
        f"waiting: {waiting0} at the start, at most {sim.max_pending}, {waiting} at the end; {len(ids)} jobs "
        f"submitted in the slice: mean wait {sum(waits) / max(len(waits), 1) / HOUR:.3f} h ({unstarted} not "
        f"started), {len(done)} finished, their JCT mean {sum(done) / max(len(done), 1) / HOUR:.3f} h"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("save", help="replay up to a point and save the state")
    s.add_argument("--policy", default="sites")
    s.add_argument("--from-day", type=float, default=2.0, help="of the scaled trace")
    s.add_argument("--to-day", type=float, default=8.5, help="of the scaled trace")
    s.add_argument("--at", type=float, default=1.95, help="replay day to stop and save at")
    s.add_argument("--state", type=Path, required=True)
    r = sub.add_parser("slice", help="replay a slice from a saved state")
    r.add_argument("--state", type=Path, required=True)
    r.add_argument("--hours", type=float, default=3.0)
    r.add_argument("--profile", action="store_true", help="cProfile it, print the top 30")
    args = parser.parse_args()
    save(args) if args.command == "save" else replay_slice(args)


if __name__ == "__main__":
    sys.exit(main())
