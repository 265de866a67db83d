"""A sweep as the notebook holds it: `%%cluster map` and `cellscale.map` return a `Sweep` at
once, and a background thread keeps it current.

Every ~0.5 s the poller asks the control plane for the points that changed (GET
/api/jobs/ID/points?since=STAMP) and for the job (its phase and SweepProgress), fetches the
outputs of each newly done or cached point, and updates ONE progress line: a progress bar in a
notebook (redrawn at most once a second), a single `\\r`-rewritten line in a terminal while
something waits on it. Never a line per point. It stops once the job has ended and every
point's outcome is read.

    s = cellscale.map(train, {"lr": [1e-3, 1e-4], "seed": [0, 1, 2]})
    s.df            # one row per point: its parameters, status, attempt, node, wall_s, error, outputs
    s.wait().failed()
    s.retry()       # only the failed points run again: the rest come from the result cache

pandas and ipywidgets are imported when first needed (the magic's import cost matters).
"""

from __future__ import annotations

import re
import shutil
import sys
import threading
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TextIO

import httpx
from pydantic import ValidationError

from cellscale.bundle import InputError, bundle_sha256, pack_inputs
from cellscale.client import ApiError, Client
from cellscale.display import sweep_line
from cellscale.magicargs import MagicArgs, MagicUsageError
from cellscale.points import GridError, decode, manifest, points_of
from cellscale.spec import MAX_RESULTS_PER_CALL, JobSpec, JobView, PointView, SweepProgress
from cellscale.vocabulary import Launcher, PointStatus
from cellscale.wire import explain

if TYPE_CHECKING:
    import pandas as pd

POLL_SECONDS = 0.5
"""How often the poller asks for the points that changed."""
WIDGET_REFRESH_SECONDS = 1.0
"""Most often the notebook's progress bar is redrawn."""
STAMP_OVERLAP_US = 10_000_000
"""Each poll asks again for the points of the last 10 s before the previous page's stamp: a point
committed while a page was read is seen on the next one (rows are applied idempotently)."""
PAGE_SIZE = 1000
RESULTS_PER_POLL = 200
"""Most point outputs fetched in one poll, so the progress line keeps moving on a big retry."""
RESULT_TRIES = 5
"""A point's outputs refused this many times (4xx) are given up on; the reason shows in `error`."""
FN_NAME = "__cellscale_fn__"
MAP_SOURCE = f"result = {FN_NAME}(**__point__)\n"
"""The cell `cellscale.map` runs at each point: the function, shipped in the inputs bundle."""
MAP_OPTIONS = frozenset(
    "time cpus mem env queue backend site burst data priority retries retries_timeout retries_user stall_timeout "
    "name".split()
)
"""`cellscale.map`'s options besides gpus, max_parallel and per_task: the %%cluster flags of the
same names (`retries_user` is --retries-user)."""
_SUCCEEDED = (PointStatus.done, PointStatus.cached)
_OWN_COLUMNS = frozenset({"status", "attempt", "node", "wall_s", "error", "fault", "traceback"})
_INDEX = "#point"  # a record's point index: no parameter can be named so


