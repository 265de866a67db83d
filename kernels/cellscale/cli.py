"""`cellscale`: the command line.

cellscale serve [control-plane options]      run a control plane (see --help-all)
cellscale dev slurm up|down|status           a real multi-node Slurm dev cluster on this machine
cellscale dev users NAME...                  the demo's researchers as Unix users (root)
cellscale submit FILE [%%cluster options]    run a Python file as a job (follows it unless --detach)
cellscale submit FILE --sweep GRID.csv [--max-parallel N] [--per-task K] [%%cluster options]
                                             run it once per row of GRID.csv (a sweep; one job)
cellscale list [--scope mine|tenant|all]
cellscale status ID | logs ID [-f] | cancel ID
cellscale promote ID --asset NAME [--partitions daily|...] [--start YYYY-MM-DD] [--deps A,B] [--dir DIR] [--force]
                                             a job that succeeded as a Dagster asset module (DIR/NAME.py)

Arguments after FILE reach the %%cluster parser as the shell split them (`--env "MSG=hello
world"` is one value). A refusal is one line on stderr, never a traceback: exit 2 for what the
caller must change (a bad option, an unreadable file, a request the control plane refused),
1 for a failure (the control plane unreachable or failing, a job that did not succeed).

A sweep's CSV names the parameters in its header; each row is a point, its values read as int,
else float, else left as text (an empty field is None), bound as variables in the file's code
(and `__point__`, the dict). Followed, it shows one progress line on stderr and exits 0 if
every point succeeded, else 1 after listing the failed points' errors (at most 10).
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
from pathlib import Path

import httpx

from cellscale.client import ApiError, Client
from cellscale.display import TextView, environment_lines, job_table, status_line
from cellscale.magicargs import MagicArgs, MagicUsageError, TooBig, parse_args
from cellscale.promote import add_arguments, promote_args
from cellscale.titles import printable
from cellscale.vocabulary import Phase

SWEEP_HINT = "a sweep: cellscale submit FILE --sweep GRID.csv (e.g. --sweep grid.csv --max-parallel 8)"
MAX_FAILURES_SHOWN = 10


class UsageError(Exception):
    """Something the caller must change (exit 2)."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        os.execv(sys.executable, [sys.executable, "-m", "cellscale_hub", *argv[1:]])
    if argv[:2] in (["dev", "slurm"], ["dev", "users"]):
        os.execv(sys.executable, [sys.executable, "-m", f"cellscale_hub.dev.{argv[1]}", *argv[2:]])
    parser = _parser()
    args, rest = parser.parse_known_args(argv)
    if args.command != "submit" and rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.run(args, rest)
    except TooBig as exc:
        return _fail(_too_big(exc), 2)
    except (MagicUsageError, UsageError) as exc:
        return _fail(str(exc), 2)
    except ApiError as exc:
        return _fail(str(exc), 2 if exc.status < 500 else 1)
    except httpx.HTTPError as exc:
        return _fail(f"cannot reach the control plane: {exc}", 1)
    except RuntimeError as exc:
        return _fail(str(exc), 1)
    except KeyboardInterrupt:
        print("\ncellscale: detached; the job keeps running", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `cellscale logs ID | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing left to flush at exit
        return 141  # as a shell reports a process ended by SIGPIPE
    except Exception as exc:  # a bug: still one line (CELLSCALE_DEBUG=1 shows the traceback)
        if os.environ.get("CELLSCALE_DEBUG"):
            raise
        return _fail(f"internal error: {type(exc).__name__}: {exc} (CELLSCALE_DEBUG=1 shows where)", 1)


def _fail(message: str, code: int) -> int:
    print(f"cellscale: {' '.join(message.split())}", file=sys.stderr)
    return code


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="cellscale", description="Run notebook cells and scripts as cluster jobs.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run a control plane (python -m cellscale_hub)")
    sub.add_parser("dev", help="dev setup: cellscale dev slurm up|down|status; cellscale dev users NAME...")
    s = sub.add_parser(
        "submit", help="run a Python file as a job (--sweep GRID.csv: once per row); options as %%%%cluster"
    )
    s.add_argument("file", type=Path)
    s.add_argument("options", nargs=argparse.REMAINDER, help="%%%%cluster options, passed through as given")
    s.set_defaults(run=_submit)
    ls = sub.add_parser("list", help="your jobs (or your desk's)")
    ls.add_argument("--scope", choices=["mine", "tenant", "all"], default="mine")
    ls.add_argument("--phase")
    ls.set_defaults(run=_list)
    for name, run in (("status", _status), ("logs", _logs), ("cancel", _cancel)):
        c = sub.add_parser(name)
        c.add_argument("job_id")
        if name == "logs":
            c.add_argument("-f", "--follow", action="store_true")
        c.set_defaults(run=run)
    pr = sub.add_parser("promote", help="a job that succeeded as a Dagster asset module: DIR/NAME.py (+ NAME.inputs)")
    add_arguments(pr)
    pr.set_defaults(run=_promote)
    return p


def _too_big(exc: TooBig) -> str:
    """A size past the spec's bounds, with what the queue can ever get (as the magic says it)."""
    try:
        return exc.advice(Client.from_env().limits(exc.asked.queue, exc.asked.backend))
    except (ApiError, RuntimeError, httpx.HTTPError):
        return str(exc)


def _submit(args, rest: list[str]) -> int:
    grid, argv = _take_sweep([*args.options, *rest])
    if grid is not None:
        return _submit_sweep(args.file, grid, _titled(parse_args(argv, sweep=True), args.file))
    options = _titled(parse_args(argv, sweep_hint=SWEEP_HINT), args.file)
    spec = options.to_spec(_source(args.file))
    if options.inputs:
        raise MagicUsageError("--inputs names notebook variables; a script reads its own data")
    client = Client.from_env()
    if options.dry_run:
        print(client.render(spec).script, end="")
        print("\n".join(environment_lines(spec.env, client.holds_token)), file=sys.stderr)
        return 0
    job = client.submit(spec)
    print(job.id)
    if options.detach:
        return 0
    view = TextView(sys.stderr)
    for chunk in client.follow_logs(job.id):
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    job = client.get(job.id)
    view.status(job)
    return 0 if job.phase is Phase.SUCCEEDED else 1


def _titled(options: MagicArgs, file: Path) -> MagicArgs:
    """Named after the file it runs (`train.py`) unless --name names it."""
    if options.name is not None:
        return options
    return options.model_copy(update={"title": printable(file.name) or None})


def _take_sweep(argv: list[str]) -> tuple[Path | None, list[str]]:
    """`--sweep GRID.csv` (or `--sweep=GRID.csv`) out of the options, and the rest for %%cluster's parser."""
    grid, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--sweep" or arg.startswith("--sweep="):
            if grid is not None:
                raise UsageError("--sweep is given twice: one grid per sweep")
            value = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            if not value:
                raise UsageError("--sweep needs a CSV file: its header names the parameters, each row is a point")
            grid = Path(value)
            i += 1 if "=" in arg else 2
            continue
        rest.append(arg)
        i += 1
    return grid, rest


def _submit_sweep(file: Path, grid: Path, options: MagicArgs) -> int:
    from cellscale.points import GridError
    from cellscale.sweep import SweepPlan, announce

    if options.over or options.bind_as:
        raise UsageError("--over and --as name notebook variables: on the command line the grid is --sweep GRID.csv")
    if options.inputs:
        raise MagicUsageError("--inputs names notebook variables; a script reads its own data")
    try:
        plan = SweepPlan(options, _source(file), read_grid(grid))
    except GridError as exc:
        raise UsageError(f"{grid}: {exc}") from None
    client = Client.from_env()
    if options.dry_run:
        print(client.render(plan.spec).script, end="")
        print("\n".join(environment_lines(plan.spec.env, client.holds_token)), file=sys.stderr)
        return 0
    sweep = plan.submit(client, fetch_results=False, stream=sys.stderr)
    print(sweep.job_id)
    print(announce(sweep), file=sys.stderr)
    if options.detach:
        sweep.close()
        return 0
    sweep.wait()
    progress = sweep.progress
    if progress.done + progress.cached == progress.points:
        return 0
    failed = sweep.failed()
    if len(failed):
        print(f"cellscale: {len(failed)} of {progress.points} points failed:", file=sys.stderr)
        params = list(failed.columns[: failed.columns.get_loc("attempt")])
        for index, row in failed.head(MAX_FAILURES_SHOWN).iterrows():
            values = ", ".join(f"{name}={row[name]!r}" for name in params)
            print(f"  point {index} ({values}): {row['error'] or row['fault'] or 'failed'}", file=sys.stderr)
        if len(failed) > MAX_FAILURES_SHOWN:
            print(f"  ... and {len(failed) - MAX_FAILURES_SHOWN} more", file=sys.stderr)
    missing = progress.points - progress.done - progress.cached - progress.failed
    if missing:
        print(
            f"cellscale: {missing} of {progress.points} points did not run ({sweep.job.phase.value})", file=sys.stderr
        )
    return 1


def read_grid(path: Path) -> list[dict]:
    """A sweep's points from a CSV file: the header names the parameters; each value is an
    int, else a float, else the text itself; an empty field is None."""
    text = _source(path).removeprefix("\ufeff")  # a spreadsheet's byte-order mark
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if not header or not any(name.strip() for name in header):
        raise UsageError(f"{path} has no header line: its first line names the parameters (e.g. lr,seed)")
    names = [name.strip() for name in header]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise UsageError(f"{path}: the header names {', '.join(twice)} twice")
    points = []
    for row in reader:
        if not any(field.strip() for field in row):
            continue  # a blank line
        if len(row) != len(names):
            raise UsageError(
                f"{path}, line {reader.line_num}: {len(row)} values for the {len(names)} parameters of the header"
            )
        points.append({name: _csv_value(field) for name, field in zip(names, row, strict=True)})
    if not points:
        raise UsageError(f"{path} has a header but no rows: each row is a point of the sweep")
    return points


def _csv_value(field: str) -> int | float | str | None:
    text = field.strip()
    if not text:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return field


def _source(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _list(args, _rest) -> int:
    jobs = Client.from_env().list(scope=args.scope, phase=args.phase).items
    for line in job_table(jobs):
        print(line)
    if not jobs:  # said on stderr: a script reading the list reads nothing
        said = f"no {args.phase.lower()} jobs" if args.phase else "no jobs yet; submit one: cellscale submit train.py"
        print(said, file=sys.stderr)
    return 0


def _status(args, _rest) -> int:
    job = Client.from_env().get(args.job_id)
    print(job.model_dump_json(indent=2))
    return 0


def _logs(args, _rest) -> int:
    client = Client.from_env()
    if args.follow:
        for chunk in client.follow_logs(args.job_id):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    else:
        sys.stdout.write(client.logs(args.job_id).text)
    return 0


def _promote(args, _rest) -> int:
    print(promote_args(Client.from_env(), args))
    return 0


def _cancel(args, _rest) -> int:
    print(status_line(Client.from_env().cancel(args.job_id)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
