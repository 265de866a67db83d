"""`%cluster promote ID --asset NAME` (and `cellscale promote`): a job that succeeded becomes a
Dagster asset module, NAME.py, that reruns the same cell with the same spec and, saved beside it
as NAME.inputs, the same inputs bundle (`cellscale.dagster.spec_asset` re-uploads it; content-
addressed, so its hash must be the spec's).

The module is written the way `ruff format` writes it at its default line length (88), and stays
so at a longer one: a collection that does not fit is split one item a line with a trailing comma.
"""

from __future__ import annotations

import argparse
import hashlib
import keyword
import re
import shlex
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

from cellscale.client import ApiError, Client
from cellscale.magicargs import MagicUsageError
from cellscale.spec import JobView
from cellscale.vocabulary import Phase

LINE = 88
PARTITIONS = {
    "hourly": "HourlyPartitionsDefinition",
    "daily": "DailyPartitionsDefinition",
    "weekly": "WeeklyPartitionsDefinition",
    "monthly": "MonthlyPartitionsDefinition",
}
ASSET = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A Python identifier Dagster also takes as an asset name (ASCII letters, digits, _)."""
ASSET_KEY = re.compile(r"[A-Za-z0-9_]+(/[A-Za-z0-9_]+)*")
TAKEN = frozenset({"SOURCE", "SPEC", "Path", "dagster", "spec_asset", "cellscale", "pathlib"})
"""Names the module binds or imports: an asset named so would shadow them."""
USAGE = (
    "%cluster promote ID --asset NAME [--partitions hourly|daily|weekly|monthly] [--start YYYY-MM-DD] "
    "[--deps A,B] [--dir DIR] [--force]"
)


# -- the command line ---------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="ID", help="a job that succeeded")
    parser.add_argument("--asset", required=True, metavar="NAME", help="the asset's name, also its module's: NAME.py")
    parser.add_argument("--partitions", choices=list(PARTITIONS), help="a time-partitioned asset")
    parser.add_argument("--start", metavar="YYYY-MM-DD", help="its first partition's date (default: the job's)")
    parser.add_argument("--deps", default="", metavar="A,B", help="upstream asset keys (comma-separated)")
    parser.add_argument("--dir", type=Path, default=Path(), help="where to write NAME.py (default: here)")
    parser.add_argument("--force", action="store_true", help="overwrite NAME.py and NAME.inputs")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise MagicUsageError(f"%cluster promote: {message}; usage: {USAGE}")


def parse_line(text: str) -> argparse.Namespace:
    """What follows `%cluster promote`, split as a shell would (`--dir "my assets"`)."""
    try:
        argv = shlex.split(text)
    except ValueError as exc:
        raise MagicUsageError(f"cannot read the %cluster promote line: {exc}") from None
    parser = _Parser(prog="%cluster promote", add_help=False, allow_abbrev=False)
    add_arguments(parser)
    return parser.parse_args(argv)


def promote_args(client: Client, args: argparse.Namespace) -> str:
    deps = [name.strip() for name in args.deps.split(",") if name.strip()]
    return promote(
        client,
        args.job_id,
        args.asset,
        partitions=args.partitions,
        start=args.start,
        deps=deps,
        directory=args.dir,
        force=args.force,
    )


# -- writing the files -----------------------------------------------------------------------------
def promote(
    client: Client,
    job_id: str,
    asset: str,
    *,
    partitions: str | None = None,
    start: str | None = None,
    deps: list[str] | None = None,
    directory: Path = Path(),
    force: bool = False,
) -> str:
    """Write DIRECTORY/ASSET.py, and ASSET.inputs when the job had inputs; returns a line saying so."""
    deps = deps or []
    _check_options(asset, partitions, start, deps)
    job = client.get(job_id)
    _check_promotable(job)
    module, inputs = directory / f"{asset}.py", directory / f"{asset}.inputs"
    sha = job.spec.inputs_sha256
    for path in [module, inputs] if sha else [module]:
        if path.exists() and not force:
            raise MagicUsageError(f"{path} exists: pick another --asset, or add --force to overwrite it")
    bundle = _bundle(client, job) if sha else None
    text = module_text(job, asset, partitions, start, deps, inputs.name if sha else None)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if bundle is not None:
            inputs.write_bytes(bundle)
        module.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise MagicUsageError(f"cannot write {exc.filename or directory}: {exc.strerror or exc}") from None
    also = f" and {inputs.name} (its inputs bundle)" if sha else ""
    return (
        f"wrote {module}{also}: asset {asset} reruns job {job.id}'s cell; `from {asset} import {asset}` "
        "in your Dagster definitions, or materialize it as its docstring shows"
    )


def _check_options(asset: str, partitions: str | None, start: str | None, deps: list[str]) -> None:
    if not ASSET.fullmatch(asset) or keyword.iskeyword(asset):
        raise MagicUsageError(
            f"--asset {asset!r} cannot name an asset and its module: use letters, digits and _ (not first a "
            f"digit, not a Python keyword), e.g. --asset {_suggest(asset)}"
        )
    if asset in TAKEN:
        raise MagicUsageError(f"--asset {asset} is a name the module itself uses: e.g. --asset {_suggest(asset)}")
    if partitions is not None and partitions not in PARTITIONS:
        raise MagicUsageError(f"--partitions {partitions!r}: use {', '.join(PARTITIONS)}")
    if start is not None:
        if partitions is None:
            raise MagicUsageError(f"--start {start} dates the first partition: add --partitions daily (or hourly, ...)")
        _date(start)
    for key in deps:
        if not ASSET_KEY.fullmatch(key):
            raise MagicUsageError(
                f"--deps: {key!r} is not an asset key (letters, digits and _, parts joined by /), e.g. --deps features"
            )


def _suggest(asset: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", asset).strip("_") or "asset"
    name = f"asset_{name}" if name[0].isdigit() else name
    return f"{name}_asset" if keyword.iskeyword(name) or name in TAKEN else name


def _date(text: str) -> date:
    try:
        return datetime.strptime(text, "%Y-%m-%d").date()
    except ValueError:
        raise MagicUsageError(f"--start {text!r} is not a date: write it YYYY-MM-DD, e.g. --start 2024-05-01") from None


def _check_promotable(job: JobView) -> None:
    if job.spec.sweep is not None:
        raise MagicUsageError(
            f"promote works on single jobs; a sweep ({job.id} runs its cell once per point of a grid) becomes an "
            "asset with @cellscale_asset(sweep=GRID) from cellscale.dagster"
        )
    if job.phase is Phase.SUCCEEDED:
        return
    todo = (
        "fix the cell, run it again and promote that job"
        if job.phase.terminal
        else f"wait for it to end (%cluster attach {job.id}) and promote it then"
    )
    raise MagicUsageError(f"job {job.id} is {job.phase.value}: promote takes a job that SUCCEEDED; {todo}")


def _bundle(client: Client, job: JobView) -> bytes:
    sha = job.spec.inputs_sha256
    try:
        data = client.download_inputs(sha)
    except ApiError as exc:
        if exc.status != 404:
            raise
        raise MagicUsageError(
            f"cannot read job {job.id}'s inputs bundle: {exc}; run the cell again and promote the new job"
        ) from None
    if hashlib.sha256(data).hexdigest() != sha:
        raise MagicUsageError(f"job {job.id}'s inputs bundle came back with another sha256 than {sha}; try again")
    return data


# -- the module ------------------------------------------------------------------------------------
def module_text(
    job: JobView, asset: str, partitions: str | None, start: str | None, deps: list[str], inputs_file: str | None
) -> str:
    """The module of asset `asset` rerunning `job` (`inputs_file`: its bundle's file, beside the
    module); `start`: the first partition's date, the job's when None."""
    first = _date(start) if start else job.created_at.date()
    options: dict[str, Any] = {}
    if inputs_file:
        options["inputs_file"] = _Call("Path(__file__).with_name", (inputs_file,))
    if partitions:
        start_date = f"{first}-00:00" if partitions == "hourly" else first.isoformat()
        options["partitions_def"] = _Call(f"dagster.{PARTITIONS[partitions]}", (), {"start_date": start_date})
    if deps:
        options["deps"] = list(deps)
    imports = [
        *(["from pathlib import Path", ""] if inputs_file else []),
        *(["import dagster"] if partitions else []),
        "from cellscale.dagster import spec_asset",
    ]
    spec = job.spec.model_dump(mode="json", exclude_defaults=True, exclude={"origin", "sweep"})
    spec["source"] = _Code("SOURCE")
    call = _Call("spec_asset", (asset, _Code("SPEC")), options)
    parts = [
        _docstring(job, asset, _first_key(partitions, first) if partitions else None, inputs_file),
        "\n".join(imports),
        _lint_free(f"SOURCE = {_source(job.spec.source)}"),
        f"SPEC = {_render(spec, 0, 0)}",
        f"{asset} = {_render(call, 0, 0 if options else LINE - len(asset) - 3)}",  # each option a line
    ]
    return "\n\n".join(parts) + "\n"


def _docstring(job: JobView, asset: str, partition_key: str | None, inputs_file: str | None) -> str:
    lines = [
        f'"""Dagster asset `{asset}`, promoted from cellscale job {job.id}.',
        "",
        f'That job ("{job.name}", {_word(job.owner)}\'s, submitted on {job.created_at:%Y-%m-%d}) succeeded; '
        "materializing the",
    ]
    if inputs_file:
        lines += [
            "asset reruns its cell on cellscale with the same source (SOURCE), spec (SPEC) and",
            "inputs: the job's pickled inputs bundle, re-uploaded (content-addressed: its sha256",
            f"must be SPEC's) from the file beside this one, {inputs_file}.",
        ]
    else:
        lines += ["asset reruns its cell on cellscale with the same source (SOURCE) and spec (SPEC)."]
    if partition_key:
        lines += ["A partition's job finds its partition key in the environment variable", "DAGSTER_PARTITION_KEY."]
    key = [f'        partition_key="{partition_key}",'] if partition_key else []
    lines += [
        "",
        "    import dagster",
        "    from cellscale.dagster import CellscaleResource",
        f"    from {asset} import {asset}",
        "",
        "    dagster.materialize(",
        f"        [{asset}],",
        *key,
        '        resources={"cellscale": CellscaleResource()},',
        "    )",
        '"""',
    ]
    return _lint_free("\n".join(lines))


