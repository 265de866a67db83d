"""cellscale on Slurm against plain sbatch, on the dev cluster (4 emulated nodes, one machine).

1. overhead: a 1-node CPU-only `plain` cell that sleeps, submitted through cellscale
   (POST /api/jobs; the controller writes the job dir and job.sbatch, then runs
   `runuser -u alice -- sbatch --parsable job.sbatch`), against raw
   `runuser -u alice -- sbatch --parsable` of the same rendered script (copied, with its job
   dir path changed to a fresh copy of the job dir, so its supervisor really runs the cell).
   Both are timed until `squeue` shows the job RUNNING (polled every 0.1 s). For cellscale
   the same loop also records when the attempt got its Slurm id (sbatch returned to the
   controller) and when the control plane reports the job RUNNING (its rank started the cell).
   One warm-up, then N reps (10, --quick 3) alternating which path goes first; the cluster is
   idle (empty queue, every node idle) before each measurement. Slurm here starts jobs on its
   scheduling passes (sched_interval=5, bf_interval=5), not at submit, so each submit waits a
   random 0-5 s first: otherwise the fixed rhythm of submit, cancel, wait idle locks each path
   to one phase of the passes, and the medians measure that phase, not the path.
2. throughput: M submissions (500, --quick 100) of a tiny CPU-only job, one after the
   other, from one thread. Raw: `runuser -u alice -- sbatch --parsable` of a script that runs
   `true`. cellscale: POST /api/jobs of the cell `pass`, timed until every attempt has its
   Slurm id (accepted by the API AND submitted by the controller). Each flood starts on an idle
   cluster; the jobs run while the flood goes on (on the same cores as the submitters). After
   each flood every job still queued is cancelled (scancel as root) and waited out.

Only this benchmark's own jobs are ever cancelled (their Slurm ids: from sbatch, and from the
store); it never changes the cluster's configuration, partitions or nodes.

The control plane runs in this process: the API through FastAPI's TestClient with the test
suite's table identity (tests/controlplane/conftest.py; a real `python -m cellscale_hub` takes
its tokens from a JupyterHub, and --personal would submit as root to a "personal" account), a
SQLite store, and its real controller thread (woken by every submit, polling every 0.5 s).
The cluster is started if it is not running, and then stopped at the end (unless someone
else's jobs are queued by then); a running one is left running. Must run as root (runuser).

    .venv/bin/python benchmarks/slurm.py [--quick] [--reps N] [--submits M]
"""

from __future__ import annotations

import argparse
import logging
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import REPO, median, print_table, ratio, timing, write_results
from sqlalchemy import func, select

sys.path.insert(0, str(REPO))  # for the test suite's in-process Plane
from cellscale_hub import proc  # noqa: E402
from cellscale_hub.dev import slurm as dev_slurm  # noqa: E402
from cellscale_hub.drivers.owners import hand_to_owner  # noqa: E402
from cellscale_hub.drivers.slurm import SlurmDriver  # noqa: E402
from cellscale_hub.store import Store  # noqa: E402
from cellscale_hub.store.models import Attempt  # noqa: E402
from cellscale_hub.tenancy import Tenancy  # noqa: E402
from tests.controlplane.conftest import Plane  # noqa: E402

USER = "alice"  # account desk-a
PARTITION = "gpu"
POLL = 0.1
SCHED_PERIOD = 5.0  # sched_interval and bf_interval in cellscale_hub/dev/slurm_templates/slurm.conf.in
TENANCY = Tenancy.single("desk-a", {"slurm": 32})
CPU_ONLY = {"nodes": 1, "gpus_per_node": 0}
SLEEPER = "import time\ntime.sleep(60)\n"  # cancelled as soon as it is seen running
TRIVIAL = f"""#!/bin/bash
#SBATCH --job-name=bench-raw
#SBATCH --account=desk-a
#SBATCH --partition={PARTITION}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --time=60
#SBATCH --chdir=/tmp
#SBATCH --output=/dev/null
#SBATCH --no-requeue
true
"""
ENV: dict[str, str] = {}  # the environment the driver gives Slurm commands (set in main)
RAW_IDS: set[str] = set()  # every Slurm id the raw path submitted


