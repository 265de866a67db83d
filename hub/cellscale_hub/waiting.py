"""Why each pending job waits, as the newest admission cycle decided: held in memory, built
into a view only for the jobs a request shows.

Reasons are derived data: after a restart the first cycle makes them again (until then a
waiting job shows no reason). Keeping them out of the store is what lets a cycle over 100k
waiting jobs write nothing when nothing changed, and a restart not rewrite them all.
"""

from __future__ import annotations

from datetime import datetime

from cellscale.spec import AheadView, PendingView, SiteOfferView
from cellscale_hub.scheduling.types import PendingReason, Reasons


class WaitingBoard:
    """Published by the controller's thread, read by the API's: one reference swap, so a
    reader sees one cycle's reasons whole."""

    def __init__(self) -> None:
        self._reasons: Reasons = Reasons()
        self._staging: dict[str, str] = {}
        self.published = 0  # how many times reasons were published: what was derived from them is good until it changes

    def publish(self, reasons: Reasons) -> None:
        self._reasons = reasons
        self.published += 1

    def publish_staging(self, words: dict[str, str]) -> None:
        """Each staging job's progress in words (`cellscale_hub.control.staging`)."""
        self._staging = words

    @property
    def reasons(self) -> Reasons:
        """The last cycle's reasons, whole."""
        return self._reasons

    def heads(self, depth: int = 2) -> list[str]:
        """The waiting jobs admission takes next: the first `depth` of each queue, as of the
        last cycle (whose reasons it built then, not on demand)."""
        return [job_id for job_id, reason in self._reasons.explicit.items() if reason.position <= depth]

    def codes(self) -> dict[str, str]:
        """Each waiting job's reason code, as of the last cycle."""
        return {job_id: code.value for job_id, code in self._reasons.codes().items()}

    def view(self, job_id: str, viewer: str | None = None) -> PendingView | None:
        """Why `job_id` waits, as `viewer` reads it: their own jobs are "your job"."""
        reasons = self._reasons
        if job_id not in reasons:
            return None
        return pending_view(reasons[job_id], viewer).model_copy(update={"staging": self._staging.get(job_id)})


def pending_view(reason: PendingReason, viewer: str | None = None) -> PendingView:
    """The reason for the API; `viewer`'s own jobs in its words ("alice's job big1") become "your job big1"."""
    message = reason.message.replace(f"{viewer}'s job ", "your job ") if viewer else reason.message
    return PendingView(
        code=reason.code,
        message=message,
        position=reason.position,
        flavor=reason.flavor,
        needs=reason.needs,
        available=reason.available,
        ahead=[
            AheadView(
                job_id=a.job_id,
                cluster_queue=a.cluster_queue,
                gpus=a.gpus,
                why=a.why,
                holds=a.holds or f"{a.gpus} GPU{'s' * (a.gpus != 1)}",
                name=a.name or None,
                owner=a.owner or None,
            )
            for a in reason.ahead[:10]
        ],
        estimated_start=datetime.fromtimestamp(reason.estimated_start).astimezone() if reason.estimated_start else None,
        resource=reason.resource,
        sites=[
            SiteOfferView(
                site=o.site,
                flavor=o.flavor,
                cloud=o.cloud,
                fits_now=o.fits_now,
                start_in_s=round(o.start_in_s, 1),
                start_known=o.known,
                usd=round(o.usd, 2),
                move_gb=round(o.move_gb, 3),
                move_usd=round(o.move_usd, 2),
                excluded=o.excluded,
            )
            for o in reason.offers
        ],
    )
