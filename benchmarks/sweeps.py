"""Sweeps (issue 14) on the Slurm dev cluster: cellscale against submitit and Ray Tune, in one run.

1. submit: a grid of 10,000 points (`--points`) from the user's call until every one of them is
   queued, and how many job records slurmctld holds for them while they are pending.
   - cellscale: `cellscale.map(fn, grid, max_parallel=S, backend="slurm")` through the control
     plane's API (it uploads the manifest and POSTs ONE job with spec.sweep), timed until its
     controller has submitted every job array (chunks of the cluster's live MaxArraySize) and
     `squeue` lists each of them; records = lines of `squeue -h -j IDS` (not -r: a pending
     array is one record however many tasks it has), tasks = lines of `squeue -h -r`.
   - submitit: `AutoExecutor(...).map_array(fn, range(10000))` with
     `slurm_array_parallelism=S`: ONE `sbatch --array=0-9999%S`, which Slurm refuses beyond
     MaxArraySize (submitit#1624): the script records the error and how long it took to get it,
     then times the workaround users write, one map_array per chunk of MaxArraySize points
     (each chunk with its own %S: S x chunks may run at once, unlike cellscale's split throttle).
   - Ray Tune: `Tuner(fn, param_space={"x": tune.grid_search(range(10000))}).fit()` in a child
     process on a local Ray (`ray.init(num_cpus=2)`, timed apart), a trivial fn, the default
     settings (reuse_actors aside): seconds from the Tuner call to the first trial running and
     until Tune holds all 10,000 trials (a callback counts them; Tune creates them while it runs
     the first ones), then the experiment is stopped. Ray has no Slurm records: it schedules
     in its own processes.
   Both Slurm paths are measured while the gpu partition is held by a blocker job (root's, one
   exclusive job over its idle nodes), so every task stays pending; at MaxArraySize 1001 and at
   the cluster's own 101. The blocker and every job of this benchmark are cancelled before the
   next step. Two Slurm facts shape this part (both in the results' notes and limits log):
   - Slurm 22.05's `scontrol reconfigure` makes slurmctld SHOW a new MaxArraySize but not use
     it for new arrays (an array of the new size is refused), so `SlurmLimits` restarts dca's
     slurmctld (the dev module's stop and start; jobs survive in its state dir) whenever a
     probe array says the value is not in force, and again to put the cluster back;
   - slurmctld counts every task of a pending array toward MaxJobCount (10000 here, Slurm's
     default) until MinJobAge (300 s) after it ended, so 10,000 pending points cannot be
     queued at once under it by any tool: MaxJobCount is raised to 100,000 while the script
     runs, and put back only once slurmctld has purged this benchmark's job records.
2. makespan: `--tasks` points (1,000; `--quick` 200) of `time.sleep(2)`, each a task of 2
   cores, at most `--slots` (64: the gpu partition's 4 x 32 cores / 2) at once, on an idle
   cluster at MaxArraySize 1001: cellscale with per_task=1, per_task=10 (10 points one after
   another per task: one Python start-up for ten points) and per_task=ceil(points/slots) (every
   task starts in the first wave), submitit map_array with slurm_array_parallelism=64, and
   (not with --quick) cellscale per_task=1 at MaxArraySize 101 (ten arrays, one throttle
   split across them). Timed from the user's call until the tasks have left `squeue` (sampled
   every 0.5 s, which also gives the most tasks running at once and the slots' use) and until
   the user holds every result (`Sweep.wait()`; submitit's `[job.result() for job in jobs]`,
   started right after map_array). Ideal: points / slots x 2 s. Also the machine's CPU busy
   share during each run and its CPU-seconds per task (/proc/stat; the in-process control
   plane included), the CPU bound they imply (tasks x CPU-s per task / cores), and sacct's task
   run time (whole seconds) against the 2 s of sleep.
3. lines: what the user sees for that sweep: cellscale's `Sweep.wait()` (outside a notebook one
   `\\r`-rewritten line; in a notebook it is a progress bar) and the submit announcement, counted
   as '\\n' written to stdout and stderr; submitit's map_array and results(), captured the same
   way; Ray Tune's default reporter for the same number of quick trials (a child process, its
   stdout and stderr counted; not a terminal, as a notebook's output is not).

cellscale's control plane runs in this process as benchmarks/slurm.py runs it: FastAPI's
TestClient with the test suite's table identity (tests/controlplane/conftest.py), SQLite, the
real controller thread and a SlurmDriver submitting as alice (account desk-a); `cellscale.map`
talks to it through a `cellscale.Client` over that TestClient. submitit submits as root, to
Slurm account root (root has an association on the dev cluster), into a folder under the
cluster's jobs dir. The cluster is started if it is not running (and then stopped at the end,
unless someone else's jobs are queued); MaxArraySize and MaxJobCount are put back (101, 10000)
and the desks' account limits the controller mirrors (GrpTRES, Fairshare) are restored even
when a step fails (SIGINT or SIGTERM included); only this benchmark's own jobs are ever
cancelled, others' are waited for before each step. Must run as root. Takes ~25 min
(--quick ~15 min: most of it the purge wait and Ray). The baselines are the `bench` extra:
`.venv/bin/pip install -e ".[bench]"` (submitit, ray[tune]).

    .venv/bin/python benchmarks/sweeps.py [--quick] [--parts submit,makespan,lines]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from _common import PYTHON, REPO, median, print_table, ratio, write_results

sys.path.insert(0, str(REPO))  # for the test suite's in-process Plane

USER, ACCOUNT, PARTITION = "alice", "desk-a", "gpu"
SUBMITIT_ACCOUNT = "root"  # root's own association: submitit submits as the user running it
SLEEP_S = 2.0
POLL = 0.1
SAMPLE_S = 0.5
SIZES = (1001, 101)
DEFAULT_ARRAY_SIZE = 101  # the dev cluster's own (cellscale_hub/dev/slurm_templates/slurm.conf.in)
MAKESPAN_PATHS = (
    "cellscale per_task=1",
    "cellscale per_task=10",
    "cellscale per_task=WAVE",  # ceil(points / slots): every task starts in the first wave
    "submitit",
    "cellscale per_task=1 @101",  # not with --quick
)
RAISED_JOB_COUNT = 100_000  # while measuring 10,000 pending points (see the notes the script writes)
SUBMIT_LIMIT_S = 90.0  # a submit not done by then is recorded as not done
GOAL_SUBMIT_S, GOAL_RECORDS, GOAL_MAKESPAN = 3.0, 10, 1.3  # issue 14
ENV: dict[str, str] = {}  # the environment Slurm commands get (set in main)
MINE: set[str] = set()  # every Slurm (array) job id this benchmark made


# -- the functions each tool runs ------------------------------------------------------------------
def sleep_point(x):
    """One point of the makespan grid (pickled by value: this file is __main__)."""
    import time

    time.sleep(2.0)
    return x


def square(x):
    """One point of the submit grid (never runs: the partition is held)."""
    return x * x


def trial(config):
    """One Ray Tune trial: the same trivial point."""
    return {"y": config["x"] ** 2}


# -- Slurm ---------------------------------------------------------------------------------------
def slurm(*argv: str, user: str | None = None, check: bool = True) -> str:
    full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
    result = subprocess.run(full, capture_output=True, text=True, env=ENV, timeout=120, check=False)
    if check and result.returncode:
        raise RuntimeError(f"{shlex.join(full)} exited {result.returncode}: {result.stderr.strip()}")
    return result.stdout


def squeue_lines(ids: list[str], *extra: str) -> list[str]:
    out: list[str] = []
    for start in range(0, len(ids), 100):
        out += slurm("squeue", "-h", "-j", ",".join(ids[start : start + 100]), *extra, check=False).splitlines()
    return [line for line in out if line.strip()]


def cancel_ids(ids: set[str] | list[str], timeout: float = 180) -> int:
    """scancel (as root) these jobs and wait until they have left the queue."""
    ids = sorted(ids)
    if not ids:
        return 0
    for start in range(0, len(ids), 200):
        slurm("scancel", *ids[start : start + 200], check=False)
    deadline = time.monotonic() + timeout
    while left := squeue_lines(ids, "-o", "%i"):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(left)} of this benchmark's jobs still queued after {timeout:.0f} s")
        time.sleep(0.5)
    return len(ids)


def gpu_nodes() -> dict[str, str]:
    """The gpu partition's nodes and their states."""
    rows = slurm("sinfo", "-h", "-N", "-p", PARTITION, "-o", "%N %T").split("\n")
    return dict(row.split() for row in rows if row.strip())


