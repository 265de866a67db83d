"""`%%cluster` and `%cluster`: run a cell as a cluster job, and manage jobs.

%%cluster --gpus 2 --launcher torchrun --outputs loss
...cell...

%%cluster map --over grid --max-parallel 8 --outputs loss [--as sweep]
...cell, run once per point of grid, its values bound as variables...

%cluster list | status ID | attach ID | logs ID | cancel ID
%cluster promote ID --asset NAME [--partitions daily] ...   (the job's cell as a Dagster asset module)
"""

from __future__ import annotations

import queue
import threading
import time

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class

from cellscale import promote
from cellscale.bundle import InputError, bundle_sha256, pack_inputs
from cellscale.client import RETRYABLE, ApiError, Client
from cellscale.display import describe, environment_lines, job_table, make_view, status_line
from cellscale.magicargs import MagicArgs, MagicUsageError, TooBig, parse_line, usage
from cellscale.points import GridError
from cellscale.spec import JobSpec, JobView, Phase
from cellscale.sweep import Sweep, SweepPlan, announce
from cellscale.titles import cell_title

NO_JOBS = {
    "mine": "no jobs yet; run a cell with %%cluster (e.g. %%cluster --gpus 1)",
    "tenant": "no jobs on your desk yet",
    "all": "no jobs yet",
}
"""What `%cluster list [SCOPE]` says when there is nothing to list."""

STATUS_REFRESH_SECONDS = 1.0
RECONNECT_SECONDS = 180.0


class JobFailed(Exception):
    """The job ended without succeeding. Shown without a Python traceback of the magic."""

    def __init__(self, job: JobView):
        super().__init__(f"job {job.id} {job.phase.value.lower()}: {job.reason}")
        self.job = job

    def _render_traceback_(self) -> list[str]:
        return [f"\x1b[31m{self}\x1b[0m", f"see the log above, or: %cluster logs {self.job.id}"]


