"""Recovery after a fault on the Slurm dev cluster: how long until a 2-node training job is back
where it was, with cellscale's checkpoints against restarting from scratch.

The job is a deterministic toy training loop (tests/controlplane/test_faults.py's TRAIN, with
a realistic state): torchrun on 2 nodes x 1 GPU (`resources={"nodes": 2, "gpus_per_node": 1}`),
gloo process group, 8 float32 tensors of 20 MB (160 MB, replicated on both ranks), 40 steps of
~0.3 s, `Checkpointer.maybe_save(step, state, every=10)` (async saves, keep=2). Rank 0 appends
one JSON line per event to a progress file next to the checkpoints: `load_begin` (torch
imported, process group up), `loaded` (after `Checkpointer.load`), and each `step` done.

Two fault types, injected when rank 0 has finished step 25 (half-way between checkpoints 20
and 30, the mean loss of a fault at a random time):
- node_down: `scontrol update nodename=X state=down` of the job's second node, as
  tests/integration/test_slurm_backend.py does; the node is resumed once the trial is over.
- rank_kill: SIGKILL of the process that runs rank 1's cell (the one its rank process forks).
Each in two modes: *checkpoint* (every=10) and *scratch*, the same job with checkpointing
disabled (every=0: it only reports its step), so its retry starts again at step 0. Every trial
must end SUCCEEDED with the result of an uninterrupted run. N reps (3, --quick 1) of every
fault type in both modes, the mode that goes first alternating; medians are reported.

Phases, each a timestamp (same host clock everywhere), measured from the fault:
- slurm_ended: slurmctld.log's `Killing JobId=A1 on failed node` or `_job_complete: JobId=A1`
- slurm_released: the first attempt's job no longer RUNNING or COMPLETING in squeue (polled
  every 0.1 s): Slurm has torn it down on every node
- detected: the first attempt's `ended_at` (the controller's poll: squeue, then sacct)
- readmitted: the ADMITTED event of attempt 2 (the `Retrying` requeue and admission)
- submitted: attempt 2's `submitted_at` (its job dir written and `sbatch` returned)
- slurm_started: slurmctld.log's `sched: Allocate JobId=A2` or backfill `Started JobId=A2`
- running: attempt 2's `started_at` (every rank has started; seen by the controller's poll)
- cell_started: attempt 2's `load_begin` line (Python, torch and the process group are up)
- loaded: attempt 2's `attempts/2/resume.json` "at" (written right after Checkpointer.load);
  in scratch mode, where nothing is loaded, its `loaded` line
- first_step: attempt 2's first `step` line
- back: attempt 2's first `step` line at or past the last step attempt 1 finished

The control plane runs in this process against the dev cluster, as benchmarks/slurm.py does
(tests/controlplane/conftest.py's Plane, SQLite, its real controller thread polling every 0.5 s,
a SlurmDriver submitting as alice). The cluster is started if it is not running and is left
running. Each trial starts on an idle cluster (other people's jobs are waited for, never
cancelled), and only a node running nothing but this trial's job is ever set down; a node this
script set down is resumed in any case, also one left down by an earlier run that was killed
(recognised by its reason). Must run as root (runuser, scontrol, reading the ranks' /proc).

    .venv/bin/python benchmarks/recovery.py [--quick] [--reps N] [--faults node_down,rank_kill]
                                            # ~10 min (--quick ~3.5 min), as root
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import cloudpickle
from _common import REPO, median, print_table, ratio, write_results
from sqlalchemy import select

sys.path.insert(0, str(REPO))  # for the test suite's in-process Plane
from cellscale.runtime.jobdir import JobDir  # noqa: E402
from cellscale_hub import proc  # noqa: E402
from cellscale_hub.dev import slurm as dev_slurm  # noqa: E402
from cellscale_hub.drivers.slurm import SlurmDriver  # noqa: E402
from cellscale_hub.store import Store  # noqa: E402
from cellscale_hub.store.models import Attempt  # noqa: E402
from cellscale_hub.tenancy import Tenancy  # noqa: E402
from tests.controlplane.conftest import Plane  # noqa: E402

USER = "alice"  # account desk-a
TENANCY = Tenancy.single("desk-a", {"slurm": 32})
GANG = {"nodes": 2, "gpus_per_node": 1}
FAULTS = ("node_down", "rank_kill")
MODES = ("checkpoint", "scratch")
REASON = "cellscale-bench-recovery"  # the reason this script gives a node it sets down
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
POLL = 0.1

STEPS, EVERY, FAULT_STEP, STEP_S = 40, 10, 25, 0.25
TENSORS, ELEMENTS = 8, 5_000_000  # 8 x 20 MB of float32
STATE_MB = TENSORS * ELEMENTS * 4 / 1e6
EXPECTED = float(TENSORS * ELEMENTS * STEPS * (STEPS + 1) // 2)  # every element += step, 1..STEPS

TRAIN = f"""
import json, os, time, torch
import torch.distributed as dist
from cellscale.checkpoint import Checkpointer
from cellscale.runtime import JobEnvironment
env = JobEnvironment.current()
if env.world_size > 1:
    dist.init_process_group("gloo")
