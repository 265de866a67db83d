"""How late a job's log lines reach the client: streaming (ours) against 1 s polling (peers).

One job prints `tick I T` at a steady rate, T being time.time() when printed. Two clients
read the same job's log at the same time:

  follow  Client.follow_logs(job_id): the server-sent-event stream %%cluster uses.
  poll    Client.logs(job_id, offset) once per second: the non-follow endpoint, the way
          tools that poll a scheduler's log file show output.

For every line, lag = arrival time at the client - T (same machine, same clock).

    .venv/bin/python benchmarks/log_lag.py [--quick] [--rate 20] [--seconds 15]
"""

from __future__ import annotations

import argparse
import threading
import time

from _common import control_plane, percentile, print_table, ratio, write_results

from cellscale.client import Client
from cellscale.spec import JobSpec, Launcher, Phase, Resources

POLL_SECONDS = 1.0


def cell(rate: float, seconds: float) -> str:
    return f"""\
import time
start = time.time()
for i in range({int(rate * seconds)}):
    time.sleep(max(0.0, start + i / {rate} - time.time()))
    print(f"tick {{i}} {{time.time():.6f}}", flush=True)
"""


def lags_of(text: str, arrived: float, out: dict[int, float]) -> None:
    for line in text.splitlines():
        words = line.split()  # "[rank 0] tick I T"
        if len(words) == 5 and words[2] == "tick":
            out[int(words[3])] = arrived - float(words[4])


def follow(client: Client, job_id: str, out: dict[int, float]) -> None:
    for chunk in client.follow_logs(job_id):
        lags_of(chunk.text, time.time(), out)
        if chunk.complete:
            return


def poll(client: Client, job_id: str, out: dict[int, float]) -> None:
    offset = 0
    while True:
        chunk = client.logs(job_id, offset)
        lags_of(chunk.text, time.time(), out)
        offset = chunk.next_offset
        if chunk.complete:
            return
        time.sleep(POLL_SECONDS)


def stats(lags: dict[int, float]) -> dict:
    values = list(lags.values())
    return {
        "lines": len(values),
        "mean": sum(values) / len(values) if values else float("nan"),
        **{f"p{p}": percentile(values, p) for p in (50, 95, 99)},
        "max": max(values, default=float("nan")),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5 s instead of 15 s")
    parser.add_argument("--rate", type=float, default=20.0, help="lines per second")
    parser.add_argument("--seconds", type=float)
    args = parser.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 15.0)
    expected = int(args.rate * seconds)

    results: dict[str, dict[int, float]] = {"follow": {}, "poll": {}}
    with control_plane() as cp:
        submitter = Client(cp.url, cp.token)
        spec = JobSpec(
            name="bench-log-lag",
            launcher=Launcher.plain,
            resources=Resources(gpus_per_node=0),
            source=cell(args.rate, seconds),
        )
        job = submitter.submit(spec)
        print(f"control plane {cp.url} (pid {cp.pid}); job {job.id}: {expected} lines at {args.rate:g}/s")
        readers = []
        for name, fn in (("follow", follow), ("poll", poll)):
            client = Client(cp.url, cp.token)
            readers.append((client, threading.Thread(target=fn, args=(client, job.id, results[name]), name=name)))
        for _, thread in readers:
            thread.start()
        for client, thread in readers:
            thread.join()
            client.close()
        view = submitter.get(job.id)
        submitter.close()
        if view.phase is not Phase.SUCCEEDED:
            raise RuntimeError(f"job {job.id} ended {view.phase.value}: {view.reason}")
    for name, lags in results.items():
        if len(lags) != expected:
            print(f"warning: {name} saw {len(lags)} of {expected} lines")

    summary = {name: stats(lags) for name, lags in results.items()}
    summary["ratio_follow_poll"] = {
        k: ratio(summary["follow"][k], summary["poll"][k]) for k in ("mean", "p50", "p95", "p99", "max")
    }
    print(f"\nlog line lag, seconds ({expected} lines at {args.rate:g}/s; poll every {POLL_SECONDS:g}s)")
    print_table(
        ["reader", "lines", "mean", "p50", "p95", "p99", "max"],
        [
            [name, s["lines"], s["mean"], s["p50"], s["p95"], s["p99"], s["max"]]
            for name, s in summary.items()
            if name != "ratio_follow_poll"
        ]
        + [["follow/poll", "", *(summary["ratio_follow_poll"][k] for k in ("mean", "p50", "p95", "p99", "max"))]],
    )
    write_results(
        "log_lag",
        args.quick,
        {
            "rate_per_s": args.rate,
            "seconds": seconds,
            "expected_lines": expected,
            "poll_seconds": POLL_SECONDS,
            "summary": summary,
        },
    )


if __name__ == "__main__":
    main()