def slurm(*argv: str, user: str | None = None) -> str:
    """A Slurm command, as root or as `user` (runuser, as the driver does on a dev cluster)."""
    full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
    result = subprocess.run(full, capture_output=True, text=True, env=ENV, timeout=60, check=False)
    if result.returncode:
        raise RuntimeError(f"{shlex.join(full)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def sbatch(script: Path) -> str:
    slurm_id = slurm("sbatch", "--parsable", str(script), user=USER).strip().split(";")[0]
    RAW_IDS.add(slurm_id)
    return slurm_id


def state(*selector: str) -> str:
    """squeue's state for `-j ID` or `--name=NAME`: RUNNING, PENDING, ... or '' (not queued)."""
    return slurm("squeue", "-h", *selector, "-o", "%T").strip()


def wait_idle(timeout: float = 300) -> None:
    """Until the queue is empty and every node is idle (not completing). Other people's jobs are
    waited for, never cancelled."""
    deadline = time.monotonic() + timeout
    while slurm("squeue", "-h", "-o", "%i").split() or set(slurm("sinfo", "-h", "-N", "-o", "%T").split()) != {"idle"}:
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster not idle after {timeout:.0f} s:\n{slurm('squeue')}{slurm('sinfo')}")
        time.sleep(0.2)


def queued(plane: Plane) -> tuple[list[str], list[str]]:
    """Slurm ids in the queue: (this benchmark's, everyone else's)."""
    with plane.store.session() as session:
        ours = set(session.scalars(select(Attempt.backend_ref).where(Attempt.backend_ref.is_not(None))))
    ids = slurm("squeue", "-h", "-o", "%i").split()
    return [i for i in ids if i in RAW_IDS or i in ours], [i for i in ids if i not in RAW_IDS and i not in ours]


def cancel_mine(plane: Plane, timeout: float = 300) -> int:
    """scancel (as root) this benchmark's queued jobs and wait until they have left the queue."""
    mine, _ = queued(plane)
    for start in range(0, len(mine), 200):
        slurm("scancel", *mine[start : start + 200])
    deadline = time.monotonic() + timeout
    while left := queued(plane)[0]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} of this benchmark's jobs still queued after {timeout:.0f} s: {left[:10]}")
        time.sleep(0.3)
    return len(mine)


# -- 1. overhead ---------------------------------------------------------------------------
def ours_to_running(plane: Plane) -> tuple[dict[str, float], str]:
    """POST a sleeping cell; seconds until: sbatch returned, squeue RUNNING, phase RUNNING."""
    t0 = time.perf_counter()
    response = plane.submit(USER, source=SLEEPER, name="bench-overhead", resources=CPU_ONLY)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]
    marks: dict[str, float] = {}
    while len(marks) < 3:
        job = plane.http.get(f"/api/jobs/{job_id}", headers=plane.as_(USER)).json()
        running = "squeue_running_s" in marks or state(f"--name={job_id}-a1") == "RUNNING"
        now = time.perf_counter() - t0
        if job["attempts"] and job["attempts"][0]["backend_ref"]:
            marks.setdefault("sbatch_returned_s", now)
        if running:
            marks.setdefault("squeue_running_s", now)
        if job["phase"] == "RUNNING":
            marks.setdefault("phase_running_s", now)
        if job["phase"] in ("SUCCEEDED", "FAILED", "CANCELLED") or now > 120:
            raise RuntimeError(f"cellscale job {job_id} is {job['phase']} after {now:.0f} s: {job['reason']}")
        time.sleep(POLL)
    plane.http.post(f"/api/jobs/{job_id}/cancel", headers=plane.as_(USER))
    wait_idle()
    return marks, job_id


def raw_to_running(template: Path, script: str, jobs_root: Path, n: int) -> dict[str, float]:
    """sbatch the rendered script, pointed at a fresh copy of its job dir; seconds until RUNNING."""
    job_dir = jobs_root / f"raw-{n}"
    (job_dir / "attempts" / "1").mkdir(parents=True)
    for name in ("plan.json", "cell.py"):
        shutil.copy(template / name, job_dir / name)
    path = job_dir / "attempts" / "1" / "job.sbatch"
    path.write_text(script.replace(str(template), str(job_dir)))
    hand_to_owner(USER, job_dir)  # what the driver does before its sbatch
    t0 = time.perf_counter()
    slurm_id = sbatch(path)
    marks = {"sbatch_returned_s": time.perf_counter() - t0}
    while state("-j", slurm_id) != "RUNNING":
        if time.perf_counter() - t0 > 120:
            raise RuntimeError(f"raw job {slurm_id} not RUNNING after 120 s")
        time.sleep(POLL)
    marks["squeue_running_s"] = time.perf_counter() - t0
    slurm("scancel", slurm_id, user=USER)
    wait_idle()
    return marks


