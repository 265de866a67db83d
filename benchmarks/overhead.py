"""What cellscale adds to a 2-rank torchrun job, against running torchrun directly.

The same gloo DDP code (a few steps on CPU) runs N times each way, alternating:

  ours  Client.submit(JobSpec(launcher=torchrun, gpus_per_node=2)) to a personal control
        plane; times submit -> first "[rank" line seen by follow_logs, and submit -> the
        client knowing the job SUCCEEDED (follow_logs complete, then get(), as %%cluster does).
  raw   python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=2 script.py;
        times start -> first rank line on stdout, and start -> exit.

    .venv/bin/python benchmarks/overhead.py [--quick] [--reps N]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from _common import PYTHON, control_plane, median, print_table, ratio, write_results

from cellscale.client import Client
from cellscale.spec import JobSpec, Launcher, Phase, Resources

STEPS = 20
CELL = f"""\
import os, time
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
print(f"start rank={{rank}} world={{world}}", flush=True)
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range({STEPS}):
    opt.zero_grad()
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward()
    opt.step()
print(f"done rank={{rank}} loss={{loss.item():.4f}}", flush=True)
dist.destroy_process_group()
"""


def run_ours(client: Client) -> dict:
    spec = JobSpec(
        name="bench-overhead", launcher=Launcher.torchrun, resources=Resources(nodes=1, gpus_per_node=2), source=CELL
    )
    t0 = time.monotonic()
    job = client.submit(spec)
    first = None
    for chunk in client.follow_logs(job.id):
        if first is None and any(line.startswith("[rank") for line in chunk.text.splitlines()):
            first = time.monotonic() - t0
        if chunk.complete:
            break
    view = client.get(job.id)
    total = time.monotonic() - t0
    if view.phase is not Phase.SUCCEEDED:
        raise RuntimeError(f"job {job.id} ended {view.phase.value}: {view.reason}")
    server = (view.finished_at - view.created_at).total_seconds()
    return {"first_rank_line_s": first, "total_s": total, "server_created_to_finished_s": server, "job": job.id}


def run_raw(script: Path) -> dict:
    argv = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc-per-node=2", str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    child = subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    first, output = None, []
    for line in child.stdout:
        output.append(line)
        if first is None and "start rank=" in line:
            first = time.monotonic() - t0
    code = child.wait()
    total = time.monotonic() - t0
    if code != 0:
        raise RuntimeError(f"raw torchrun exited {code}:\n{''.join(output)}")
    return {"first_rank_line_s": first, "total_s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 repetitions instead of 5")
    parser.add_argument("--reps", type=int)
    args = parser.parse_args()
    reps = args.reps or (2 if args.quick else 5)

    ours, raw = [], []
    with tempfile.TemporaryDirectory(prefix="cellscale-bench-raw-") as tmp, control_plane() as cp:
        script = Path(tmp) / "ddp.py"
        script.write_text(CELL)
        client = Client(cp.url, cp.token)
        print(f"control plane {cp.url} (pid {cp.pid}); warming up both paths once (not counted)")
        run_raw(script)
        run_ours(client)
        for rep in range(reps):
            order = [("raw", raw), ("ours", ours)] if rep % 2 == 0 else [("ours", ours), ("raw", raw)]
            for kind, out in order:
                out.append(run_raw(script) if kind == "raw" else run_ours(client))
            o, r = ours[-1], raw[-1]
            print(
                f"rep {rep + 1}/{reps}: ours first={o['first_rank_line_s']:.2f}s total={o['total_s']:.2f}s"
                f" | raw first={r['first_rank_line_s']:.2f}s total={r['total_s']:.2f}s"
            )
        client.close()

    summary = {}
    for metric in ("first_rank_line_s", "total_s"):
        o, r = median([x[metric] for x in ours]), median([x[metric] for x in raw])
        summary[metric] = {"ours_median": o, "raw_median": r, "ratio_ours_raw": ratio(o, r), "added_s": o - r}
    summary["server_created_to_finished_s"] = {"ours_median": median([x["server_created_to_finished_s"] for x in ours])}

    print(f"\n2-rank torchrun gloo DDP ({STEPS} steps), median of {reps}")
    print_table(
        ["metric", "cellscale s", "raw torchrun s", "ours/raw", "added s"],
        [
            [m, s["ours_median"], s["raw_median"], s["ratio_ours_raw"], s["added_s"]]
            for m, s in summary.items()
            if "raw_median" in s
        ],
    )
    print(f"(server-side created -> finished, median: {summary['server_created_to_finished_s']['ours_median']:.3f}s)")
    write_results(
        "overhead", args.quick, {"reps": reps, "steps": STEPS, "summary": summary, "runs": {"ours": ours, "raw": raw}}
    )


if __name__ == "__main__":
    main()