def _word(text: str) -> str:
    """A user name as it reads, unless a docstring could not hold it as it is."""
    return text if re.fullmatch(r"[\w.@+-]+", text) else _string(text)


def _first_key(partitions: str, start: date) -> str:
    """The first partition Dagster makes from `start` (a week starts on Sunday, a month on the 1st)."""
    if partitions == "hourly":
        return f"{start}-00:00"
    if partitions == "weekly":
        start += timedelta(days=(6 - start.weekday()) % 7)
    if partitions == "monthly" and start.day != 1:
        start = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    return start.isoformat()


# -- Python source, as ruff format writes it ------------------------------------------------------
@dataclass(frozen=True)
class _Code:
    text: str


@dataclass(frozen=True)
class _Call:
    func: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


def _render(value: Any, indent: int, room: int) -> str:
    """`value` as source with `room` columns left on its line: flat when it fits, else one item a
    line, each with a trailing comma (room 0: always split); an item too long even so (a long
    string) gets a `# noqa: E501`."""
    if isinstance(value, _Code):
        return value.text
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, dict):
        opening, closing, items = "{", "}", [(f"{_string(k)}: ", v) for k, v in value.items()]
    elif isinstance(value, list):
        opening, closing, items = "[", "]", [("", v) for v in value]
    elif isinstance(value, _Call):
        opening, closing = f"{value.func}(", ")"
        items = [("", v) for v in value.args] + [(f"{k}=", v) for k, v in value.kwargs.items()]
    else:
        return repr(value)
    flat = opening + ", ".join(prefix + _render(v, 0, LINE) for prefix, v in items) + closing
    if len(flat) <= room and "\n" not in flat:
        return flat
    inner = " " * (indent + 4)
    lines = [f"{inner}{prefix}{_render(v, indent + 4, LINE - len(inner + prefix) - 1)}," for prefix, v in items]
    lines = [f"{line}  # noqa: E501" if len(line) > LINE and "\n" not in line else line for line in lines]
    return "\n".join([opening, *lines, " " * indent + closing])