rank = dist.get_rank() if env.world_size > 1 else 0

def mark(event, **fields):
    if rank == 0:
        with open(os.environ["PROGRESS"], "a") as progress:
            progress.write(json.dumps({{"attempt": env.attempt, "event": event, "at": time.time(), **fields}}) + "\\n")

ckpt = Checkpointer(os.environ["CKPT_URL"], keep=2)
state = {{f"w{{i}}": torch.zeros({ELEMENTS}) for i in range({TENSORS})}}
state["step"] = torch.tensor(0)
mark("load_begin")
ckpt.load(state)
mark("loaded", step=int(state["step"]))
for step in range(int(state["step"]) + 1, {STEPS} + 1):
    for i in range({TENSORS}):
        state[f"w{{i}}"] += step
    state["step"] = torch.tensor(step)
    time.sleep(float(os.environ["STEP_S"]))
    ckpt.maybe_save(step, state, every=int(os.environ["CKPT_EVERY"]))
    mark("step", step=step)
ckpt.wait()
total = float(sum(state[f"w{{i}}"].sum(dtype=torch.float64) for i in range({TENSORS})))
"""

PHASES = (
    "slurm_ended",
    "slurm_released",
    "detected",
    "readmitted",
    "submitted",
    "slurm_started",
    "running",
    "cell_started",
    "loaded",
    "first_step",
    "back",
)
# Who the time of each phase (from the previous one) belongs to.
OWNER = {
    "slurm_ended": "Slurm (node_down: scontrol fails the job at once); rank_kill: torchrun exits, srun "
    "--kill-on-bad-exit, batch script ends",
    "slurm_released": "Slurm: tearing the job down on its nodes (SIGTERM, torchrun stops its workers)",
    "detected": "cellscale: next reconcile (every 0.5 s: squeue, then sacct), sacct settling",
    "readmitted": "cellscale: requeue and admission (same cycle)",
    "submitted": "cellscale: job dir, sbatch as the user",
    "slurm_started": "Slurm: next scheduling pass (sched_interval=5, bf_interval=5)",
    "running": "srun step launch, supervisor, torchrun, rank wrappers; cellscale's 0.5 s poll",
    "cell_started": "the job: Python and torch imports, process group",
    "loaded": "the job: Checkpointer.load (sha256 verification, DCP read)",
    "first_step": "the job: one step",
    "back": "the job: redoing the lost steps",
}
ENV: dict[str, str] = {}  # the environment the driver gives Slurm commands (set in main)
DOWNED: set[str] = set()  # nodes this run set down and has not resumed yet
SLURMCTLD_LOG = Path()  # set in main


class Interrupted(Exception):
    pass


def on_sigterm(signum, frame) -> None:
    raise Interrupted("SIGTERM")


def slurm(*argv: str, check: bool = True) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, env=ENV, timeout=60, check=False)
    if check and result.returncode:
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def hostnames(nodelist: str) -> list[str]:
    return slurm("scontrol", "show", "hostnames", nodelist).split() if nodelist else []


def node_states() -> dict[str, tuple[str, str]]:
    """{node: (state, reason)} from sinfo."""
    out = slurm("sinfo", "-h", "-N", "-o", "%N|%T|%E")
    return {name: (state, reason) for name, state, reason in (line.split("|", 2) for line in out.splitlines())}


def resume_node(node: str) -> None:
    slurm("scontrol", "update", f"nodename={node}", "state=resume")
    DOWNED.discard(node)


def resume_our_nodes() -> list[str]:
    """Resume every node this script (this run or a killed earlier one) set down."""
    ours = [n for n, (_, reason) in node_states().items() if reason == REASON] + sorted(DOWNED)
    for node in dict.fromkeys(ours):
        try:
            resume_node(node)
        except RuntimeError as exc:
            print(f"[bench] could not resume {node}: {exc}", file=sys.stderr)
    return ours


def wait_idle(timeout: float = 300) -> int:
    """Until the queue is empty and every node idle; other people's jobs are waited for, never
    cancelled. Returns the seconds waited."""
    t0 = time.monotonic()
    while slurm("squeue", "-h", "-o", "%i").split() or set(state for state, _ in node_states().values()) != {"idle"}:
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"cluster not idle after {timeout:.0f} s:\n{slurm('squeue')}{slurm('sinfo')}")
        time.sleep(0.3)
    return round(time.monotonic() - t0)


def slurmctld_events(job_ids: list[str], since: float) -> dict[str, dict[str, float]]:
    """{job id: {what: unix time}} from slurmctld.log lines (millisecond, local-time stamps)."""
    patterns = {
        "submit": r"_slurm_rpc_submit_batch_job: JobId={id}\b",
        "allocated": r"(?:sched: Allocate JobId={id}\b|_start_job: Started JobId={id}\b)",
        "killed_on_failed_node": r"Killing JobId={id} on failed node",
        "complete": r"_job_complete: JobId={id} done",
    }
    found: dict[str, dict[str, float]] = {job_id: {} for job_id in job_ids}
    for line in SLURMCTLD_LOG.read_text(errors="replace").splitlines():
        match = re.match(r"\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)", line)
        if not match:
            continue
        at = datetime.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()  # local time, like Slurm's
        if at < since - 1:
            continue
        for job_id in job_ids:
            for what, pattern in patterns.items():
                if what not in found[job_id] and re.search(pattern.format(id=job_id), match.group(2)):
                    found[job_id][what] = at
    return found


def ts(value: str | None) -> float | None:
    if value is None:
        return None
    at = datetime.fromisoformat(value)
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def read_jsonl(path: Path) -> list[dict]:
    """The cell's own progress marks, one JSON object per line; a torn last line is skipped."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def last_step(lines: list[dict], attempt: int) -> int:
    return max((e["step"] for e in lines if e["attempt"] == attempt and e["event"] == "step"), default=0)