def wait_idle(timeout: float = 600) -> None:
    """Until the queue is empty and the gpu partition's nodes idle (or down: not ours to fix).
    Other people's jobs are waited for, never cancelled."""
    deadline, said = time.monotonic() + timeout, False
    while True:
        queued = slurm("squeue", "-h", "-o", "%i").split()
        states = set(gpu_nodes().values())
        if not queued and states <= {"idle", "down", "drained", "down*", "drained*"}:
            return
        if not said:
            print(f"  waiting for an idle cluster ({len(queued)} jobs queued, nodes {sorted(states)}) ...", flush=True)
            said = True
        if time.monotonic() > deadline:
            raise TimeoutError(f"cluster not idle after {timeout:.0f} s:\n{slurm('squeue')}")
        time.sleep(1)


class SlurmLimits:
    """MaxArraySize and MaxJobCount in dca's slurm.conf, for the length of the benchmark.

    `scontrol reconfigure` first; Slurm 22.05's slurmctld then SHOWS the new MaxArraySize but
    still refuses arrays past the one it started with, and MaxJobCount needs a restart anyway,
    so when a probe array (held, then cancelled) says the new size is not in force, dca's
    slurmctld is restarted (the dev module's stop and start, under its lock; jobs survive in
    its state dir). `restore` puts the file back as it was found, restarting again when the
    values in force differ, and checks that an array of the old size is taken and one task
    more is not."""

    KEYS = ("MaxArraySize", "MaxJobCount")

    def __init__(self, cluster):
        self.cluster = cluster
        self.conf = Path(cluster.env["SLURM_CONF"])
        self.original = self.conf.read_text()
        self.found = self.live()
        self.restarts = 0
        self.log: list[str] = []

    @classmethod
    def live(cls) -> dict[str, int]:
        config = slurm("scontrol", "show", "config")
        found = {key: re.search(rf"^{key}\s*=\s*(\d+)", config, re.MULTILINE) for key in cls.KEYS}
        return {key: int(match.group(1)) for key, match in found.items() if match}

    @staticmethod
    def min_job_age() -> float:
        match = re.search(r"^MinJobAge\s*=\s*(\d+)", slurm("scontrol", "show", "config"), re.MULTILINE)
        return float(match.group(1)) if match else 300.0

    @staticmethod
    def takes(tasks: int) -> bool:
        """Whether slurmctld takes an array of `tasks` tasks (0..tasks-1; held, then cancelled)."""
        result = subprocess.run(
            ["sbatch", "--parsable", "--hold", f"--account={SUBMITIT_ACCOUNT}", f"--partition={PARTITION}",
             "--time=1", "--output=/dev/null", "--job-name=bench-sweeps-probe", f"--array=0-{tasks - 1}%1",
             "--wrap=true"],
            capture_output=True, text=True, env=ENV, timeout=30, check=False,
        )  # fmt: skip
        if result.returncode:
            return False
        job = result.stdout.strip().split(";")[0]
        MINE.add(job)
        cancel_ids([job])
        return True

    def set(self, **values: int) -> None:
        """set(MaxArraySize=1001, MaxJobCount=100000): the others as found."""
        target = self.found | values
        text = self.original
        for key, value in target.items():
            line = f"{key}={value}"
            text, n = re.subn(rf"^{key}=\d+", line, text, flags=re.MULTILINE)
            if not n and value != self.found.get(key):
                text += f"\n{line}\n"
        if self.conf.read_text() != text:
            self.conf.write_text(text)
        self._apply(target)

    def restore(self) -> None:
        if self.conf.read_text() != self.original:
            self.conf.write_text(self.original)
        self._apply(self.found)

    def _in_force(self, target: dict[str, int]) -> bool:
        size = target["MaxArraySize"]
        return self.live() == target and self.takes(size) and not self.takes(size + 1)

    def _apply(self, target: dict[str, int]) -> None:
        if self.live() != target:
            slurm("scontrol", "reconfigure")
            time.sleep(1)
            self._say(f"scontrol reconfigure: slurmctld shows {self.live()}")
        if self._in_force(target):
            return
        self._say(f"{target} not in force after scontrol reconfigure: restarting dca's slurmctld")
        self._restart()
        if not self._in_force(target):
            raise RuntimeError(f"{target} is not in force even after a restart of slurmctld: {self.live()}")
        self._say(f"{target} in force (slurmctld restarted)")

    def _restart(self) -> None:
        from cellscale_hub.dev import slurm as dev_slurm

        layout = dev_slurm.layout_for(self.cluster.state_dir)
        settings = dev_slurm.load_settings(layout)
        quiet = lambda line: self.log.append(line)  # noqa: E731
        with dev_slurm.exclusive(layout):  # another session's `up` waits instead of starting one too
            dev_slurm.stop("slurmctld", layout, quiet)
            dev_slurm.start_slurmctld(layout, settings, quiet)
        self.restarts += 1
        deadline = time.monotonic() + 90  # until the nodes have registered again
        while any(s.endswith("*") or s.startswith("unk") for s in gpu_nodes().values()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"gpu nodes not back 90 s after restarting slurmctld: {gpu_nodes()}")
            time.sleep(0.5)

    def _say(self, words: str) -> None:
        self.log.append(words)
        print(f"  {words}", flush=True)