def _string(text: str) -> str:
    """A one-line string literal; double quotes unless more of them are inside (as ruff format)."""
    quote = "'" if text.count('"') > text.count("'") else '"'
    body = "".join("\\" + c if c in ("\\", quote) else c if c.isprintable() else repr(c)[1:-1] for c in text)
    return quote + body + quote


def _source(source: str) -> str:
    """The cell as it reads in the notebook, a triple-quoted string (raw when it has backslashes),
    when one holds it exactly; else one escaped line."""
    exact = all(c.isprintable() or c in "\n\t" for c in source)
    if not exact or '"""' in source or source.endswith(('"', "\\")):
        return _string(source)
    return f'r"""{source}"""' if "\\" in source else f'"""\\\n{source}"""'


def _lint_free(statement: str) -> str:
    """`statement` with a `# noqa` for what ruff would flag in a string's lines that cannot change:
    the cell's as it ran (long lines, trailing whitespace), long names in the docstring."""
    lines = statement.split("\n")
    flagged = {
        "E501": any(len(line) > LINE for line in lines),
        "W291": any(line.strip() and line != line.rstrip() for line in lines),
        "W293": any(line and not line.strip() for line in lines),
    }
    codes = [code for code, hit in flagged.items() if hit]
    return f"{statement}  # noqa: {', '.join(codes)}" if codes else statement
