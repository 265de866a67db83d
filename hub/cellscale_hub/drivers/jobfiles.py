"""The job directory, as the control plane reads it: logs, checkpoints, outputs, usage, a
sweep's files, and what it adds to a driver's observations. Shared file reading, not
scheduler behaviour: every driver reaches it as `driver.files`; a backend whose jobs write
elsewhere (object storage, a pod's volume) gives its driver a `files` of its own. Nothing
else in the control plane opens a job's files (an import contract)."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from cellscale.runtime.jobdir import JobDir, write_atomic
from cellscale.runtime.records import LaunchPlan, NodeUsage
from cellscale.runtime.sweepdir import SweepDir
from cellscale.spec import CheckpointView, IoProfileView
from cellscale.vocabulary import AttemptState, Fault
from cellscale_hub.drivers.ioprofile import io_profile
from cellscale_hub.faults import from_exit_records

if TYPE_CHECKING:
    from cellscale_hub.drivers.types import AttemptRef, Observation


def heartbeat_of(ref: AttemptRef, nodes: int) -> tuple[datetime | None, int | None]:
    """(oldest heartbeat across the nodes, step) from the job directory; None until every
    node has beaten once, so one silent node shows as silence."""
    beats = [ref.dir.read_heartbeat(ref.number, node) for node in range(nodes)]
    if not beats or any(beat is None for beat in beats):
        return None, None
    oldest = min(beat.at for beat in beats)
    return datetime.fromtimestamp(oldest, UTC), beats[0].step


def fault_from_job_dir(ref: AttemptRef, nodes: int) -> Fault:
    """The class of a failed gang from its nodes' exit records; a gang with no record at all
    lost its supervisors: an infrastructure fault."""
    records = [ref.dir.read_exit(ref.number, node) for node in range(nodes)]
    return from_exit_records(r.reason for r in records if r is not None) or Fault.INFRASTRUCTURE


class JobFiles:
    """A job directory every node and the control plane share (`ref.job_dir`)."""

    def prepare(self, ref: AttemptRef, plan: LaunchPlan, bundle: Path | None, points: Path | None) -> None:
        """Write what the attempt's runtime reads (cell, inputs, plan; a sweep's points
        manifest and folders) before `submit`."""
        ref.dir.prepare(ref.number, ref.spec.source, plan, bundle, ref.result_key)
        if points is not None:
            sweep = self.sweep_dir(ref.job_dir)
            sweep.make_dirs()
            if not sweep.points.exists():
                write_atomic(sweep.points, points.read_bytes(), mode=0o644)

    def fence(self, ref: AttemptRef) -> bool:
        """Make sure an attempt that has not started never starts (before it is moved to another
        backend): True if fenced, False if it had started. The job directory's gate."""
        return ref.dir.pass_gate(ref.number, "fenced") == "fenced"

    def sweep_dir(self, job_dir: Path) -> SweepDir:
        """A sweep's files in its job directory (what its tasks wrote), read by the sweep runner."""
        return SweepDir(job_dir)

    def annotate(
        self, refs: list[AttemptRef], observed: dict[tuple[str, int], Observation]
    ) -> dict[tuple[str, int], Observation]:
        """`poll`'s observations, with what the job directory adds: the attempt's newest checkpoint,
        the checkpoint it resumed from, whether a finished job left its outputs, and an ended
        attempt's I/O profile (its ranks write theirs as their cells end, before the node's exit record)."""
        for ref in refs:
            if ref.key in observed:
                obs, jd = observed[ref.key], ref.dir
                observed[ref.key] = dataclasses.replace(
                    obs,
                    checkpoint=jd.latest_checkpoint(ref.number),
                    resume=jd.read_resume(ref.number),
                    result=obs.state is AttemptState.SUCCEEDED and jd.has_result(),
                    io=self.io_profile(ref) if obs.state.ended else None,
                )
        return observed

    def io_profile(self, ref: AttemptRef) -> IoProfileView | None:
        """What the attempt's ranks read through cellscale.datasets and what its nodes staged
        (None: neither wrote a record)."""
        jd, nodes = ref.dir, ref.spec.resources.nodes
        stages = [stage for node in range(nodes) for stage in jd.read_stage(ref.number, node)]
        return io_profile(ref.number, jd.read_io(ref.number), stages)

    def usage(self, ref: AttemptRef) -> list[NodeUsage | None]:
        """What each node of the attempt used so far (its runtime's usage record), for the ledger."""
        return [ref.dir.read_usage(ref.number, node) for node in range(ref.spec.resources.nodes)]

    def read_log(self, job_dir: Path, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Whole lines of the job's combined log from byte `offset`, and the log's size."""
        return JobDir(job_dir).read_log(offset, max_bytes)

    def log_path(self, job_dir: Path) -> Path | None:
        """The local file that holds the job's combined log, for the control plane to be told
        when it changes (it reads it through `read_log` only); None when the log is not a file
        on this host (then followers rely on `log_size` every `log_poll_interval`)."""
        return JobDir(job_dir).log

    def log_size(self, job_dir: Path) -> int:
        """The size of the job's combined log (0 before it exists). `read_log` opens the file,
        where a stat could answer from NFS's attribute cache for up to a minute: an open
        revalidates it (close-to-open consistency)."""
        return self.read_log(job_dir, 0, 0)[1]

    def checkpoints(self, job_dir: Path, attempts: list[int]) -> list[CheckpointView]:
        """The checkpoints the job's attempts committed, oldest first."""
        return [
            CheckpointView(
                attempt=n,
                step=c.step,
                url=c.url,
                size_bytes=c.size_bytes,
                write_s=c.write_s,
                committed_at=datetime.fromtimestamp(c.wall_time, UTC),
            )
            for n in attempts
            for c in JobDir(job_dir).read_checkpoints(n)
        ]

    def point_result_file(self, job_dir: Path, point: int, array: int) -> tuple[Path, str | None] | None:
        """One sweep point's pickled outputs as its try in `array` wrote them, and their tag."""
        sweep = self.sweep_dir(job_dir)
        path = sweep.result_file(point, array)
        return (path, sweep.point_result_tag(point, array)) if path.exists() else None

    def read_point_log(self, job_dir: Path, point: int, offset: int, max_bytes: int) -> tuple[bytes, int]:
        """Bytes of one sweep point's own log from `offset`, and its size."""
        try:
            with open(self.sweep_dir(job_dir).point_log(point), "rb") as handle:
                handle.seek(offset)
                data = handle.read(max_bytes)
                return data, handle.seek(0, os.SEEK_END)
        except FileNotFoundError:
            return b"", 0

    def result_file(self, job_dir: Path) -> tuple[Path, str | None] | None:
        """Rank 0's pickled outputs (opaque bytes to the control plane) and the job's tag of
        them (HMAC under the key its kernel chose; None for a job submitted without one), or
        None if there are none."""
        jd = JobDir(job_dir)
        return (jd.result, jd.read_result_tag()) if jd.has_result() else None