def wait_purged(ids: set[str], timeout: float) -> float:
    """Until slurmctld has purged these (ended) jobs' records (MinJobAge after their end): a
    cancelled array still counts its tasks toward MaxJobCount until then. Seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        records = slurm("scontrol", "-o", "show", "jobs", check=False)
        if not set(re.findall(r"^JobId=(\d+)", records, re.MULTILINE)) & ids:
            break
        time.sleep(5)
    return time.monotonic() - t0


def accounts() -> dict[tuple[str, str], str]:
    """The desks' account associations, per cluster (dca and dcb share one slurmdbd):
    "Fairshare|GrpTRES", what the controller mirrors its tenancy onto."""
    out = slurm("sacctmgr", "-n", "-P", "show", "assoc", "format=cluster,account,user,fairshare,grptres")
    found = {}
    for line in out.splitlines():
        cluster, account, user, share, grptres = line.split("|")
        if not user and account.startswith("desk-"):
            found[(cluster, account)] = f"{share}|{grptres}"
    return found


def restore_accounts(saved: dict[tuple[str, str], str]) -> list[str]:
    """Put the desks' Fairshare and GrpTRES back as `saved` had them; returns what changed."""
    changed = []
    for (cluster, account), now in accounts().items():
        before = saved.get((cluster, account))
        if before is None or before == now:
            continue
        share, grptres = before.split("|")
        old = dict(p.split("=", 1) for p in grptres.split(",") if "=" in p)
        new = dict(p.split("=", 1) for p in now.split("|")[1].split(",") if "=" in p)
        grp = ",".join(f"{key}={old.get(key, '-1')}" for key in sorted(set(old) | set(new) | {"cpu", "mem"}))
        slurm("sacctmgr", "-i", "modify", "account", "where", f"name={account}", f"cluster={cluster}", "set",
              f"GrpTRES={grp}", f"Fairshare={share}")  # fmt: skip
        changed.append(f"{cluster} {account}: {now} -> {before}")
    return changed


@contextlib.contextmanager
def blocker():
    """One exclusive job (root's) over the gpu partition's idle nodes, RUNNING while the body
    runs: whatever is submitted meanwhile stays pending."""
    nodes = sorted(n for n, s in gpu_nodes().items() if s == "idle")
    out = slurm(
        "sbatch", "--parsable", f"--account={SUBMITIT_ACCOUNT}", f"--partition={PARTITION}",
        f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}", "--exclusive", "--time=30",
        "--job-name=bench-sweeps-blocker", "--output=/dev/null", "--chdir=/tmp", "--wrap=sleep 1800",
    )  # fmt: skip
    job = out.strip().split(";")[0]
    MINE.add(job)
    try:
        deadline = time.monotonic() + 60
        while slurm("squeue", "-h", "-j", job, "-o", "%T").strip() != "RUNNING":
            if time.monotonic() > deadline:
                raise TimeoutError(f"the blocker {job} did not start in 60 s")
            time.sleep(0.2)
        yield job
    finally:
        cancel_ids([job])


class QueueWatch(threading.Thread):
    """`squeue -h -r` every SAMPLE_S: the tasks whose job name `match`es, pending and running."""

    def __init__(self, match: Callable[[str], bool]):
        super().__init__(name="queue-watch", daemon=True)
        self.match = match
        self.t0 = time.perf_counter()
        self.samples: list[tuple[float, int, int]] = []  # (s since t0, pending, running)
        self.error: str | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                lines = slurm("squeue", "-h", "-r", "-o", "%j|%T").splitlines()
            except Exception as exc:  # noqa: BLE001 - a missed sample, not a failed benchmark
                self.error = f"{type(exc).__name__}: {exc}"
                lines = None
            if lines is not None:
                states = Counter(state for name, _, state in (ln.partition("|") for ln in lines) if self.match(name))
                running = states.get("RUNNING", 0) + states.get("COMPLETING", 0)
                self.samples.append((time.perf_counter() - self.t0, sum(states.values()) - running, running))
            self._halt.wait(SAMPLE_S)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)

    def summary(self, slots: int) -> dict:
        seen = [s for s in self.samples if s[1] or s[2]]
        if not seen:
            return {"samples": len(self.samples), "error": self.error}
        first, last = seen[0][0], seen[-1][0]
        after = next((s[0] for s in self.samples if s[0] > last), None)
        window = [s for s in self.samples if first <= s[0] <= last]
        return {
            "samples": len(self.samples),
            "first_seen_s": first,
            "last_seen_s": last,
            "queue_empty_s": after,  # first sample with none of them queued
            "peak_running": max(s[2] for s in seen),
            "mean_running": sum(s[2] for s in window) / len(window),
            "slot_use": sum(s[2] for s in window) / (len(window) * slots),
            "error": self.error,
        }


