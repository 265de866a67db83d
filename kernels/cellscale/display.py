"""How a job shows in the notebook: a live ipywidgets panel in a notebook kernel, plain
text in a terminal IPython."""

from __future__ import annotations

import html
import sys
from datetime import datetime, timezone

from cellscale.spec import JobView, Phase

PHASE_COLOURS = {
    Phase.SUCCEEDED: "#1a7f37", Phase.FAILED: "#cf222e", Phase.CANCELLED: "#6e7781",
    Phase.RUNNING: "#0969da", Phase.RECOVERING: "#bf8700",
}


def status_line(job: JobView) -> str:
    start = job.started_at or job.created_at
    end = job.finished_at or datetime.now(timezone.utc)
    seconds = max(0, int((end - start).total_seconds()))
    gpus = job.spec.resources.gpus
    parts = [job.id, job.phase.value, f"{seconds // 60:02d}:{seconds % 60:02d}",
             f"attempt {len(job.attempts) or '-'}", f"{gpus} GPU{'s' * (gpus != 1)} on {job.backend}"]
    if job.reason and (not job.phase.terminal or job.phase is Phase.FAILED):
        parts.append(job.reason or "")
    return " · ".join(p for p in parts if p)


class TextView:
    def __init__(self, stream=None):
        self.stream = stream or sys.stdout
        self._last = None

    def status(self, job: JobView) -> None:
        key = (job.phase, len(job.attempts), job.reason)
        if key != self._last:
            self._last = key
            print(f"[cellscale] {status_line(job)}", file=self.stream, flush=True)

    def log(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def close(self) -> None:
        pass


class WidgetView:
    def __init__(self):
        import ipywidgets as widgets
        from IPython.display import display

        self.header = widgets.HTML()
        self.output = widgets.Output(layout=widgets.Layout(max_height="24em", overflow="auto"))
        self.box = widgets.VBox([self.header, self.output])
        display(self.box)

    def status(self, job: JobView) -> None:
        colour = PHASE_COLOURS.get(job.phase, "#57606a")
        self.header.value = (
            f'<span style="font-family:monospace">'
            f'<b style="color:{colour}">●</b> {html.escape(status_line(job))}</span>'
        )

    def log(self, text: str) -> None:
        self.output.append_stdout(text)

    def close(self) -> None:
        pass


def make_view(shell) -> TextView | WidgetView:
    if type(shell).__name__ == "ZMQInteractiveShell":
        try:
            return WidgetView()
        except ImportError:
            pass
    return TextView()