@magics_class
class ClusterMagics(Magics):
    def __init__(self, shell, client: Client | None = None):
        super().__init__(shell)
        self._client = client

    @property
    def client(self) -> Client:
        if self._client is None:
            try:
                self._client = Client.from_env()
            except (RuntimeError, ApiError) as exc:
                raise UsageError(str(exc)) from None
        return self._client

    @line_cell_magic
    def cluster(self, line: str, cell: str | None = None):
        try:
            if cell is None:
                return self._command(line)
            return self._run_cell(line, cell)
        except TooBig as exc:
            raise UsageError(self._too_big(exc)) from None
        except (MagicUsageError, InputError, GridError) as exc:
            raise UsageError(str(exc)) from None
        except ApiError as exc:
            raise UsageError(f"the control plane refused: {exc}") from None

    def _too_big(self, exc: TooBig) -> str:
        """The refusal of a size above the spec's bounds, with what the queue can ever give
        (the static bound when the control plane does not answer)."""
        try:
            return exc.advice(self.client.limits(exc.asked.queue, exc.asked.backend))
        except (ApiError, UsageError, *RETRYABLE):
            return str(exc)

    # -- %%cluster ---------------------------------------------------------------------------
    def _run_cell(self, line: str, cell: str):
        args = parse_line(line)
        if args.name is None:  # named by where it came from: the notebook and cell, or its first line
            args = args.model_copy(update={"title": cell_title(self.shell, cell)})
        return self._run_map(args, cell) if args.sweep else self._run_job(args, cell)

    def _run_job(self, args: MagicArgs, cell: str):
        """`%%cluster`: ONE job; shows it live until it ends (unless --detach)."""
        blob = pack_inputs(self.shell.user_ns, args.inputs) if args.inputs else None
        inputs_sha256 = bundle_sha256(blob) if blob is not None else None
        spec = args.to_spec(cell, inputs_sha256)  # validates everything before anything is sent
        if args.dry_run:
            return self._dry_run(spec)
        if blob is not None:
            self.client.upload_inputs(blob)
        job = self.client.submit(spec)
        if job.estimate:
            print(f"[cellscale] {job.id}: {job.estimate.words}")
        if args.detach:
            print(f"[cellscale] submitted {job.id}; follow it with: %cluster attach {job.id}")
            return None
        return self.attach(job.id)

    def _run_map(self, args: MagicArgs, cell: str):
        """`%%cluster map`: ONE job running the cell once per point of --over's grid; returns its
        Sweep handle at once (the cell's Out shows it live)."""
        if not args.over:
            raise MagicUsageError(
                "%%cluster map needs --over GRID: the notebook variable holding the grid (a list of dicts, "
                "a DataFrame, or a dict of lists), e.g. %%cluster map --over grid --max-parallel 8"
            )
        if args.over not in self.shell.user_ns:
            raise MagicUsageError(
                f"--over {args.over}: no variable {args.over!r} in this notebook; "
                "run the cell that defines the grid first"
            )
        blob = pack_inputs(self.shell.user_ns, args.inputs) if args.inputs else None
        try:  # validates everything before anything is sent
            plan = SweepPlan(args, cell, self.shell.user_ns[args.over], blob)
        except GridError as exc:
            raise MagicUsageError(f"--over {args.over}: {exc}") from None
        if args.dry_run:
            return self._dry_run(plan.spec)
        sweep = plan.submit(self.client)
        print(announce(sweep))
        if args.bind_as:
            self.shell.user_ns[args.bind_as] = sweep
        if args.detach:
            if not args.bind_as:
                sweep.close()  # nothing holds it: no need to follow
            print(f"[cellscale] follow it with: {args.bind_as or f'%cluster attach {sweep.job_id}'}")
            return None
        return sweep

    def _dry_run(self, spec: JobSpec) -> None:
        """The exact script the backend would run, what it would cost, and the environment every
        rank would get (secrets as ****); nothing is submitted."""
        rendered = self.client.render(spec)
        print(rendered.script)
        if rendered.estimate:
            print(f"[cellscale] would cost {rendered.estimate.words}")
        print("\n".join(environment_lines(spec.env, self.client.holds_token)))

    def attach(self, job_id: str):
        """Show the job live until it ends, then bring its outputs into the notebook. A sweep:
        its progress line until it ends, then its summary; returns its Sweep handle."""
        job = self.client.get(job_id)
        if job.sweep is not None or job.spec.sweep is not None:
            return self._attach_sweep(job)
        view = make_view(self.shell)
        chunks: queue.Queue = queue.Queue()
        stop = threading.Event()
        follower = threading.Thread(target=self._follow, args=(job_id, chunks, stop), daemon=True)
        follower.start()
        view.status(job)
        refreshed = time.monotonic()
        try:
            while True:
                try:
                    item = chunks.get(timeout=0.25)
                except queue.Empty:
                    item = None
                if isinstance(item, Exception):
                    raise item
                if item is not None and item.text:
                    view.log(item.text)
                done = item is not None and item.complete
                if done or time.monotonic() - refreshed > STATUS_REFRESH_SECONDS:
                    job, refreshed = self._refresh(job, wait=done), time.monotonic()
                    view.status(job)
                if done:
                    break
        except KeyboardInterrupt:
            stop.set()
            print(f"\n[cellscale] detached; {job_id} keeps running. Re-attach with: %cluster attach {job_id}")
            return None
        finally:
            stop.set()
            view.close()
        return self._finish(job)

    def _attach_sweep(self, job: JobView) -> Sweep:
        sweep = Sweep.attach(self.client, job)
        try:
            sweep._wait(None)
        except KeyboardInterrupt:
            print(f"[cellscale] detached; {job.id} keeps running. Re-attach with: %cluster attach {job.id}")
            return sweep
        sweep._mark_shown(self.shell)  # the cell's Out is this handle: not shown twice
        p = sweep.progress
        hint = "; .failed() lists the failures, .retry() runs them again" if p.failed else ""
        print(f"[cellscale] {sweep.line()}{hint}")
        return sweep

    def _refresh(self, job: JobView, wait: bool) -> JobView:
        """The job's newest state; while the control plane restarts, the last one seen
        (or, when `wait`, keep trying for as long as the log stream would)."""
        deadline = time.monotonic() + (RECONNECT_SECONDS if wait else 0)
        while True:
            try:
                return self.client.get(job.id)
            except RETRYABLE:
                if time.monotonic() >= deadline:
                    if wait:
                        raise
                    return job
                time.sleep(1.0)

    def _follow(self, job_id: str, chunks: queue.Queue, stop: threading.Event) -> None:
        try:
            for chunk in self.client.follow_logs(job_id):
                if stop.is_set():
                    return
                chunks.put(chunk)
        except Exception as exc:  # noqa: BLE001 - handed to the cell's thread to report
            chunks.put(exc)

    def _finish(self, job: JobView):
        if job.cost:
            estimated = f"; estimated {job.estimate.words.split(' (')[0]}" if job.estimate else ""
            print(f"[cellscale] {job.id} cost {job.cost.words}{estimated}")
        if job.phase is not Phase.SUCCEEDED:
            raise JobFailed(job)
        if job.spec.outputs:
            values = self.client.result(job.id)
            self.shell.user_ns.update(values)
            print(f"[cellscale] {job.id} succeeded; set {', '.join(values)}")
        return None

    # -- %cluster COMMAND ----------------------------------------------------------------------
    def _command(self, line: str):
        words = line.split()
        if not words:
            raise MagicUsageError(
                f"%cluster list | status ID | attach ID | logs ID | cancel ID | promote ID --asset NAME; "
                f"%%cluster {usage()}"
            )
        verb, rest = words[0], words[1:]
        if verb == "promote":
            args = promote.parse_line(line.split(None, 1)[1] if rest else "")
            print(f"[cellscale] {promote.promote_args(self.client, args)}")
            return None
        if verb == "list":
            scope = rest[0] if rest else "mine"
            jobs = self.client.list(scope=scope).items
            for line in job_table(jobs):
                print(line)
            if not jobs:
                print(NO_JOBS.get(scope, f"no jobs in scope {scope}"))
            return None
        if verb in {"status", "attach", "logs", "cancel"}:
            if len(rest) != 1:
                raise MagicUsageError(f"%cluster {verb} needs one job id, e.g. %cluster {verb} cs-0123abcd4567")
            job_id = rest[0]
            if verb == "attach":
                return self.attach(job_id)
            if verb == "logs":
                print(self.client.logs(job_id).text, end="")
            elif verb == "cancel":
                print(f"[cellscale] {status_line(self.client.cancel(job_id))} (cancel requested)")
            else:
                self._print_status(job_id)
            return None
        raise MagicUsageError(f"unknown %cluster command {verb!r}: use list, status, attach, logs, cancel or promote")

    def _print_status(self, job_id: str) -> None:
        print(describe(self.client.get(job_id), self.client.checkpoints(job_id)))
        for event in self.client.events(job_id)[-10:]:
            change = f"{event.from_phase or ''} → {event.to_phase}" if event.to_phase else event.kind
            print(f"  {event.at:%H:%M:%S} {change} {event.reason or ''} {event.message or ''}".rstrip())