def sacct_tasks(ids: list[str]) -> dict:
    """sacct of these arrays' tasks (whole seconds): how long each ran in Slurm, and the span."""
    rows = []
    for start in range(0, len(ids), 50):
        out = slurm(
            "sacct",
            "-n",
            "-X",
            "-P",
            "-j",
            ",".join(ids[start : start + 50]),
            "-o",
            "JobID,State,ElapsedRaw,Start,End",
            check=False,
        )
        rows += [line.split("|") for line in out.splitlines() if line.count("|") == 4]
    done = [r for r in rows if r[1] == "COMPLETED"]
    elapsed = [float(r[2]) for r in done]
    return {
        "tasks": len(rows),
        "states": dict(Counter(r[1].split()[0] for r in rows)),
        "elapsed_mean_s": sum(elapsed) / len(elapsed) if elapsed else None,
        "elapsed_median_s": median(elapsed) if elapsed else None,
        "elapsed_max_s": max(elapsed) if elapsed else None,
    }


def cpu_times() -> tuple[int, int]:
    fields = [int(f) for f in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]


def cpu_since(start: tuple[int, int]) -> tuple[float, float]:
    """(busy share of the machine, busy CPU-seconds) since `start`."""
    total, idle = (now - then for now, then in zip(cpu_times(), start, strict=True))
    busy = total - idle
    return (busy / total if total else float("nan")), busy / os.sysconf("SC_CLK_TCK")


# -- cellscale -----------------------------------------------------------------------------------
@contextlib.contextmanager
def cellscale_plane(cluster):
    """A fresh control plane in this process (its own store: no result cache between runs) and
    a cellscale Client talking to it as alice."""
    from fastapi.testclient import TestClient
    from sqlalchemy import select

    from cellscale.client import Client
    from cellscale_hub.drivers.slurm import SlurmDriver
    from cellscale_hub.store import Store
    from cellscale_hub.store.models import SweepArray
    from cellscale_hub.tenancy import Tenancy
    from tests.controlplane.conftest import Plane

    tmp = Path(tempfile.mkdtemp(prefix="cellscale-bench-sweeps-"))
    jobs_root = Path(tempfile.mkdtemp(prefix="bench-sweeps-", dir=cluster.jobs_dir))
    jobs_root.chmod(0o711)
    store = Store(f"sqlite:///{tmp / 'cellscale.sqlite'}")
    store.migrate()
    driver = SlurmDriver(name="slurm", slurm_conf=cluster.env["SLURM_CONF"], master_addr="127.0.0.1")
    plane = Plane(
        tmp, store, drivers={"slurm": driver}, tenancy=Tenancy.single(ACCOUNT, {"slurm": 32}), jobs_root=jobs_root
    )
    client = Client("http://testserver", USER)
    client._http.close()
    client._http = TestClient(plane.http.app, headers=plane.as_(USER))
    old_home = os.environ.get("CELLSCALE_HOME")
    os.environ["CELLSCALE_HOME"] = str(tmp / "home")  # the result keys cellscale.map saves
    plane.controller.start()

    def arrays(job_id: str) -> list[str]:
        """The sweep's arrays submitted so far (their Slurm ids)."""
        with store.session() as session:
            query = select(SweepArray.backend_ref).where(
                SweepArray.job_id == job_id, SweepArray.backend_ref.is_not(None)
            )
            return list(session.scalars(query))

    def planned(job_id: str) -> int:
        """The sweep's arrays planned so far (an array waits unsubmitted until slots pass to it)."""
        with store.session() as session:
            return len(list(session.scalars(select(SweepArray.id).where(SweepArray.job_id == job_id))))

    plane.arrays, plane.planned = arrays, planned
    try:
        yield plane, client
    finally:
        for step in (
            plane.controller.stop,
            lambda: MINE.update(_all_arrays(store)),
            lambda: cancel_ids(_all_arrays(store)),
            client._http.close,
            store.dispose,
            lambda: shutil.rmtree(jobs_root),
            lambda: shutil.rmtree(tmp),
        ):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - every step runs
                print(f"[bench] cleanup: {type(exc).__name__}: {exc}", file=sys.stderr)
        if old_home is None:
            os.environ.pop("CELLSCALE_HOME", None)
        else:
            os.environ["CELLSCALE_HOME"] = old_home


def _all_arrays(store) -> list[str]:
    from sqlalchemy import select

    from cellscale_hub.store.models import SweepArray

    with store.session() as session:
        return list(session.scalars(select(SweepArray.backend_ref).where(SweepArray.backend_ref.is_not(None))))


def cellscale_submit(cluster, points: int, slots: int, size: int) -> dict:
    import cellscale

    expected = math.ceil(points / size)
    with cellscale_plane(cluster) as (plane, client):
        grid = [{"x": i} for i in range(points)]
        said = io.StringIO()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(said):
            sweep = cellscale.map(square, grid, max_parallel=slots, client=client, backend="slurm", cpus=2, time=10)
        returned = time.perf_counter() - t0
        sweep.close()  # no poller: only the queue matters here
        ids: list[str] = []
        while True:  # every point planned into its arrays, and those the slots reach in squeue
            ids = plane.arrays(sweep.job_id)
            planned = plane.planned(sweep.job_id)
            listed = {line.split()[0] for line in squeue_lines(ids, "-o", "%F")} if ids else set()
            if planned >= expected and ids and len(listed) >= len(ids):
                break
            if time.perf_counter() - t0 > SUBMIT_LIMIT_S:
                MINE.update(ids)
                job = client.get(sweep.job_id)
                client.cancel(sweep.job_id)
                cancel_ids(ids)
                return {
                    "points": points,
                    "max_array_size": size,
                    "error": f"{planned} of {expected} arrays planned, {len(ids)} in squeue after "
                    f"{SUBMIT_LIMIT_S:.0f} s (job {job.phase.value}: {job.reason})",
                }
            time.sleep(POLL)
        queued = time.perf_counter() - t0
        MINE.update(ids)
        records = squeue_lines(ids, "-o", "%i|%T|%r")
        tasks = len(squeue_lines(ids, "-r", "-o", "%i"))
        job = client.get(sweep.job_id)
        client.cancel(sweep.job_id)
        cancel_ids(ids)
    return {
        "points": points,
        "max_array_size": size,
        "map_returned_s": returned,
        "all_arrays_in_squeue_s": queued,
        "arrays": len(ids),
        "arrays_planned": planned,
        "records_pending": len(records),
        "record_states": dict(Counter(r.split("|", 1)[1] for r in records)),
        "tasks_listed_by_squeue_r": tasks,
        "max_parallel": job.spec.sweep.max_parallel if job.spec.sweep else None,
        "announced": said.getvalue().strip(),
    }