class Sweep:
    """A submitted sweep, kept current by a background poller. Returned at once by
    `%%cluster map` and `cellscale.map`; `%cluster attach ID` returns one for a sweep.

    `.df` (one row per point), `.results`, `.failed()`, `.wait()`, `.done`, `.retry()`,
    `.cancel()`, `.logs(index)`; `.progress` is the counts by status, `.job` the newest JobView.
    """

    def __init__(
        self,
        client: Client,
        job: JobView,
        points: list[Mapping[str, Any]] | None = None,
        *,
        expand_result: bool = False,
        fetch_results: bool = True,
        stream: TextIO | None = None,
        poll_s: float = POLL_SECONDS,
        start: bool = True,
    ):
        """`points`: the grid's points as the user gave them (their original Python values);
        None (attaching to a sweep submitted elsewhere): decoded from the control plane's rows.
        `expand_result`: `cellscale.map`'s output `result`, a dict, becomes columns. `stream`: where
        `wait()` writes its line outside a notebook (default stdout)."""
        if job.spec.sweep is None:
            raise ValueError(f"{job.id} is not a sweep: follow it with %cluster attach {job.id}")
        self.client = client
        self.job_id = job.id
        self.job = job
        self.spec: JobSpec = job.spec
        self.size = job.spec.sweep.points
        self._points = [dict(p) for p in points] if points is not None else None
        self._expand = expand_result
        self._fetch = fetch_results and bool(job.spec.outputs)
        self._stream = stream
        self._poll_s = poll_s
        self._lock = threading.Lock()  # guards the state below
        self._ticking = threading.Lock()  # one poll at a time
        self._rows: dict[int, PointView] = {}
        self._results: dict[int, dict] = {}
        self._result_errors: dict[int, str] = {}
        self._result_refusals: Counter[int] = Counter()
        self._since = 0
        self._error: BaseException | None = None
        self._trouble: str | None = None
        self._finished = threading.Event()
        self._stop = threading.Event()
        self._widget = None
        self._widget_drawn = 0.0
        self._widget_cell: int | None = None
        self._shown_in: tuple[Any, int] | None = None
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(
                target=_poll, args=(weakref.ref(self), self._stop, poll_s), name=f"cellscale-{job.id}", daemon=True
            )
            self._thread.start()

    @classmethod
    def attach(cls, client: Client, job: JobView | str, **options) -> Sweep:
        """The handle of a sweep submitted elsewhere (another kernel, the command line)."""
        return cls(client, client.get(job) if isinstance(job, str) else job, **options)

    # -- state ---------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """The job has ended and every point's outcome (and outputs) is read."""
        return self._finished.is_set()

    @property
    def progress(self) -> SweepProgress:
        """The points by status: counted from the rows read (once every point was seen), else
        the control plane's own counts; the ETA is always the control plane's."""
        with self._lock:
            rows, server = list(self._rows.values()), self.job.sweep
        if server is not None and len(rows) < self.size:
            return server
        counts = Counter(row.status for row in rows)
        return SweepProgress(
            points=self.size,
            queued=self.size - sum(counts[s] for s in PointStatus if s is not PointStatus.queued),
            running=counts[PointStatus.running],
            done=counts[PointStatus.done],
            failed=counts[PointStatus.failed],
            cached=counts[PointStatus.cached],
            cancelled=counts[PointStatus.cancelled],
            retried=sum(row.tries > 1 for row in rows),
            max_parallel=self.spec.sweep.max_parallel,
            arrays=server.arrays if server else 0,
            eta_s=server.eta_s if server else None,
        )

    def line(self) -> str:
        """The progress line: `cs-1234: 120/250 done · 8 running · 1 failed · 3 cached · ETA 0:42`."""
        text = f"{self.job_id}: {sweep_line(self.progress, self.job)}"
        if self._error is not None:
            text += f" · stopped following: {self._error}"
        elif self._trouble:
            text += f" · {self._trouble}"
        return text

    def __repr__(self) -> str:
        return f"<Sweep {self.line()}>"

    # -- polling -------------------------------------------------------------------------------
    def refresh(self) -> Sweep:
        """Ask the control plane now (the background poller does every ~0.5 s). A dropped
        connection or a 5xx is retried on the next poll; a refusal (4xx) stops the following and
        `wait()` raises it."""
        with self._ticking:
            if self._finished.is_set():
                return self
            try:
                self._tick()
                self._trouble = None
            except httpx.TransportError as exc:
                self._trouble = f"reconnecting to the control plane ({type(exc).__name__})"
            except ApiError as exc:
                if exc.status >= 500 or exc.status == 429:
                    self._trouble = f"the control plane answered {exc.status}; retrying"
                else:
                    self._error = exc
                    self._finished.set()
            except Exception as exc:  # noqa: BLE001 - kept for wait() to raise; the poller must not die silently
                self._error = exc
                self._finished.set()
            self._draw()
        return self

    def _tick(self) -> None:
        job = self.client.get(self.job_id)  # first: points read after it saw the end are the last
        since = max(0, self._since - STAMP_OVERLAP_US) if self._since else 0
        offset, stamp = 0, None
        while True:
            page = self.client.points(self.job_id, since=since, offset=offset, limit=PAGE_SIZE)
            stamp = page.stamp if stamp is None else min(stamp, page.stamp)
            self._apply(page.items)
            if len(page.items) < PAGE_SIZE:
                break
            offset += len(page.items)
        with self._lock:
            self.job = job
            self._since = max(self._since, stamp or 0)
        if self._fetch:
            self._fetch_results()
        if job.phase.terminal and not self._unread():
            self._finished.set()

    def _apply(self, rows: list[PointView]) -> None:
        with self._lock:
            for row in rows:
                seen = self._rows.get(row.index)
                if 0 <= row.index < self.size and (seen is None or row.stamp >= seen.stamp):
                    self._rows[row.index] = row

    def _unread(self) -> list[PointView]:
        """Done or cached points whose outputs are neither read nor given up on."""
        if not self._fetch:
            return []
        with self._lock:
            return [
                row
                for index, row in sorted(self._rows.items())
                if row.status in _SUCCEEDED and index not in self._results and index not in self._result_errors
            ]

    def _fetch_results(self) -> None:
        """The outputs of points newly done, MAX_RESULTS_PER_CALL a call, RESULTS_PER_POLL a poll."""
        unread = [row.index for row in self._unread()[:RESULTS_PER_POLL]]
        for start in range(0, len(unread), MAX_RESULTS_PER_CALL):
            try:
                values, problems, missing = self.client.point_results(
                    self.job_id, unread[start : start + MAX_RESULTS_PER_CALL]
                )
            except httpx.TransportError:
                raise
            except ApiError as exc:
                if exc.status >= 500:
                    raise
                values, problems, missing = {}, {}, unread[start : start + MAX_RESULTS_PER_CALL]
            for index, why in problems.items():
                self._give_up(index, why)
            for index in missing:
                self._result_refusals[index] += 1
                if self._result_refusals[index] >= RESULT_TRIES:
                    self._give_up(index, "its outputs could not be read from the control plane")
            with self._lock:
                self._results.update({index: dict(v) for index, v in values.items()})

    def _give_up(self, index: int, why: str) -> None:
        with self._lock:
            self._result_errors[index] = why

    def close(self) -> None:
        """Stop following (the sweep itself keeps running)."""
        self._stop.set()

    # -- waiting and showing -------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> Sweep:
        """Block until every point has ended (done, failed, cached or cancelled) and the job
        with them; returns the handle. A notebook shows the progress bar meanwhile, a terminal
        one line rewritten in place. Ctrl-C stops the waiting, not the sweep (`.cancel()` does).
        Raises TimeoutError after `timeout` seconds (the sweep keeps running), and the
        control plane's refusal if following it failed."""
        try:
            return self._wait(timeout)
        except KeyboardInterrupt:
            if _shell() is not None:  # a script's Ctrl-C just ends it
                print(f"[cellscale] stopped waiting; {self.job_id} keeps running (.wait() again, or .cancel())")
            raise

    def _wait(self, timeout: float | None) -> Sweep:
        deadline = None if timeout is None else time.monotonic() + timeout
        shell = _shell()
        text = None
        if _in_kernel(shell):
            if self._widget is None or self._widget_cell != getattr(shell, "execution_count", None):
                self._display_widget()  # the bar, in the cell that waits
        else:
            text = _TextLine(self._stream or sys.stdout)
        try:
            while not self._finished.is_set():
                if text is not None:
                    text.show(self.line())
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError(f"{self.line()}: not over after {timeout:g} s; it keeps running")
                if self._thread is None or not self._thread.is_alive():
                    self.refresh()
                    self._finished.wait(self._poll_s)
                else:
                    self._finished.wait(0.25)
        finally:
            if text is not None:
                text.show(self.line())
                text.end()
        if self._error is not None:
            raise self._error
        return self

    def _draw(self) -> None:
        """Redraw the notebook's bar, at most once a second (and once more at the end)."""
        if self._widget is None:
            return
        now = time.monotonic()
        if self.done or now - self._widget_drawn >= WIDGET_REFRESH_SECONDS:
            self._widget_drawn = now
            self._update_widget()

    def _display_widget(self) -> None:
        """Show the bar (one widget: every place it is shown moves together)."""
        from IPython.display import display

        if self._widget is None:
            import ipywidgets as widgets

            bar = widgets.IntProgress(min=0, max=self.size, value=0, layout=widgets.Layout(width="30%"))
            label = widgets.Label()
            self._widget = widgets.HBox([bar, label])
            # stable names for the browser (tests, a site's CSS): the box, its bar and its line
            self._widget.add_class("cellscale-sweep")
            bar.add_class("cellscale-sweep-bar")
            label.add_class("cellscale-sweep-label")
            self._update_widget()
            self._widget_drawn = time.monotonic()
        display(self._widget)
        self._widget_cell = getattr(_shell(), "execution_count", None)

    def _update_widget(self) -> None:
        bar, label = self._widget.children
        progress = self.progress
        bar.value = progress.finished
        bar.bar_style = "danger" if progress.failed else "success" if self.done else "info"
        label.value = self.line()

    def _ipython_display_(self) -> None:
        shown, self._shown_in = self._shown_in, None
        if shown is not None and shown[0].execution_count == shown[1]:
            return  # `%cluster attach` showed it in this very cell
        if _in_kernel(_shell()):
            self._display_widget()
        else:
            print(self.line())

    def _mark_shown(self, shell) -> None:
        """Shown by `shell`'s running cell already: its Out does not show it again."""
        self._shown_in = (shell, shell.execution_count)

    # -- results -------------------------------------------------------------------------------
    @property
    def results(self) -> list[dict | None]:
        """Each point's outputs {name: value}, in grid order; None where not done (or not read yet)."""
        with self._lock:
            return [self._results.get(i) for i in range(self.size)]

    @property
    def df(self) -> pd.DataFrame:
        """One row per point in grid order (index: the point's index): the grid's parameters,
        then status, attempt, node, wall_s, error, then one column per output (`cellscale.map`:
        a dict result's keys, else `result`). A snapshot: read it again for newer values."""
        records, columns = self._table()
        return _frame(records, columns)

    def failed(self) -> pd.DataFrame:
        """The failed points: their parameters, fault class, error line and the traceback text."""
        records, columns = self._table()
        params = columns[: columns.index("status")]
        failed = [r for r in records if r["status"] == PointStatus.failed.value]
        return _frame(failed, [*params, "attempt", "fault", "error", "traceback"])

    def _params(self) -> list[dict]:
        if self._points is not None:
            return self._points
        with self._lock:
            rows = dict(self._rows)
        return [decode(rows[i].params) if i in rows else {} for i in range(self.size)]

    def _table(self) -> tuple[list[dict], list[str]]:
        """Every point as a record keyed by column (and _INDEX), and the DataFrame's columns."""
        params = self._params()
        names = list(dict.fromkeys(name for p in params for name in p))
        # a parameter named like a column of ours keeps its value under param.NAME
        param_columns = {(f"param.{n}" if n in _OWN_COLUMNS else n): n for n in names}
        with self._lock:
            rows, results, unread = dict(self._rows), dict(self._results), dict(self._result_errors)
        columns = [*param_columns, "status", "attempt", "node", "wall_s", "error"]
        outputs = self._output_columns(results, {*columns, "fault", "traceback"})
        records = []
        for i in range(self.size):
            row = rows.get(i)
            record = {_INDEX: i} | {column: params[i].get(name) for column, name in param_columns.items()}
            record.update(
                status=row.status.value if row else PointStatus.queued.value,
                attempt=row.tries if row else 0,
                node=row.node if row else None,
                wall_s=row.wall_s if row else None,
                error=(row.error if row else None) or unread.get(i),
                fault=row.fault.value if row and row.fault else None,
                traceback=row.traceback if row else None,
            )
            out = results.get(i)
            for column, (name, key) in outputs.items():
                value = out.get(name) if out is not None else None
                record[column] = value.get(key) if key is not None and isinstance(value, Mapping) else value
            records.append(record)
        return records, [*columns, *outputs]

    def _output_columns(self, results: dict[int, dict], taken: set[str]) -> dict[str, tuple[str, str | None]]:
        """Output column → (output name, key in it or None). A name already taken by a parameter
        or our own columns becomes output.NAME (result.KEY for a map's dict)."""
        if not self._expand:
            return {(f"output.{n}" if n in taken else n): (n, None) for n in self.spec.outputs}
        values = [out.get("result") for out in results.values()]
        if not values or not all(isinstance(v, Mapping) and all(isinstance(k, str) for k in v) for v in values):
            return {("output.result" if "result" in taken else "result"): ("result", None)}
        keys = dict.fromkeys(k for v in values for k in v)
        return {(f"result.{k}" if k in taken else k): ("result", k) for k in keys}

    # -- acting on it --------------------------------------------------------------------------
    def cancel(self) -> Sweep:
        """Cancel the sweep: running points stop, queued ones never run (status cancelled)."""
        job = self.client.cancel(self.job_id)
        with self._lock:
            self.job = job
        return self

    def retry(self) -> Sweep:
        """Submit the same sweep again (same cell, grid, inputs and options) as a new job, and
        return its handle. The control plane's result cache knows the outputs of every point
        that already succeeded with this code: those come back `cached` without running, so
        only the failed, cancelled or never-run points run again. The sweep must have ended."""
        if not self.done:
            raise RuntimeError(f"{self.job_id} has not ended: .wait() for it (or .cancel() it) before .retry()")
        job = self.client.submit(self.spec, idempotency_key=uuid.uuid4().hex)
        return Sweep(
            self.client,
            job,
            self._points,
            expand_result=self._expand,
            fetch_results=self._fetch,
            stream=self._stream,
            poll_s=self._poll_s,
            start=self._thread is not None,
        )

    def logs(self, index: int) -> str:
        """The log of point `index` (every try of it)."""
        if not 0 <= index < self.size:
            raise IndexError(f"{self.job_id} has points 0 to {self.size - 1}, not {index}")
        parts, offset = [], 0
        while True:
            chunk = self.client.point_logs(self.job_id, index, offset=offset)
            parts.append(chunk.text)
            if not chunk.text or chunk.next_offset <= offset:
                return "".join(parts)
            offset = chunk.next_offset


