"""How a waiting or preempted job reads in the notebook."""

from datetime import UTC, datetime, timedelta

import pytest

from cellscale.display import describe, memory_words, status_line
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


def test_status_says_why_it_waits_once_and_a_cpu_job_ahead_holds_cpus():
    message = "waiting for 4 CPUs, 0 free to it: your job big1 holds 16 of the desk's CPUs. Details: ..."
    pending = PendingView(
        code="PoolLent",
        message=message,
        position=1,
        flavor="gpu",
        resource="cpu",
        needs=4,
        available=0,
        ahead=[
            AheadView(
                job_id="cs-p",
                cluster_queue="desk-b",
                gpus=0,
                why="borrowing",
                holds="16 CPUs",
                name="prep",
                owner="bob",
            ),
            AheadView(job_id="cs-q", cluster_queue="desk-b", gpus=0, why="borrowing", holds="1 CPU"),
        ],
    )
    assert status_line(job(pending=pending, reason=message)).endswith(
        " · waiting for 4 CPUs, 0 free to it: your job big1 holds 16 of the desk's CPUs."
    )  # the live line: the reason without its details
    lines = describe(job(pending=pending, reason=message)).splitlines()
    assert lines[0].startswith("cs-1 · cell · PENDING · ") and lines[0].endswith(" · 1 CPU on slurm")
    assert [line for line in lines if "holds 16 of the desk's CPUs" in line] == [f"  why pending: {message}"]
    assert lines[-2:] == [
        "    ahead: prep (cs-p, desk-b, 16 CPUs, borrowing)",
        "    ahead: cs-q (desk-b, 1 CPU, borrowing)",
    ]


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
    short = job(phase=Phase.RUNNING, flavor="slurm", short_share=True)
    assert "admitted on slurm on its cohort's short-work share" in describe(short)


def test_a_cancelled_attempt_says_cancelled_once_without_its_exit_code():
    stopped = AttemptView(
        number=1,
        backend="local",
        backend_ref="pid:7",
        state=AttemptState.CANCELLED,
        gpu_ids=[],
        submitted_at=now(),
        started_at=now(),
        ended_at=now(),
        exit_code=241,
        last_heartbeat=None,
        end_reason="cancelled",
    )
    lines = describe(job(phase=Phase.CANCELLED, attempts=[stopped])).splitlines()
    assert "  attempt 1 on local: cancelled" in lines and "241" not in "\n".join(lines)


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


@pytest.mark.parametrize(
    ("resources", "words"),
    [
        ({"gpus_per_node": 2}, "2 GPUs · 2 CPUs"),
        ({"gpus_per_node": 2, "cpus_per_task": 4, "memory_mb_per_node": "4G"}, "2 GPUs · 8 CPUs · 4 GiB"),
        (
            {"nodes": 2, "gpus_per_node": 4, "cpus_per_task": 2, "memory_mb_per_node": "64G"},
            "8 GPUs · 16 CPUs · 128 GiB",
        ),
        ({"cpus_per_task": 8}, "8 CPUs"),
        ({"cpus_per_task": 1, "memory_mb_per_node": 1536}, "1 CPU · 1.5 GiB"),
    ],
)
def test_the_status_line_shows_cpus_and_memory_beside_gpus(resources, words):
    line = status_line(job(spec=JobSpec(source="pass", resources=resources)))
    assert f"· {words} on slurm" in line


@pytest.mark.parametrize(("mb", "words"), [(512, "512 MiB"), (1024, "1 GiB"), (1536, "1.5 GiB"), (2 * 2**20, "2 TiB")])
def test_memory_reads_in_binary_units(mb, words):
    assert memory_words(mb) == words


@pytest.mark.parametrize(
    ("resource", "needs", "available", "words"),
    [
        ("gpu", 1, 0, "needs 1 GPU, 0 free to it"),
        ("cpu", 16, 4, "needs 16 CPUs, 4 free to it"),
        ("memory", 64 * 1024, 16 * 1024, "needs 64 GiB of memory, 16 GiB free to it"),
    ],
)
def test_a_waiting_job_says_what_it_needs_of_the_resource_it_waits_for(resource, needs, available, words):
    pending = PendingView(
        code="QuotaExhausted", message="at quota", position=1, needs=needs, available=available, resource=resource
    )
    assert f"position 1 in its queue; {words}" in describe(job(pending=pending, reason=pending.message))


def test_a_job_with_a_choice_of_sites_waits_on_all_of_them():
    from cellscale.spec import SiteOfferView

    offers = [
        SiteOfferView(site=site, flavor=site, fits_now=False, start_in_s=3600, usd=17.6) for site in ("dcb", "dca")
    ] + [SiteOfferView(site="burst", flavor="burst", cloud=True, fits_now=False, start_in_s=90, usd=40, excluded="x")]
    pending = PendingView(code="CapacityFull", message="waits for dca (...)", position=1, sites=offers)
    line = status_line(job(pending=pending, reason=pending.message))
    assert "on burst, dca or dcb (placement decides)" in line
    assert "on slurm" in status_line(job(phase=Phase.RUNNING))


def test_service_received_shows_once_there_is_some():
    assert "service received" not in describe(job())
    text = describe(job(phase=Phase.RUNNING, service_gpu_hours=3.21))
    assert "  service received: 3.2 GPU-hours (ordering: least service first within the desk)" in text
    assert "service received: 0.012 GPU-hours" in describe(job(service_gpu_hours=0.0123))


def test_the_io_profile_shows_its_verdict_sources_and_staging():
    from cellscale.display import io_lines
    from cellscale.spec import IoProfileView, IoSourceView, StageView

    io = IoProfileView(
        attempt=1,
        verdict="not I/O-bound: 1% of step time in reads (92% from the node cache)",
        io_bound=False,
        blocked_fraction=0.01,
        bytes=1_300_000_000,
        cache_hit_ratio=0.92,
        sources=[
            IoSourceView(source="cache", bytes=1_200_000_000, reads=900, read_s=1.25, mb_per_s=960.0),
            IoSourceView(source="s3://md", bytes=100 * 2**20, reads=40, read_s=2.0, mb_per_s=52.4),
        ],
        staging=[
            StageView(name="bars", url="s3://md/bars", nodes=2, hits=2, bytes=2**30, fetched_bytes=0, seconds=0.1),
            StageView(
                name="refs", url="s3://md/refs", nodes=4, hits=1, bytes=2**20, fetched_bytes=3 * 2**20, seconds=4
            ),
        ],
    )
    assert io_lines(io) == [
        "I/O: not I/O-bound: 1% of step time in reads (92% from the node cache)",
        "reads: cache 1.1 GB at 960 MB/s · s3://md 100.0 MB at 52 MB/s",
        "staged: bars 1.0 GB, already cached (2 nodes) · refs 1.0 MB, fetched 3.0 MB in 4 s (1 of 4 nodes had it)",
    ]
    text = describe(job(phase=Phase.SUCCEEDED, io=io))
    assert "\n  I/O: not I/O-bound: 1% of step time in reads" in text and "\n  reads: cache 1.1 GB" in text