def cellscale_makespan(cluster, tasks: int, slots: int, per_task: int) -> dict:
    import cellscale

    with cellscale_plane(cluster) as (plane, client):
        grid = [{"x": i} for i in range(tasks)]
        prefix: list[str] = []
        watch = QueueWatch(lambda name: bool(prefix) and name.startswith(prefix[0]))
        said, progress = io.StringIO(), io.StringIO()
        cpu = cpu_times()
        t0 = watch.t0 = time.perf_counter()
        watch.start()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            sweep = cellscale.map(
                sleep_point,
                grid,
                max_parallel=slots,
                per_task=per_task,
                client=client,
                backend="slurm",
                cpus=2,
                time=10,
            )
        prefix.append(f"{sweep.job_id}-a")
        with contextlib.redirect_stdout(progress), contextlib.redirect_stderr(progress):
            sweep.wait(timeout=1800)
        results_s = time.perf_counter() - t0
        busy, cpu_s = cpu_since(cpu)
        time.sleep(2 * SAMPLE_S)
        watch.stop()
        job = client.get(sweep.job_id)
        ids = plane.arrays(sweep.job_id)
        MINE.update(ids)
        frame = sweep.df
        ok = int((frame["status"] == "done").sum())
        results_ok = sum(1 for i, r in enumerate(sweep.results) if r == {"result": i})
        sweep.close()
        accounting = sacct_tasks(ids)
        point_wall = [float(w) for w in frame["wall_s"].dropna()]
    n_tasks = math.ceil(tasks / per_task)
    return {
        "points": tasks,
        "per_task": per_task,
        "tasks": n_tasks,
        "slots": slots,
        "arrays": len(ids),
        "phase": job.phase.value,
        "points_done": ok,
        "results_correct": results_ok,
        "results_in_hand_s": results_s,
        "queue": watch.summary(slots),
        "cpu_busy": busy,
        "cpu_s_per_task": cpu_s / n_tasks,
        "sacct": accounting,
        "point_wall_median_s": median(point_wall) if point_wall else None,
        "lines_submit": said.getvalue().count("\n"),
        "lines_wait": progress.getvalue().count("\n"),
        "carriage_returns_wait": progress.getvalue().count("\r"),
        "last_line": progress.getvalue().rstrip("\n").split("\r")[-1].strip(),
    }


# -- submitit ------------------------------------------------------------------------------------
def submitit_executor(cluster, folder: Path, slots: int, name: str):
    import submitit

    executor = submitit.AutoExecutor(folder=folder, cluster="slurm")
    executor.update_parameters(
        name=name,
        timeout_min=10,
        nodes=1,
        tasks_per_node=1,
        cpus_per_task=2,
        slurm_partition=PARTITION,
        slurm_account=SUBMITIT_ACCOUNT,
        slurm_array_parallelism=slots,
    )
    return executor


def _array_ids(jobs) -> list[str]:
    return sorted({job.job_id.split("_")[0] for job in jobs})