def bench_overhead(plane: Plane, reps: int) -> dict:
    _, warm_id = ours_to_running(plane)  # also gives the script the raw path submits
    template = plane.jobs_root / warm_id
    script = (template / "attempts" / "1" / "job.sbatch").read_text()
    raw_to_running(template, script, plane.jobs_root, 0)
    ours, raw = [], []
    for rep in range(reps):
        first_ours = rep % 2 == 0
        for path in ("ours", "raw") if first_ours else ("raw", "ours"):
            time.sleep(random.uniform(0, SCHED_PERIOD))  # a random phase of Slurm's scheduling passes
            if path == "ours":
                ours.append(ours_to_running(plane)[0])
            else:
                raw.append(raw_to_running(template, script, plane.jobs_root, rep + 1))
        print(
            f"  rep {rep + 1}/{reps}: submit -> RUNNING in squeue: ours {ours[-1]['squeue_running_s']:.2f} s, "
            f"raw {raw[-1]['squeue_running_s']:.2f} s"
        )
    for m in ours + raw:
        m["slurm_wait_s"] = m["squeue_running_s"] - m["sbatch_returned_s"]  # sbatch returned -> RUNNING
    med = {k: median([m[k] for m in ours]) for k in ours[0]}
    raw_med = {k: median([m[k] for m in raw]) for k in raw[0]}
    return {
        "reps": reps,
        "script": script,
        "ours": ours,
        "raw": raw,
        "ours_median": med,
        "raw_median": raw_med,
        "ours_mean": {k: sum(m[k] for m in ours) / reps for k in ours[0]},
        "raw_mean": {k: sum(m[k] for m in raw) / reps for k in raw[0]},
        "ratio_ours_raw": {k: ratio(med[k], raw_med[k]) for k in raw_med},
        "added_s": {k: med[k] - raw_med[k] for k in raw_med},
    }


# -- 2. throughput -------------------------------------------------------------------------
def queue_summary() -> dict[str, int]:
    """What the queue holds: {"PENDING Resources": 300, "RUNNING None": 128, ...}."""
    return dict(Counter(slurm("squeue", "-h", "-o", "%T %r").splitlines()))


def cpu_times() -> tuple[int, int]:
    """(all, idle) jiffies of the whole machine, from /proc/stat."""
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def busy_since(start: tuple[int, int]) -> float:
    """Fraction of the machine's CPU time that was busy since `start` (cpu_times())."""
    total, idle = (now - then for now, then in zip(cpu_times(), start, strict=True))
    return 1 - idle / total if total else float("nan")


def raw_flood(plane: Plane, submits: int, script: Path) -> dict:
    wait_idle()
    cpu, t0 = cpu_times(), time.perf_counter()
    for _ in range(submits):
        sbatch(script)
    wall = time.perf_counter() - t0
    return {
        "submits": submits,
        "wall_s": wall,
        "per_s": submits / wall,
        "cpu_busy": busy_since(cpu),
        "queue_after": queue_summary(),
        "cancelled_after": cancel_mine(plane),
    }


def ours_flood(plane: Plane, submits: int) -> dict:
    def counts() -> tuple[int, int]:
        with plane.store.session() as session:
            refs = session.scalar(select(func.count()).select_from(Attempt).where(Attempt.backend_ref.is_not(None)))
            failed = session.scalar(
                select(func.count())
                .select_from(Attempt)
                .where(Attempt.state == "FAILED", Attempt.backend_ref.is_(None))
            )
        return refs, failed

    wait_idle()
    driver = plane.drivers["slurm"]
    submit_s, poll_s = timing(driver, "submit"), timing(driver, "poll")  # where the controller's time goes
    before = counts()
    cpu, t0 = cpu_times(), time.perf_counter()
    for i in range(submits):
        response = plane.submit(USER, source="pass", name=f"bench-{i}", resources=CPU_ONLY)
        assert response.status_code == 201, response.text
    accepted = time.perf_counter() - t0
    last, last_change, stalled = before, time.perf_counter(), False
    while True:  # until every attempt has its Slurm id or failed to submit, or 60 s without progress
        now = counts()
        refs, failed = now[0] - before[0], now[1] - before[1]
        if refs + failed >= submits:
            break
        if now != last:
            last, last_change = now, time.perf_counter()
        elif time.perf_counter() - last_change > 60:
            print(f"  stalled: {refs} submitted, {failed} failed of {submits}")
            stalled = True
            break
        time.sleep(POLL)
    wall = (last_change if stalled else time.perf_counter()) - t0
    queue_after, busy = queue_summary(), busy_since(cpu)
    plane.controller.stop()  # nothing may submit while everything is cancelled
    with plane.store.session() as session:
        reasons = Counter(
            session.scalars(select(Attempt.end_reason).where(Attempt.state == "FAILED", Attempt.backend_ref.is_(None)))
        )
    return {
        "submits": submits,
        "api_wall_s": accepted,
        "api_per_s": submits / accepted,
        "wall_s": wall,
        "per_s": refs / wall,
        "submitted_to_slurm": refs,
        "submit_failed": failed,
        "submit_failed_reasons": dict(reasons.most_common(3)),
        "queue_after": queue_after,
        "driver_submit": {"calls": len(submit_s), "total_s": sum(submit_s), "median_s": median(submit_s)},
        "driver_poll": {"calls": len(poll_s), "total_s": sum(poll_s), "median_s": median(poll_s)},
        "cpu_busy": busy,
        "cancelled_after": cancel_mine(plane),
    }