def rank_processes(job_dir: Path, attempt: int) -> dict[int, int]:
    """{pid: RANK} of the attempt's rank processes and the cell processes they fork (both
    show the `cellscale.runtime.rank` command line)."""
    out = subprocess.run(
        ["pgrep", "-f", f"cellscale.runtime.rank {job_dir} {attempt}$"], capture_output=True, text=True
    ).stdout
    ranks = {}
    for pid in map(int, out.split()):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        rank = next((int(v.split(b"=", 1)[1]) for v in environ if v.startswith(b"RANK=")), None)
        if rank is not None:
            ranks[pid] = rank
    return ranks


def cell_processes(job_dir: Path, attempt: int) -> dict[int, int]:
    """{pid: RANK} of the processes that run the cell: each one's parent is its rank's process."""
    ranks = rank_processes(job_dir, attempt)
    return {pid: rank for pid, rank in ranks.items() if _parent(pid) in ranks}


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def job(plane: Plane, job_id: str) -> dict:
    return plane.http.get(f"/api/jobs/{job_id}", headers=plane.as_(USER)).json()


# -- one trial -----------------------------------------------------------------------------
def trial(plane: Plane, jobs_dir: Path, fault: str, mode: str, label: str) -> dict:
    waited = wait_idle()
    run_dir = Path(tempfile.mkdtemp(prefix="bench-recovery-", dir=jobs_dir))
    run_dir.chmod(0o777)  # the job runs as alice
    progress_path = run_dir / "progress.jsonl"
    env = {
        "CKPT_URL": str(run_dir / "ckpt"),
        "PROGRESS": str(progress_path),
        "STEP_S": str(STEP_S),
        "CKPT_EVERY": str(EVERY if mode == "checkpoint" else 0),
    }
    victim = None
    try:
        response = plane.submit(
            USER,
            source=TRAIN,
            name=f"recovery-{label}",
            launcher="torchrun",
            outputs=["total"],
            resources=GANG,
            env=env,
        )
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        job_dir = plane.jobs_root / job_id

        deadline = time.monotonic() + 240
        while last_step(read_jsonl(progress_path), 1) < FAULT_STEP:
            if time.monotonic() > deadline or job(plane, job_id)["phase"] in TERMINAL:
                raise RuntimeError(f"{job_id} did not reach step {FAULT_STEP}: {job(plane, job_id)}")
            time.sleep(0.05)
        first = job(plane, job_id)["attempts"][0]
        a1 = first["backend_ref"]
        if fault == "node_down":
            nodes = hostnames(slurm("squeue", "-h", "-j", a1, "-o", "%N").strip())
            alone = [n for n in nodes if slurm("squeue", "-h", "-w", n, "-o", "%i").split() == [a1]]
            if not alone:
                raise RuntimeError(f"every node of {a1} ({nodes}) also runs someone else's job: not setting one down")
            victim = nodes[-1] if nodes[-1] in alone else alone[-1]
            DOWNED.add(victim)
            t_fault = time.time()
            slurm("scontrol", "update", f"nodename={victim}", "state=down", f"reason={REASON}")
        else:
            ranks = cell_processes(job_dir, 1)
            pid = next(pid for pid, rank in ranks.items() if rank == 1)
            t_fault = time.time()
            os.kill(pid, signal.SIGKILL)
        step_at_fault_marked = last_step(read_jsonl(progress_path), 1)

        # until attempt 2 is running, squeue every POLL s: when attempt 1 leaves the queue (or
        # its last active state) and when attempt 2 shows RUNNING
        a2 = None
        squeue_running = a1_released = None
        a1_states: dict[str, float] = {}
        a1_alive_when_a2_running = None
        deadline = time.monotonic() + 300
        while True:
            now = job(plane, job_id)
            if len(now["attempts"]) > 1 and now["attempts"][1]["backend_ref"]:
                a2 = now["attempts"][1]["backend_ref"]
            if squeue_running is None:
                queue = dict(line.split() for line in slurm("squeue", "-h", "-o", "%i %T").splitlines())
                at = time.time()
                if a1 in queue:
                    a1_states.setdefault(queue[a1], at - t_fault)
                if a1_released is None and queue.get(a1) not in ("RUNNING", "COMPLETING"):
                    a1_released = at
                if a2 and queue.get(a2) == "RUNNING":
                    squeue_running = at
                    a1_alive_when_a2_running = len(set(rank_processes(job_dir, 1).values()))
            if now["phase"] in TERMINAL:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{job_id} did not finish after the fault: {now['phase']} {now['reason']}")
            time.sleep(POLL if squeue_running is None else 0.3)
        a1_left = set(rank_processes(job_dir, 1).values())  # attempt 1 ranks alive after the job ended: none
        done = now
        events = plane.http.get(f"/api/jobs/{job_id}/events", headers=plane.as_(USER)).json()
        result = (
            cloudpickle.loads(plane.http.get(f"/api/jobs/{job_id}/result", headers=plane.as_(USER)).content)
            if done["result_available"]
            else None
        )
        lines = read_jsonl(progress_path)
        resume_report = JobDir(job_dir).read_resume(2)
        checkpoints = JobDir(job_dir).read_checkpoints(1)
        slurm_log = slurmctld_events([a1] + ([a2] if a2 else []), t_fault - 120)
    finally:
        if victim:
            resume_node(victim)
        shutil.rmtree(run_dir, ignore_errors=True)

    if done["phase"] != "SUCCEEDED" or len(done["attempts"]) != 2 or result != {"total": EXPECTED}:
        raise RuntimeError(
            f"{job_id} ended {done['phase']} with {len(done['attempts'])} attempts and {result} "
            f"(expected {EXPECTED}): {done['reason']}"
        )
    second = done["attempts"][1]
    step_at_fault = last_step(lines, 1)
    a2_lines = [e for e in lines if e["attempt"] == 2]
    a2_steps = [e for e in a2_lines if e["event"] == "step"]
    loaded_line = next(e for e in a2_lines if e["event"] == "loaded")
    resumed_step = loaded_line["step"]
    retrying = next((e for e in events if e["reason"] == "Retrying"), None)
    admitted = next(e for e in events if e["to_phase"] == "ADMITTED" and e["attempt"] == 2)
    marks = {
        "slurm_ended": slurm_log[a1].get("killed_on_failed_node") or slurm_log[a1].get("complete"),
        "slurm_released": a1_released,
        "detected": ts(done["attempts"][0]["ended_at"]),
        "readmitted": ts(admitted["at"]),
        "submitted": ts(second["submitted_at"]),
        "slurm_started": slurm_log.get(a2, {}).get("allocated"),
        "running": ts(second["started_at"]),
        "cell_started": next(e["at"] for e in a2_lines if e["event"] == "load_begin"),
        "loaded": resume_report.at if resume_report else loaded_line["at"],
        "first_step": a2_steps[0]["at"],
        "back": next(e["at"] for e in a2_steps if e["step"] >= step_at_fault),
    }
    since_fault = {k: (v - t_fault if v is not None else None) for k, v in marks.items()}
    record = {
        "fault": fault,
        "mode": mode,
        "job_id": job_id,
        "slurm_ids": [a1, a2],
        "victim": victim,
        "waited_idle_s": waited,
        "step_at_fault": step_at_fault,
        "step_when_injected": step_at_fault_marked,
        "resumed_step": resumed_step,
        "steps_redone": step_at_fault - resumed_step,
        "since_fault_s": since_fault,
        "retrying_event_s": ts(retrying["at"]) - t_fault if retrying else None,
        "squeue_running_s": squeue_running - t_fault if squeue_running else None,
        "slurm_submit_s": slurm_log.get(a2, {}).get("submit", t_fault) - t_fault if a2 else None,
        "first_attempt": {
            k: v
            for k, v in done["attempts"][0].items()
            if k in ("state", "fault", "end_reason", "failed_nodes", "exit_code")
        },
        "excluded_nodes": done["excluded_nodes"],
        "second_attempt_nodes": slurm("sacct", "-n", "-X", "-P", "-j", a2, "-o", "NodeList").strip() if a2 else None,
        "resume_report": resume_report.model_dump() if resume_report else None,
        "checkpoints_committed_before_fault": [
            {
                "step": c.step,
                "write_s": round(c.write_s, 3),
                "committed_s_before_fault": round(t_fault - c.wall_time, 3),
            }
            for c in checkpoints
            if c.wall_time <= t_fault
        ],
        "backend_unknown_events": sum(1 for e in events if e["reason"] == "BackendUnknown"),
        "events": [
            f"{ts(e['at']) - t_fault:+.3f} a{e['attempt']} {e['reason']}: {e['message']}"
            for e in events
            if ts(e["at"]) >= t_fault - 1
        ],
        "first_attempt_squeue_states_s": a1_states,
        "first_attempt_ranks_alive_when_second_running": a1_alive_when_a2_running,
        "first_attempt_ranks_alive_after_job_end": len(a1_left),
    }
    return record