def _poll(ref: weakref.ref, stop: threading.Event, every: float) -> None:
    """The background poller: holds its Sweep only while polling, so a dropped handle ends it."""
    while not stop.is_set():
        sweep = ref()
        if sweep is None:
            return
        sweep.refresh()
        finished = sweep.done
        del sweep
        if finished:
            return
        stop.wait(every)


def _frame(records: list[dict], columns: list[str]) -> pd.DataFrame:
    import pandas as pd

    index = pd.Index([r[_INDEX] for r in records], name="point", dtype="int64")
    return pd.DataFrame([{c: r.get(c) for c in columns} for r in records], columns=columns, index=index)


class _TextLine:
    """One line of a terminal, rewritten in place with `\\r` (never a new line until `end`)."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.width = 0
        self.last: str | None = None
        isatty = getattr(stream, "isatty", None)
        self.columns = shutil.get_terminal_size().columns - 1 if isatty and isatty() else None

    def show(self, text: str) -> None:
        if self.columns:
            text = text[: self.columns]
        if text == self.last:
            return
        self.stream.write("\r" + text + " " * max(0, self.width - len(text)))
        self.stream.flush()
        self.width, self.last = len(text), text

    def end(self) -> None:
        if self.last is not None:
            self.stream.write("\n")
            self.stream.flush()
            self.last = None


def _shell():
    if "IPython" not in sys.modules:
        return None
    from IPython import get_ipython

    return get_ipython()


def _in_kernel(shell) -> bool:
    return type(shell).__name__ == "ZMQInteractiveShell"


# -- submitting ----------------------------------------------------------------------------------
class SweepPlan:
    """A sweep checked before anything is sent: its points, their manifest, and its spec (naming
    the manifest and the inputs bundle `blob` by their content addresses). GridError or
    MagicUsageError say what to change."""

    def __init__(self, args: MagicArgs, source: str, grid: Any, blob: bytes | None = None):
        self.points = points_of(grid)
        if not self.points:
            raise GridError("the grid has no points: give it at least one")
        self.manifest = manifest(self.points)
        self.bundles = (self.manifest,) if blob is None else (self.manifest, blob)
        """What the spec names by hash: uploaded before it is submitted."""
        sweep = args.sweep_of(len(self.points), bundle_sha256(self.manifest))
        self.spec = args.to_spec(source, bundle_sha256(blob) if blob is not None else None, sweep)

    def submit(self, client: Client, **options) -> Sweep:
        """Upload the manifest (and the inputs bundle), submit ONE job, return its handle."""
        for bundle in self.bundles:
            client.upload_inputs(bundle)
        job = client.submit(self.spec)
        return Sweep(client, job, self.points, **options)


def announce(sweep: Sweep) -> str:
    """The one line said at submit: `[cellscale] cs-…: sweep of 250 points, 8 at a time`."""
    spec = sweep.spec.sweep
    tasks = f" in {spec.tasks} tasks of {spec.per_task}" if spec.per_task > 1 else ""
    points = f"{spec.points} point{'s' * (spec.points != 1)}"
    estimate = f"; {sweep.job.estimate.words}" if sweep.job.estimate else ""
    return f"[cellscale] {sweep.job_id}: sweep of {points}{tasks}, {spec.slots} at a time{estimate}"


def run_map(
    fn: Callable[..., Any],
    grid: Any,
    *,
    gpus: int = 0,
    max_parallel: int = 64,
    per_task: int = 1,
    client: Client | None = None,
    **options: Any,
) -> Sweep:
    """`cellscale.map`: see its docstring."""
    if not callable(fn):
        raise TypeError(f"cellscale.map(fn, grid): fn must be a function, not a {type(fn).__name__}")
    unknown = sorted(set(options) - MAP_OPTIONS)
    if unknown:
        raise TypeError(
            f"cellscale.map() got unexpected option {', '.join(unknown)}; it takes gpus, max_parallel, per_task, "
            f"client and {', '.join(sorted(MAP_OPTIONS))}"
        )
    if isinstance(options.get("data"), str):
        options["data"] = [options["data"]]
    values = {
        "name": _name_of(fn),
        **{k: v for k, v in options.items() if v is not None},
        "gpus": gpus,
        "launcher": Launcher.plain,
        "inputs": [FN_NAME],
        "outputs": ["result"],
        "sweep": True,
        "max_parallel": max_parallel,
        "per_task": per_task,
    }
    try:
        args = MagicArgs.model_validate(values)
    except ValidationError as exc:
        raise MagicUsageError(f"cellscale.map: {explain(exc)}") from None
    try:
        blob = pack_inputs({FN_NAME: fn}, [FN_NAME])
    except InputError as exc:
        words = (
            str(exc).replace(f"--inputs {FN_NAME}:", "fn:").replace("--inputs are", "fn, with what it refers to, is")
        )
        raise InputError(f"cellscale.map: {words}") from None
    plan = SweepPlan(args, MAP_SOURCE, grid, blob)
    sweep = plan.submit(client or Client.from_env(), expand_result=True)
    print(announce(sweep))
    return sweep


def _name_of(fn: Callable) -> str:
    """The job's name: the function's, where it makes a name ("map" for a lambda)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "", getattr(fn, "__name__", ""))[:62].lstrip("._-")
    return name or "map"