def bench_throughput(plane: Plane, submits: int) -> dict:
    script = plane.jobs_root / "trivial.sbatch"  # alice must read it
    script.write_text(TRIVIAL)
    script.chmod(0o644)
    for _ in range(3):  # warm-up (sbatch, runuser, slurmctld's caches)
        sbatch(script)
    cancel_mine(plane)
    print(f"  raw sbatch x {submits} ...")
    raw = raw_flood(plane, submits, script)
    print(f"  cellscale POST /api/jobs x {submits} ...")
    ours = ours_flood(plane, submits)
    return {"raw": raw, "ours": ours, "ratio_ours_raw": ratio(ours["per_s"], raw["per_s"])}


# -- the cluster ---------------------------------------------------------------------------
def command_costs(n: int = 5) -> dict[str, float]:
    """Median seconds of the Slurm commands one cellscale submit runs (Driver.submit: _find's
    squeue and sacct by job name, then sbatch as the user)."""

    def timed(*argv: str) -> float:
        runs = []
        for _ in range(n):
            t0 = time.perf_counter()
            slurm(*argv)
            runs.append(time.perf_counter() - t0)
        return median(runs)

    name = "--name=bench-none-a1"
    return {
        "squeue_by_name_s": timed("squeue", "-h", name, "-o", "%i"),
        "sacct_by_name_7d_s": timed("sacct", "-n", "-X", "-P", name, "-o", "JobID", "-S", "now-7days"),
        "runuser_true_s": timed("runuser", "-u", USER, "--", "true"),
    }


def cluster_facts() -> dict:
    config = {
        key.strip(): value.strip()
        for key, _, value in (line.partition(" = ") for line in slurm("scontrol", "show", "config").splitlines())
    }
    limits = slurm("sacctmgr", "-n", "-P", "show", "assoc", f"user={USER}", "format=account,user,maxjobs,maxsubmit")
    return {
        "MaxJobCount": config.get("MaxJobCount"),
        "SchedulerParameters": config.get("SchedulerParameters"),
        f"assoc_{USER}(account|user|maxjobs|maxsubmit)": limits.strip(),
        "sacct_jobs_last_7_days": len(slurm("sacct", "-n", "-X", "-a", "-S", "now-7days", "-o", "JobID").split()),
    }