# -- main ----------------------------------------------------------------------------------
def summarize(trials: list[dict]) -> dict:
    out: dict = {}
    for fault in sorted({t["fault"] for t in trials}):
        out[fault] = {}
        for mode in MODES:
            runs = [t for t in trials if t["fault"] == fault and t["mode"] == mode]
            if not runs:
                continue
            cumulative = {
                p: median([r["since_fault_s"][p] for r in runs if r["since_fault_s"][p] is not None]) for p in PHASES
            }
            durations = {}
            for p in PHASES:
                values = []
                for r in runs:
                    s = r["since_fault_s"]
                    prev = next((s[q] for q in reversed(PHASES[: PHASES.index(p)]) if s[q] is not None), 0.0)
                    if s[p] is not None:
                        values.append(s[p] - prev)
                durations[p] = median(values) if values else None
            out[fault][mode] = {
                "reps": len(runs),
                "steps_redone": median([r["steps_redone"] for r in runs]),
                "resumed_step": [r["resumed_step"] for r in runs],
                "step_at_fault": [r["step_at_fault"] for r in runs],
                "median_since_fault_s": cumulative,
                "median_phase_s": durations,
            }
        if "checkpoint" in out[fault] and "scratch" in out[fault]:
            ck, sc = out[fault]["checkpoint"], out[fault]["scratch"]
            out[fault]["ratio_checkpoint_scratch"] = {
                "back_at_fault_step_s": ratio(ck["median_since_fault_s"]["back"], sc["median_since_fault_s"]["back"]),
                "steps_redone": ratio(ck["steps_redone"], sc["steps_redone"]),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 rep instead of 3")
    parser.add_argument("--reps", type=int)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--out", default="recovery", help="results/NAME.json")
    args = parser.parse_args()
    reps = args.reps or (1 if args.quick else 3)
    faults = [f for f in args.faults.split(",") if f]
    modes = [m for m in args.modes.split(",") if m]
    assert set(faults) <= set(FAULTS) and set(modes) <= set(MODES), (faults, modes)
    logging.basicConfig(level=logging.WARNING)
    signal.signal(signal.SIGTERM, on_sigterm)  # so `finally` resumes a node set down

    global SLURMCTLD_LOG
    cluster = dev_slurm.up(dev_slurm.DEFAULT_STATE_DIR, log=lambda line: print(f"[slurm up] {line}"))
    ENV.update(proc.job_environment(cluster.env))
    SLURMCTLD_LOG = cluster.state_dir / "log" / "slurmctld.log"
    if resumed := resume_our_nodes():
        print(f"[bench] resumed {resumed}, left down by an earlier run")
    tmp = Path(tempfile.mkdtemp(prefix="cellscale-bench-recovery-"))
    jobs_root = Path(tempfile.mkdtemp(prefix="bench-", dir=cluster.jobs_dir))
    jobs_root.chmod(0o711)
    store = Store(f"sqlite:///{tmp / 'cellscale.sqlite'}")
    store.migrate()
    driver = SlurmDriver(name="slurm", slurm_conf=cluster.env["SLURM_CONF"], master_addr="127.0.0.1")
    plane = Plane(tmp, store, drivers={"slurm": driver}, tenancy=TENANCY, jobs_root=jobs_root)
    trials: list[dict] = []
    t0 = time.monotonic()
    try:
        plane.controller.start()
        for rep in range(reps):
            for fault in faults:
                order = modes if rep % 2 == 0 else modes[::-1]
                for mode in order:
                    label = f"{fault}-{mode}-{rep + 1}".replace("_", "-")
                    record = trial(plane, cluster.jobs_dir, fault, mode, label)
                    trials.append(record)
                    s = record["since_fault_s"]
                    print(
                        f"  {label}: step {record['step_at_fault']} -> resumed {record['resumed_step']} "
                        f"(redo {record['steps_redone']}); detected {s['detected']:.2f} s, "
                        f"running {s['running']:.2f} s, "
                        f"loaded {s['loaded']:.2f} s, back at step {record['step_at_fault']} {s['back']:.2f} s",
                        flush=True,
                    )
    finally:
        clean_up(plane, tmp, jobs_root)
    wall = time.monotonic() - t0

    summary = summarize(trials)
    for fault, by_mode in summary.items():
        modes_run = [m for m in MODES if m in by_mode]
        print(f"\n{fault}: seconds from the fault to each phase, and each phase's own length (medians of {reps})")
        rows = [
            [
                p,
                *[by_mode[m]["median_since_fault_s"][p] for m in modes_run],
                *[by_mode[m]["median_phase_s"][p] for m in modes_run],
            ]
            for p in PHASES
        ]
        rows.append(["steps redone", *[by_mode[m]["steps_redone"] for m in modes_run], *[""] * len(modes_run)])
        print_table(["phase", *[f"{m} at" for m in modes_run], *[f"{m} phase" for m in modes_run]], rows)
        if "ratio_checkpoint_scratch" in by_mode:
            r = by_mode["ratio_checkpoint_scratch"]
            print(
                f"checkpoint/scratch: back at the fault step {r['back_at_fault_step_s']:.2f}, "
                f"steps redone {r['steps_redone']:.2f}"
            )
    print("\nwhose time each phase is")
    for p in PHASES:
        print(f"  {p:15} {OWNER[p]}")
    print(f"\nwall time {wall:.0f} s for {len(trials)} trials")
    write_results(
        args.out,
        args.quick,
        {
            "config": {
                "steps": STEPS,
                "checkpoint_every": EVERY,
                "fault_step": FAULT_STEP,
                "step_sleep_s": STEP_S,
                "state_mb": STATE_MB,
                "gang": GANG,
                "launcher": "torchrun",
                "reps": reps,
                "controller_interval_s": plane.controller.settings.interval,
                "slurm_sched_interval_s": 5,
            },
            "wall_s": wall,
            "owners": OWNER,
            "summary": summary,
            "trials": trials,
        },
    )


def clean_up(plane: Plane, tmp: Path, jobs_root: Path) -> None:
    """Resume our nodes, stop the controller, cancel this benchmark's queued jobs, remove its
    files; each step even if one before it failed. The cluster stays up."""

    def cancel_ours() -> None:
        with plane.store.session() as session:
            ours = set(session.scalars(select(Attempt.backend_ref).where(Attempt.backend_ref.is_not(None))))
        queued = [i for i in slurm("squeue", "-h", "-o", "%i").split() if i in ours]
        if queued:
            slurm("scancel", *queued)

    for step in (
        resume_our_nodes,
        plane.controller.stop,
        cancel_ours,
        plane.store.dispose,
        lambda: shutil.rmtree(jobs_root),
        lambda: shutil.rmtree(tmp),
    ):
        try:
            step()
        except Exception as exc:
            print(f"[bench] cleanup: {type(exc).__name__}: {exc}", file=sys.stderr)


if __name__ == "__main__":
    main()
