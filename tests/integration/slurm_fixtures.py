"""`slurm_cluster`: the real multi-site Slurm topology for the whole test session: cluster dca
(4 emulated nodes x 8 emulated GPUs, 2 CPU nodes, and the burst partition's CLOUD nodes
c1-c4), cluster dcb (2 x 8 GPUs), one slurmdbd, desks desk-a and desk-b in both, and the
cloud simulation behind the burst partition. CI shares this ONE set of clusters across all
integration tests.

It runs `python -m cellscale_hub.dev.slurm up --sites` once (installing the Debian packages the first
time) and yields a `SlurmCluster`: `.env` is what a client adds to its environment
({"SLURM_CONF": dca's conf}), `.state_dir` the cluster's folder, `.jobs_dir` a folder every
researcher may write job output to, `.sites.dcb_env` dcb's SLURM_CONF, `.cloud` a client of
the cloud simulation (mode, reclaim, ledger). A cluster this session started is stopped at its end; one that was
already running (a developer's) is left running. CELLSCALE_SLURM_STATE_DIR picks the state dir
(default /tmp/cellscale-slurm); CELLSCALE_SLURM_KEEP=1 leaves the cluster running.

Import it from a conftest: `from tests.integration.slurm_fixtures import slurm_cluster  # noqa: F401`
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from cellscale_hub.dev import cloud as dev_cloud
from cellscale_hub.dev import slurm as dev_slurm

TERMINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
}


def settled(record: dict) -> bool:
    if record.get("state", {}).get("current") not in TERMINAL_STATES:
        return False
    ran = bool(record.get("steps"))
    return not ran or record.get("allocation_nodes", 0) > 0


@dataclass(frozen=True)
class Sites:
    """The second site and the burst partition of the topology."""

    dcb_env: dict[str, str]  # {"SLURM_CONF": dcb's conf}
    clusters: tuple[str, ...] = (dev_slurm.CLUSTER, dev_slurm.DCB_CLUSTER)
    burst_partition: str = dev_slurm.BURST_PARTITION
    cloud_nodes: tuple[str, ...] = dev_slurm.CLOUD_NODES
    dcb_nodes: tuple[str, ...] = dev_slurm.DCB_NODES


@dataclass(frozen=True)
class SlurmCluster:
    state_dir: Path
    env: dict[str, str]  # {"SLURM_CONF": dca's conf}
    jobs_dir: Path
    sites: Sites | None = None

    @property
    def cloud(self) -> dev_cloud.CloudClient:
        return dev_cloud.CloudClient(self.state_dir)

    def client_env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
        return {**env, **self.env}

    def run(
        self, argv: Sequence[str], *, user: str | None = None, timeout: float = 60, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client, as root or (`user=`) as that researcher through runuser."""
        full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
        result = subprocess.run(
            full, capture_output=True, text=True, timeout=timeout, env=self.client_env(), cwd=self.jobs_dir, check=False
        )
        if check and result.returncode != 0:
            raise AssertionError(f"{full} exited {result.returncode}: {result.stderr or result.stdout}")
        return result

    def sbatch(self, *args: str, user: str | None = None) -> int:
        """Submit a batch job whose output goes to jobs_dir/<id>.out; returns its id."""
        argv = ["sbatch", "--parsable", f"--chdir={self.jobs_dir}", f"--output={self.jobs_dir}/%j.out", *args]
        return int(self.run(argv, user=user).stdout.strip().split(";")[0])

    def sacct(self, job_id: int) -> dict:
        jobs = json.loads(self.run(["sacct", "-j", str(job_id), "--json"]).stdout)["jobs"]
        return jobs[0] if jobs else {}

    def state(self, job_id: int) -> str:
        return self.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False).stdout.strip()

    def wait_reason(self, job_id: int, timeout: float = 30) -> str:
        """The reason a pending job waits, once the scheduler has given one (not "None")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            reason = self.run(["squeue", "-h", "-j", str(job_id), "-o", "%r"], check=False).stdout.strip()
            if reason and reason != "None":
                return reason
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} got no pending reason within {timeout} s")

    def wait_state(self, job_id: int, wanted: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.state(job_id) != wanted:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} not {wanted} within {timeout} s (is {self.state(job_id)!r})")
            time.sleep(0.2)

    def wait_done(self, job_id: int, timeout: float = 60) -> dict:
        """Wait until the job has ended and its accounting record settled; return the record.

        slurmdbd writes asynchronously: for a moment after the end, sacct can show COMPLETED
        with allocation_nodes 0 and only the first node (the start record lands after the end
        record). Settled = terminal, nodes known if it ran, and the same on two reads."""
        deadline = time.monotonic() + timeout
        previous: dict | None = None
        while time.monotonic() < deadline:
            record = self.sacct(job_id) if not self.state(job_id) else {}
            if settled(record) and record == previous:
                return record
            previous = record
            time.sleep(0.2)
        raise TimeoutError(f"job {job_id} did not finish within {timeout} s")

    def output(self, job_id: int) -> str:
        return (self.jobs_dir / f"{job_id}.out").read_text()

    def cancel(self, *job_ids: int) -> None:
        if job_ids:
            self.run(["scancel", *map(str, job_ids)], check=False)

    def node_states(self, cloud: bool = False) -> dict[str, dict]:
        """dca's nodes as sinfo --json describes them; the burst partition's CLOUD nodes only
        with `cloud` (they are powered down, `idle~`, between bursts)."""
        nodes = json.loads(self.run(["sinfo", "--json"]).stdout)["nodes"]
        return {n["name"]: n for n in nodes if cloud or "CLOUD" not in n.get("state_flags", [])}

    def wait_idle(self, timeout: float = 60) -> dict[str, dict]:
        """Until no job holds a static node (jobs of earlier tests may still be completing)."""
        deadline = time.monotonic() + timeout
        while True:
            nodes = self.node_states()
            if all(node["state"] == "idle" for node in nodes.values()) or time.monotonic() > deadline:
                return nodes
            time.sleep(0.3)


@pytest.fixture(scope="session")
def slurm_cluster():
    if os.geteuid() != 0 or not shutil.which("dpkg-query"):
        pytest.skip("the Slurm dev cluster needs root on a Debian machine (it installs packages and adds users)")
    state_dir = Path(os.environ.get("CELLSCALE_SLURM_STATE_DIR", dev_slurm.DEFAULT_STATE_DIR))
    try:
        cluster = dev_slurm.up(state_dir, log=lambda line: print(f"[slurm up] {line}"), sites=True)
    except dev_slurm.ClusterError as exc:
        pytest.fail(f"the Slurm dev cluster did not start: {exc}")
    print(f"[slurm up] {'started' if cluster.started else 'already running'} in {cluster.seconds:.1f} s")
    yield SlurmCluster(
        state_dir=cluster.state_dir, env=cluster.env, jobs_dir=cluster.jobs_dir, sites=Sites(dcb_env=cluster.dcb_env)
    )
    if "slurmctld" in cluster.started and os.environ.get("CELLSCALE_SLURM_KEEP") != "1":
        dev_slurm.down(state_dir, log=lambda line: print(f"[slurm down] {line}"))
