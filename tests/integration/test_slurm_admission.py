"""Two desks contend on the real Slurm dev cluster (4 nodes × 8 GPUs; desk-a and desk-b each
have a nominal 16 and may borrow the rest), and cellscale's quotas are mirrored into
Slurm's own accounts so the two schedulers agree."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import cloudpickle
import pytest

from cellscale.spec import Phase
from tests.controlplane.test_admission import TRAIN
from tests.integration.test_slurm_backend import TERMINAL, logs, slurm_plane  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

STEPS = 60  # total = 1 + ... + 60 = 1830 on an uninterrupted run


def assoc(cluster, account: str) -> tuple[str, str]:
    """(GrpTRES, Fairshare) of the account's own association."""
    out = subprocess.run(
        ["sacctmgr", "-n", "-P", "show", "assoc", "cluster=dca", f"account={account}", "format=user,grptres,fairshare"],
        env=cluster.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    row = next(line.split("|") for line in out.splitlines() if line.startswith("|"))
    return row[1], row[2]


def set_borrowing(plane, cluster_queue: str, limit):
    def edit(doc):
        quota = doc["cluster_queues"][cluster_queue]["quotas"]["slurm"]
        before, quota["borrowing_limit"] = quota["borrowing_limit"], limit
        return before, limit

    plane.tenancy.change("test", "set-quota", f"cluster_queues/{cluster_queue}/quotas/slurm", edit)
    plane.controller.cycle()


def test_quotas_are_mirrored_into_slurm_accounts(slurm_plane, slurm_cluster):
    slurm_plane.controller.cycle()
    # nominal 16 + 16 borrowable + 3 the tree's short-work share may lend (10% of 32); half the tree
    assert assoc(slurm_cluster, "desk-b") == ("gres/gpu=35", "500")
    set_borrowing(slurm_plane, "desk-b", 0)
    raw = None
    try:
        assert assoc(slurm_cluster, "desk-b") == ("gres/gpu=19", "500")  # 16 + the short-work share (3 of 32)
        # a job submitted around cellscale meets the same ceiling in Slurm itself
        raw = subprocess.run(
            [
                "runuser",
                "-u",
                "bob",
                "--",
                "sbatch",
                "--parsable",
                "--account=desk-b",
                "-p",
                "gpu",
                "-N",
                "3",
                "--gres=gpu:8",
                "--wrap",
                "sleep 1",
            ],
            env=os.environ | slurm_cluster.env,
            capture_output=True,
            text=True,
            check=True,
            cwd="/tmp",
        ).stdout.strip()
        reason = _wait_for_reason(slurm_cluster, raw)
        assert "AssocGrpGRES" in reason or "AssocGrpGres" in reason, reason
    finally:
        if raw:
            subprocess.run(["scancel", raw], env=slurm_cluster.env, check=False)
        set_borrowing(slurm_plane, "desk-b", None)
    assert assoc(slurm_cluster, "desk-b") == ("gres/gpu=35", "500")


def submit_checkpointing(plane, cluster, *, nodes: int, steps: int, step_s: float) -> dict:
    """alice's training cell (a checkpoint when warned; TRAIN) on whole 8-GPU nodes, saving to a
    folder she can write."""
    ckpt = Path(tempfile.mkdtemp(prefix="ckpt-", dir=cluster.jobs_dir))
    ckpt.chmod(0o777)  # the job runs as alice
    return plane.submit(
        "alice",
        source=TRAIN,
        launcher="plain",
        outputs=["total"],
        resources={"nodes": nodes, "gpus_per_node": 8},
        env={"CKPT_DIR": str(ckpt), "STEPS": str(steps), "STEP_S": str(step_s)},
    ).json()


def test_borrowed_gpus_are_reclaimed_with_a_warning_and_the_borrower_resumes(slurm_plane, slurm_cluster):
    slurm_plane.tune(preemption_grace_s=60)
    borrower = submit_checkpointing(slurm_plane, slurm_cluster, nodes=3, steps=STEPS, step_s=0.25)
    running = slurm_plane.run_until(borrower["id"], {Phase.RUNNING}, timeout=180)
    assert running["borrowed"] == 8  # 24 GPUs on a nominal 16: desk-b's idle GPUs
    owner = slurm_plane.submit(
        "bob",
        source="import os\nprint('desk-b on', os.environ['CELLSCALE_NODE'])",
        launcher="plain",
        resources={"nodes": 2, "gpus_per_node": 8},
    ).json()
    done = slurm_plane.run_until(owner["id"], TERMINAL, timeout=240)
    assert done["phase"] == "SUCCEEDED", logs(slurm_plane, owner["id"])
    finished = slurm_plane.run_until(borrower["id"], TERMINAL, timeout=300)
    text = logs(slurm_plane, borrower["id"])
    assert finished["phase"] == "SUCCEEDED", text
    result = slurm_plane.http.get(f"/api/jobs/{borrower['id']}/result", headers=slurm_plane.as_("alice"))
    assert cloudpickle.loads(result.content) == {"total": sum(range(STEPS + 1))}  # as if never interrupted
    first = finished["attempts"][0]
    assert first["end_reason"].startswith(
        "preempted: reclaimed by desk-b: desk-a was borrowing 8 slurm GPU(s) (this job held 24)"
    )
    assert "checkpointed at step " in text, (text, finished["attempts"])
    stopped_at = int(text.split("checkpointed at step ")[1].split()[0])
    assert 0 < stopped_at < STEPS and f"attempt 2 rank 0 starts at step {stopped_at}" in text
    events = slurm_plane.http.get(f"/api/jobs/{borrower['id']}/events", headers=slurm_plane.as_("alice")).json()
    reasons = [e["reason"] for e in events]
    assert reasons.count("Preempting") == 1 and "Requeued" in reasons and "Failed" not in reasons
    assert "FAILED" not in [e["to_phase"] for e in events]
    # the borrower was warned before desk-b started: desk-b's attempt went to Slurm after the
    # warning (its submit time; a job this short may end before a poll ever sees it running,
    # so its started_at can be empty)
    warned_at = next(e["at"] for e in events if e["reason"] == "Preempting")
    assert warned_at < done["attempts"][0]["submitted_at"]


def _wait_for_reason(cluster, job_id: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    reason = ""
    while time.monotonic() < deadline:
        reason = subprocess.run(
            ["squeue", "-h", "-j", job_id, "-o", "%r"], env=cluster.env, capture_output=True, text=True
        ).stdout.strip()
        if reason and reason not in ("None", "Priority", "Resources"):
            return reason
        time.sleep(1)
    return reason