def submitit_submit(cluster, points: int, slots: int, size: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bench-sweeps-submitit-", dir=cluster.jobs_dir))
    out: dict = {"points": points, "max_array_size": size}
    try:
        executor = submitit_executor(cluster, folder / "one", slots, "bench-sweeps-submitit")
        t0 = time.perf_counter()
        try:
            jobs = executor.map_array(square, range(points))
            ids = _array_ids(jobs)
            MINE.update(ids)
            out["map_array"] = {"ok": True, "s": time.perf_counter() - t0, "arrays": ids}
        except Exception as exc:  # noqa: BLE001 - the failure is the measurement
            words = " ".join(str(exc).split())
            out["map_array"] = {"ok": False, "s": time.perf_counter() - t0, "error": f"{type(exc).__name__}: {words}"}
        if out["map_array"]["ok"]:
            ids = out["map_array"]["arrays"]
            out["map_array"]["records_pending"] = len(squeue_lines(ids, "-o", "%i"))
            cancel_ids(ids)
            return out
        # the workaround: one map_array per chunk of MaxArraySize points
        executor = submitit_executor(cluster, folder / "chunks", slots, "bench-sweeps-submitit")
        t0 = time.perf_counter()
        jobs = []
        for start in range(0, points, size):
            jobs += executor.map_array(square, range(start, min(points, start + size)))
        ids = _array_ids(jobs)
        MINE.update(ids)
        while len({line.split()[0] for line in squeue_lines(ids, "-o", "%F")}) < len(ids):
            time.sleep(POLL)
        queued = time.perf_counter() - t0
        records = squeue_lines(ids, "-o", "%i|%T|%r")
        out["chunked"] = {
            "calls": len(ids),
            "all_arrays_in_squeue_s": queued,
            "records_pending": len(records),
            "record_states": dict(Counter(r.split("|", 1)[1] for r in records)),
            "most_at_once": slots * len(ids),
        }
        cancel_ids(ids)
        return out
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def submitit_makespan(cluster, tasks: int, slots: int) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="bench-sweeps-submitit-", dir=cluster.jobs_dir))
    name = "bench-sweeps-submitit-run"
    try:
        executor = submitit_executor(cluster, folder, slots, name)
        watch = QueueWatch(lambda job_name: job_name == name)
        said = io.StringIO()
        cpu = cpu_times()
        t0 = watch.t0 = time.perf_counter()
        watch.start()
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            try:
                jobs = executor.map_array(sleep_point, range(tasks))
            except Exception as exc:  # noqa: BLE001 - recorded, not faked
                watch.stop()
                return {"points": tasks, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            ids = _array_ids(jobs)
            MINE.update(ids)
            submitted = time.perf_counter() - t0
            results = [job.result() for job in jobs]
        results_s = time.perf_counter() - t0
        busy, cpu_s = cpu_since(cpu)
        time.sleep(2 * SAMPLE_S)
        watch.stop()
        return {
            "points": tasks,
            "tasks": tasks,
            "slots": slots,
            "arrays": len(ids),
            "map_array_s": submitted,
            "results_correct": sum(1 for i, r in enumerate(results) if r == i),
            "results_in_hand_s": results_s,
            "queue": watch.summary(slots),
            "cpu_busy": busy,
            "cpu_s_per_task": cpu_s / tasks,
            "sacct": sacct_tasks(ids),
            "lines": said.getvalue().count("\n"),
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# -- Ray Tune (in a child process: its own stdout and stderr, its own Ray) -------------------------
def ray_child(mode: str, trials: int, out: Path, limit_s: float) -> None:
    """`--ray-child setup|lines`: a local Ray (2 CPUs), then Tuner.fit over `trials` grid points
    of a trivial function; the marks go to `out` (JSON), Ray's output to this process's."""
    marks: dict[str, float | int | str] = {"trials": trials}
    t0 = time.perf_counter()
    import ray
    from ray import tune

    ray.init(num_cpus=2, include_dashboard=False)
    marks["ray_init_s"] = time.perf_counter() - t0
    started = time.perf_counter()

    class Marks(tune.Callback):
        def on_trial_start(self, iteration, trials, trial, **info):
            marks.setdefault("first_trial_running_s", time.perf_counter() - started)

        def on_step_end(self, iteration, trials, **info):
            marks["trials_created"] = len(trials)
            if len(trials) >= marks["trials"] and "all_trials_created_s" not in marks:
                marks["all_trials_created_s"] = time.perf_counter() - started

    class Enough(tune.Stopper):
        def __call__(self, trial_id, result):
            return False

        def stop_all(self):
            if time.perf_counter() - started > limit_s:
                marks["stopped_at_limit_s"] = limit_s
                return True
            return mode == "setup" and "all_trials_created_s" in marks

    storage = Path(tempfile.mkdtemp(prefix="bench-sweeps-ray-"))
    try:
        tuner = tune.Tuner(
            trial,
            param_space={"x": tune.grid_search(list(range(trials)))},
            tune_config=tune.TuneConfig(reuse_actors=True),
            run_config=tune.RunConfig(storage_path=str(storage), callbacks=[Marks()], stop=Enough()),
        )
        grid = tuner.fit()
        marks["fit_s"] = time.perf_counter() - started
        marks["trials_finished"] = sum(1 for r in grid if r.metrics and r.metrics.get("done"))
    finally:
        out.write_text(json.dumps(marks))
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)


def run_ray(mode: str, trials: int, limit_s: float) -> dict:
    marks_path = Path(tempfile.mkstemp(prefix="bench-sweeps-ray-", suffix=".json")[1])
    argv = [
        PYTHON,
        str(Path(__file__).resolve()),
        "--ray-child",
        mode,
        "--ray-trials",
        str(trials),
        "--ray-out",
        str(marks_path),
        "--ray-limit",
        str(limit_s),
    ]
    t0 = time.perf_counter()
    try:
        child = subprocess.run(argv, capture_output=True, text=True, timeout=limit_s + 180, check=False)
        marks = json.loads(marks_path.read_text() or "{}")
    except subprocess.TimeoutExpired:
        return {"trials": trials, "error": f"the Ray child did not end within {limit_s + 180:.0f} s"}
    except (OSError, json.JSONDecodeError) as exc:
        marks = {"error": f"no marks: {exc}"}
    finally:
        marks_path.unlink(missing_ok=True)
    marks |= {
        "wall_s": time.perf_counter() - t0,
        "exit": child.returncode,
        "lines_stdout": child.stdout.count("\n"),
        "lines_stderr": child.stderr.count("\n"),
        "lines": child.stdout.count("\n") + child.stderr.count("\n"),
    }
    if child.returncode:
        marks["stderr_tail"] = child.stderr[-2000:]
    return marks


# -- the run ---------------------------------------------------------------------------------------
def submit_step(cluster, points: int, slots: int, size: int) -> dict:
    print(f"\nsubmit {points} points at MaxArraySize {size}", flush=True)
    with blocker():
        ours = cellscale_submit(cluster, points, slots, size)
        if "error" in ours:
            print(f"  cellscale: {ours['error']}", flush=True)
        else:
            print(
                f"  cellscale: {ours['arrays_planned']} arrays planned, the {ours['arrays']} its slots reach in "
                f"squeue after {ours['all_arrays_in_squeue_s']:.2f} s, {ours['records_pending']} records",
                flush=True,
            )
        theirs = submitit_submit(cluster, points, slots, size)
        one = theirs["map_array"]
        print(f"  submitit map_array: {'ok' if one['ok'] else one['error'][:160]} ({one['s']:.2f} s)", flush=True)
        if "chunked" in theirs:
            c = theirs["chunked"]
            print(
                f"  submitit, {c['calls']} map_array calls: {c['all_arrays_in_squeue_s']:.2f} s, "
                f"{c['records_pending']} records",
                flush=True,
            )
    return {"cellscale": ours, "submitit": theirs}


def makespan_step(cluster, path: str, tasks: int, slots: int) -> dict:
    print(f"\nmakespan: {tasks} points of sleep(2), {slots} slots: {path} ...", flush=True)
    if path == "submitit":
        r = submitit_makespan(cluster, tasks, slots)
    else:
        r = cellscale_makespan(cluster, tasks, slots, int(path.split("per_task=", 1)[1].split()[0]))
    q = r.get("queue", {})
    print(
        f"  results in hand after {r.get('results_in_hand_s', math.nan):.1f} s, tasks left squeue at "
        f"{q.get('queue_empty_s') or math.nan:.1f} s; peak running {q.get('peak_running')}; "
        f"CPU busy {r.get('cpu_busy', math.nan):.2f}",
        flush=True,
    )
    return r


def startup_costs(n: int = 5) -> dict:
    """Median wall seconds of the Python start-up each tool's task pays (no Slurm)."""

    def timed(code: str) -> float:
        runs = []
        for _ in range(n):
            t0 = time.perf_counter()
            subprocess.run([PYTHON, "-c", code], check=True, env=os.environ | ENV)
            runs.append(time.perf_counter() - t0)
        return median(runs)

    return {
        "python_bare_s": timed("pass"),
        "cellscale_task_imports_s": timed("import cellscale.runtime.sweep, cellscale.points, cloudpickle"),
        "submitit_task_imports_s": timed("import submitit.core._submit, cloudpickle"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 sleep tasks and 200 Ray trials instead of 1,000")
    parser.add_argument("--parts", default="submit,makespan,lines")
    parser.add_argument("--points", type=int, default=10_000, help="points of the submit grid")
    parser.add_argument("--tasks", type=int, help="points of the makespan sweep (1000, --quick 200)")
    parser.add_argument("--slots", type=int, default=64, help="max_parallel / slurm_array_parallelism")
    parser.add_argument(
        "--makespan-paths",
        help="default: cellscale per_task=1,cellscale per_task=10,cellscale per_task=WAVE (ceil(points/slots)),"
        "submitit (and, without --quick, cellscale per_task=1 @101: ten arrays at the cluster's own MaxArraySize)",
    )
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="MaxArraySizes for the submit part")
    parser.add_argument("--ray-limit", type=float, help="seconds a Ray Tune child may run (600, --quick 240)")
    parser.add_argument("--ray-child", choices=["setup", "lines"], help=argparse.SUPPRESS)
    parser.add_argument("--ray-trials", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--ray-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    ray_limit = args.ray_limit or (240.0 if args.quick else 600.0)
    if args.ray_child:
        ray_child(args.ray_child, args.ray_trials, args.ray_out, ray_limit)
        return
    tasks = args.tasks or (200 if args.quick else 1000)
    parts = args.parts.split(",")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("traitlets").setLevel(logging.ERROR)  # the test Plane's unused LocalDriver

    from cellscale_hub import proc
    from cellscale_hub.dev import slurm as dev_slurm

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the clean-up below runs on a plain kill too
    cluster = dev_slurm.up(dev_slurm.DEFAULT_STATE_DIR, log=lambda line: print(f"[slurm up] {line}"))
    ENV.update(proc.job_environment(cluster.env))
    os.environ["SLURM_CONF"] = cluster.env["SLURM_CONF"]  # submitit runs sbatch and sacct from this process
    wait_idle()
    limits = SlurmLimits(cluster)
    saved = accounts()
    down = sorted(n for n, s in gpu_nodes().items() if s.startswith(("down", "drain")))
    if down:
        print(f"[bench] gpu nodes not up: {down}; the slots may not all be there", file=sys.stderr)
    data: dict = {
        "settings": {
            "points": args.points,
            "tasks": tasks,
            "slots": args.slots,
            "cpus_per_task": 2,
            "sleep_s": SLEEP_S,
            "partition": PARTITION,
            "nodes_not_up": down,
            "limits_found": limits.found,
        },
        "notes": [],
    }
    # the steps, grouped by the limits they need (each change may restart slurmctld): 101 first
    jobs = limits.found.get("MaxJobCount", 10_000)
    if "submit" in parts:
        data["notes"].append(
            f"MaxJobCount raised from {jobs} to {RAISED_JOB_COUNT} while this ran: slurmctld counts each task of "
            f"a pending array toward MaxJobCount (job_mgr.c: an array's record is created with num_jobs = its task "
            f"count) until MinJobAge after it ended, so {args.points} pending points never fit under {jobs}, "
            f"whatever the tool; at {jobs} cellscale's third array of 1001 was refused ('MaxJobCount limit from "
            f"slurm.conf reached': sbatch retries, and the controller's sbatch timed out after 30 s) in a first try"
        )
        jobs = max(jobs, RAISED_JOB_COUNT)
    steps = []
    if "submit" in parts:
        steps += [("submit", int(size), "") for size in args.sizes.split(",")]
    if "makespan" in parts:
        wave = f"per_task={math.ceil(tasks / args.slots)}"
        chosen = args.makespan_paths or ",".join(MAKESPAN_PATHS[: 4 if args.quick else 5])
        paths = list(dict.fromkeys(chosen.replace("per_task=WAVE", wave).split(",")))
        steps += [("makespan", 101 if path.endswith("@101") else 1001, path) for path in paths]
    steps.sort(key=lambda step: step[1] != 101)
    waited = 0.0
    notes: list[str] = []
    try:
        data["startup"] = startup_costs()
        for kind, size, path in steps:
            wait_idle()  # before any restart of slurmctld, too
            limits.set(MaxArraySize=size, MaxJobCount=jobs)
            if kind == "submit":
                data.setdefault("submit", {})[str(size)] = submit_step(cluster, args.points, args.slots, size)
            else:
                if "makespan" not in data:
                    data["makespan"] = {"ideal_s": tasks / args.slots * SLEEP_S, "points": tasks, "slots": args.slots}
                data["makespan"][path] = makespan_step(cluster, path, tasks, args.slots)
    finally:
        for step in (
            lambda: cancel_ids(MINE),
            lambda: notes.extend(restore_accounts(saved)),
        ):
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - every step runs
                print(f"[bench] cleanup: {type(exc).__name__}: {exc}", file=sys.stderr)
        if limits.live().get("MaxJobCount", 0) > limits.found.get("MaxJobCount", 0):
            # back under the old MaxJobCount only once the cancelled arrays' records are gone
            print("  waiting for slurmctld to purge this benchmark's job records ...", flush=True)
            waited = wait_purged(MINE, timeout=SlurmLimits.min_job_age() + 60)
        try:
            limits.restore()
        except Exception as exc:  # noqa: BLE001 - said loudly: the cluster is not as found
            print(f"[bench] RESTORING {limits.found} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
        data["cluster_after"] = {
            "limits": limits.live(),
            "limits_as_found": limits.live() == limits.found,
            "slurmctld_restarts": limits.restarts,
            "purge_wait_s": waited,
            "limits_log": limits.log,
            "accounts_restored": notes,
        }
        others = slurm("squeue", "-h", "-o", "%i").split()
        if "slurmctld" in cluster.started and not others:
            dev_slurm.down(cluster.state_dir, log=lambda line: print(f"[slurm down] {line}"))
    if "submit" in parts:
        print(f"\nRay Tune: Tuner over {args.points} trials (setup) ...", flush=True)
        data["ray_setup"] = run_ray("setup", args.points, ray_limit)
    if "lines" in parts:
        print(f"Ray Tune: {tasks} quick trials, output lines ...", flush=True)
        data["ray_lines"] = run_ray("lines", tasks, ray_limit)
    data["summary"] = summarize(data)
    report(data)
    write_results("sweeps_quick" if args.quick else "sweeps", args.quick, data)


def summarize(data: dict) -> dict:
    """The issue's goals, met or not, and the ratios the tables print."""
    out: dict = {}
    if "submit" in data:
        for size, both in data["submit"].items():
            ours = both["cellscale"]
            out[f"submit_goal_met_at_{size}"] = (
                "error" not in ours
                and ours["all_arrays_in_squeue_s"] <= GOAL_SUBMIT_S
                and ours["records_pending"] <= GOAL_RECORDS
            )
    if "makespan" in data:
        m = data["makespan"]
        for path, r in m.items():
            if isinstance(r, dict) and "queue" in r and r["queue"].get("queue_empty_s"):
                out[f"makespan_x_ideal[{path}]"] = r["queue"]["queue_empty_s"] / m["ideal_s"]
                out[f"makespan_goal_met[{path}]"] = r["queue"]["queue_empty_s"] <= GOAL_MAKESPAN * m["ideal_s"]
    return out


def report(data: dict) -> None:
    nan = math.nan
    points = data["settings"]["points"]
    if "submit" in data:
        print(f"\n1. submit {points} points: the user's call -> every array in squeue; slurmctld records while pending")
        print(f"   goal: <= {GOAL_SUBMIT_S:g} s and <= {GOAL_RECORDS} records")
        rows = []
        by_size = sorted(data["submit"].items(), key=lambda item: -int(item[0]))
        base = by_size[0][1]["cellscale"].get("all_arrays_in_squeue_s", nan)
        for size, both in by_size:
            ours, theirs = both["cellscale"], both["submitit"]
            one, chunked = theirs["map_array"], theirs.get("chunked")
            if "error" in ours:
                rows.append([f"MaxArraySize {size}: cellscale.map", ours["error"][:60], "", "", ""])
            else:
                secs = ours["all_arrays_in_squeue_s"]
                row = [f"MaxArraySize {size}: cellscale.map", secs, ours["records_pending"], ours["arrays"]]
                rows.append([*row, ratio(secs, base)])
            if one["ok"]:
                rows.append(
                    [f"  submitit map_array({points})", one["s"], one["records_pending"], 1, ratio(one["s"], base)]
                )
            else:
                rows.append([f"  submitit map_array({points})", f"FAILS after {one['s']:.2f} s", 0, 0, ""])
            if chunked:
                secs = chunked["all_arrays_in_squeue_s"]
                rows.append([f"  submitit, {chunked['calls']} map_array calls", secs, chunked["records_pending"],
                             chunked["calls"], ratio(secs, base)])  # fmt: skip
        ray = data.get("ray_setup", {})
        created = ray.get("all_trials_created_s")
        shown = created or f"{ray.get('trials_created', 0)} by {ray.get('stopped_at_limit_s', nan):.0f} s"
        rows.append(
            ["Ray Tune: Tuner -> all trials created", shown, "n/a", "", ratio(created, base) if created else ""]
        )
        rows.append(["  Ray Tune: Tuner -> first trial running", ray.get("first_trial_running_s", nan), "", "", ""])
        rows.append(["  (ray.init before it, not counted)", ray.get("ray_init_s", nan), "", "", ""])
        print_table(["path", "seconds", "records", "arrays", f"x cellscale@{by_size[0][0]}"], rows)
        for size, both in data["submit"].items():
            one = both["submitit"]["map_array"]
            if not one["ok"]:
                print(f"   submitit at {size}: {one['error']}")
    if "makespan" in data:
        m = data["makespan"]
        print(f"\n2. makespan: {m['points']} points of sleep(2), {m['slots']} slots; ideal {m['ideal_s']:.1f} s")
        print(f"   goal: <= {GOAL_MAKESPAN:g} x ideal")
        rows = []
        for path, r in m.items():
            if not isinstance(r, dict):
                continue
            if "error" in r:
                rows.append([path, r["error"][:60], "", "", "", "", "", "", "", ""])
                continue
            q, acct = r["queue"], r["sacct"]
            empty = q.get("queue_empty_s") or nan
            bound = r["tasks"] * r["cpu_s_per_task"] / (os.cpu_count() or 1)
            rows.append([path, empty, ratio(empty, m["ideal_s"]), r["results_in_hand_s"], q.get("peak_running"),
                         q.get("slot_use", nan), acct.get("elapsed_mean_s") or nan, r["cpu_busy"],
                         r["cpu_s_per_task"], bound])  # fmt: skip
        print_table(["path", "tasks done s", "x ideal", "results s", "peak run", "slot use", "s/task in Slurm",
                     "CPU busy", "CPU-s/task", "CPU bound s"], rows)  # fmt: skip
        print(f"   CPU bound: tasks x CPU-s per task / {os.cpu_count()} cores (the machine's CPU during the run)")
        print(f"   Python start-up of a task, no Slurm (median wall s): {data['startup']}")
    m = data.get("makespan", {})
    ours, theirs, ray = m.get("cellscale per_task=1", {}), m.get("submitit", {}), data.get("ray_lines", {})
    if ours or theirs or ray:
        print(f"\n3. output lines for one sweep of {data['settings']['tasks']} points")
        rewrites = f"rewritten {ours.get('carriage_returns_wait')} times"
        trials = f"{ray.get('trials_finished')} trials, exit {ray.get('exit')}"
        rows = [
            ["cellscale Sweep.wait()", ours.get("lines_wait", ""), rewrites],
            ["  + cellscale.map's submit line", ours.get("lines_submit", ""), ""],
            ["submitit map_array + result()s", theirs.get("lines", ""), ""],
            ["Ray Tune default reporter", ray.get("lines", ""), trials],
        ]
        print_table(["path", "lines", "note"], rows)
    for key, value in data.get("summary", {}).items():
        print(f"   {key}: {value if isinstance(value, bool) else f'{value:.2f}'}")


if __name__ == "__main__":
    main()
