"""`cellscale`: the command line.

cellscale serve [control-plane options]      run a control plane (see --help-all)
cellscale dev slurm up|down|status           a real multi-node Slurm dev cluster on this machine
cellscale dev users NAME...                  the demo's researchers as Unix users (root)
cellscale submit FILE [%%cluster options]    run a Python file as a job (follows it unless --detach)
cellscale list [--scope mine|tenant|all]
cellscale status ID | logs ID [-f] | cancel ID

Arguments after FILE reach the %%cluster parser as the shell split them (`--env "MSG=hello
world"` is one value). A refusal is one line on stderr, never a traceback: exit 2 for what the
caller must change (a bad option, an unreadable file, a request the control plane refused),
1 for a failure (the control plane unreachable or failing, a job that did not succeed).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import httpx

from cellscale.client import ApiError, Client
from cellscale.display import TextView, status_line
from cellscale.magicargs import MagicUsageError, parse_args
from cellscale.vocabulary import Phase


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
    s = sub.add_parser("submit", help="run a Python file as a job; options as %%%%cluster")
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
    return p


def _submit(args, rest: list[str]) -> int:
    options = parse_args([*args.options, *rest])
    spec = options.to_spec(_source(args.file))
    if options.inputs:
        raise MagicUsageError("--inputs names notebook variables; a script reads its own data")
    client = Client.from_env()
    if options.dry_run:
        print(client.render(spec).script, end="")
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


def _source(path: Path) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _list(args, _rest) -> int:
    for job in Client.from_env().list(scope=args.scope, phase=args.phase).items:
        print(status_line(job))
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


def _cancel(args, _rest) -> int:
    print(status_line(Client.from_env().cancel(args.job_id)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
