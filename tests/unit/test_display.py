"""How a waiting or preempted job reads in the notebook."""

from datetime import UTC, datetime, timedelta

from cellscale.display import describe, status_line
from cellscale.spec import AheadView, AttemptState, AttemptView, CheckpointView, JobSpec, JobView, PendingView, Phase


def now() -> datetime:
    return datetime.now(UTC)


def job(**fields) -> JobView:
    base = dict(
        id="cs-1",
        name="cell",
        owner="alice",
        tenant="desk-a",
        queue="default",
        backend="slurm",
        cluster_queue="desk-a",
        phase=Phase.PENDING,
        spec=JobSpec(source="pass"),
        created_at=now(),
        updated_at=now(),
        started_at=None,
        finished_at=None,
        cancel_requested=False,
        result_available=False,
        attempts=[],
    )
    return JobView(**(base | fields))


def test_pending_job_says_why_where_and_when():
    pending = PendingView(
        code="PoolLent",
        message="waiting for 8 slurm GPU(s) at once; 4 free to it",
        position=1,
        flavor="slurm",
        needs=8,
        available=4,
        estimated_start=now() + timedelta(minutes=30),
        ahead=[AheadView(job_id="cs-2", cluster_queue="desk-b", gpus=24, why="borrowing")],
    )
    waiting = job(pending=pending, reason=pending.message)
    assert "estimated start" in status_line(waiting) and "(in 30 min)" in status_line(waiting)
    text = describe(waiting)
    assert "why pending: waiting for 8 slurm GPU(s) at once; 4 free to it" in text
    assert "position 1 in its queue; needs 8 GPUs, 4 free to it" in text
    assert "ahead: cs-2 (desk-b, 24 GPUs, borrowing)" in text


def test_preempted_attempt_and_warning_show():
    first = AttemptView(
        number=1,
        backend="slurm",
        backend_ref="7",
        state=AttemptState.CANCELLED,
        gpu_ids=[],
        submitted_at=now(),
        started_at=now(),
        ended_at=now(),
        exit_code=0,
        last_heartbeat=None,
        end_reason="preempted: preempted to return 8 borrowed slurm GPU(s) to desk-b",
    )
    running = job(phase=Phase.RUNNING, flavor="slurm", borrowed=8, preempting=True, attempts=[first])
    assert "being preempted: checkpoint now" in status_line(running)
    text = describe(running)
    assert "admitted on slurm (8 GPUs borrowed)" in text
    assert "attempt 1 on slurm: cancelled: preempted: preempted to return 8 borrowed" in text


def test_attempts_show_fault_class_step_and_checkpoints():
    failed = AttemptView(
        number=1,
        backend="slurm",
        backend_ref="7",
        state=AttemptState.FAILED,
        gpu_ids=[],
        submitted_at=now(),
        started_at=now(),
        ended_at=now(),
        exit_code=1,
        last_heartbeat=None,
        end_reason="node failure: node3 (down)",
        fault="infrastructure",
        failed_nodes=["node3"],
        last_step=41,
    )
    checkpoint = CheckpointView(
        attempt=1,
        step=40,
        url="s3://ckpt/step-40",
        size_bytes=3 * 2**20,
        committed_at=now() - timedelta(minutes=5),
        write_s=1.5,
    )
    text = describe(job(phase=Phase.RUNNING, attempts=[failed], excluded_nodes=["node3"]), [checkpoint])
    assert "attempt 1 on slurm, step 41: failed [infrastructure]: node failure: node3 (down)" in text
    assert "avoiding nodes: node3" in text
    assert "checkpoint step 40 (3.0 MB, attempt 1, 5 min ago): s3://ckpt/step-40" in text