def clean_up(plane: Plane, tmp: Path) -> list[str]:
    """Stop the controller, cancel this benchmark's jobs, remove its files, each step even if one
    before it failed. Returns the Slurm ids of other people's queued jobs."""
    others: list[str] = []
    steps = (
        plane.controller.stop,
        lambda: cancel_mine(plane),
        lambda: others.extend(queued(plane)[1]),
        plane.store.dispose,
        lambda: shutil.rmtree(plane.jobs_root),
        lambda: shutil.rmtree(tmp),
    )
    for step in steps:
        try:
            step()
        except Exception as exc:
            print(f"[bench] cleanup: {type(exc).__name__}: {exc}", file=sys.stderr)
    return others


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 reps and 100 submits instead of 10 and 500")
    parser.add_argument("--reps", type=int)
    parser.add_argument("--submits", type=int)
    args = parser.parse_args()
    reps = args.reps or (3 if args.quick else 10)
    submits = args.submits or (100 if args.quick else 500)
    logging.basicConfig(level=logging.WARNING)

    cluster = dev_slurm.up(dev_slurm.DEFAULT_STATE_DIR, log=lambda line: print(f"[slurm up] {line}"))
    ENV.update(proc.job_environment(cluster.env))
    tmp = Path(tempfile.mkdtemp(prefix="cellscale-bench-slurm-"))
    jobs_root = Path(tempfile.mkdtemp(prefix="bench-", dir=cluster.jobs_dir))
    jobs_root.chmod(0o711)  # alice reaches her own job dirs, nothing else
    store = Store(f"sqlite:///{tmp / 'cellscale.sqlite'}")
    store.migrate()
    driver = SlurmDriver(name="slurm", slurm_conf=cluster.env["SLURM_CONF"], master_addr="127.0.0.1")
    plane = Plane(tmp, store, drivers={"slurm": driver}, tenancy=TENANCY, jobs_root=jobs_root)
    try:
        wait_idle()  # someone else's jobs: wait for them, never cancel them
        facts = cluster_facts()
        costs = command_costs()
        plane.controller.start()
        print(f"overhead: {reps} reps, 1 node, CPU-only, plain; submit -> RUNNING in squeue")
        overhead = bench_overhead(plane, reps)
        print(f"throughput: {submits} submits each, one thread")
        throughput = bench_throughput(plane, submits)
    finally:
        others = clean_up(plane, tmp)
        if "slurmctld" in cluster.started and others:
            print(f"[bench] leaving the cluster running: other jobs are queued ({others[:10]})", file=sys.stderr)
        elif "slurmctld" in cluster.started:
            dev_slurm.down(cluster.state_dir, log=lambda line: print(f"[slurm down] {line}"))

    om, rm = overhead["ours_median"], overhead["raw_median"]
    print(f"\noverhead (medians of {reps}; squeue polled every {POLL} s)")
    print_table(
        ["submit ->", "cellscale", "raw sbatch", "ours/raw", "added"],
        [
            [
                "sbatch returned",
                om["sbatch_returned_s"],
                rm["sbatch_returned_s"],
                overhead["ratio_ours_raw"]["sbatch_returned_s"],
                overhead["added_s"]["sbatch_returned_s"],
            ],
            [
                "RUNNING in squeue",
                om["squeue_running_s"],
                rm["squeue_running_s"],
                overhead["ratio_ours_raw"]["squeue_running_s"],
                overhead["added_s"]["squeue_running_s"],
            ],
            [
                "  (sbatch returned -> RUNNING)",
                om["slurm_wait_s"],
                rm["slurm_wait_s"],
                overhead["ratio_ours_raw"]["slurm_wait_s"],
                overhead["added_s"]["slurm_wait_s"],
            ],
            [
                "RUNNING in squeue, mean",
                overhead["ours_mean"]["squeue_running_s"],
                overhead["raw_mean"]["squeue_running_s"],
                ratio(overhead["ours_mean"]["squeue_running_s"], overhead["raw_mean"]["squeue_running_s"]),
                "",
            ],
            ["phase RUNNING (rank started)", om["phase_running_s"], "", "", ""],
        ],
    )
    ours, raw = throughput["ours"], throughput["raw"]
    print(f"\nthroughput ({submits} submits, one thread; the jobs run meanwhile)")
    print_table(
        ["metric", "cellscale", "raw sbatch", "ours/raw"],
        [
            ["submitted to Slurm /s", ours["per_s"], raw["per_s"], throughput["ratio_ours_raw"]],
            ["accepted by the API /s", ours["api_per_s"], "", ""],
            ["wall s", ours["wall_s"], raw["wall_s"], ratio(ours["wall_s"], raw["wall_s"])],
            ["submit failed", ours["submit_failed"], 0, ""],
            ["machine CPU busy during flood", ours["cpu_busy"], raw["cpu_busy"], ""],
        ],
    )
    sub, poll = ours["driver_submit"], ours["driver_poll"]
    print(
        f"controller during its flood: {sub['calls']} Driver.submit, {sub['total_s']:.1f} s in all "
        f"(median {sub['median_s']:.3f} s); {poll['calls']} Driver.poll, {poll['total_s']:.1f} s in all"
    )
    print(f"queue after the floods: raw {raw['queue_after']}, cellscale {ours['queue_after']}")
    print(f"Slurm commands (median s): {costs}")
    write_results(
        "slurm", args.quick, {"cluster": facts, "command_costs": costs, "overhead": overhead, "throughput": throughput}
    )


if __name__ == "__main__":
    main()
