"""Parse the `%%cluster` line into a validated model, then into a JobSpec.

Everything here runs before anything is sent: a bad flag is an error that says what to
change, and nothing is created.

`%%cluster map --over GRID ...` is the same line with `map` first: a sweep, the cell run once
per point of GRID. Its own flags (--over, --max-parallel, --per-task, --as) belong to it alone.
"""

from __future__ import annotations

import argparse
import difflib
import keyword
import shlex

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cellscale.spec import JobLimits, JobSpec, Resources, Retries, Sweep, parse_memory_mb
from cellscale.titles import slug
from cellscale.vocabulary import BurstPolicy, DataMode, Launcher
from cellscale.wire import explain


class MagicUsageError(ValueError):
    pass


class TooBig(MagicUsageError):
    """A size flag above what any job may ask for. The spec knows only those static bounds;
    what to ask for instead is what the user's queue can ever get, which the control plane
    knows (`advice`, given its JobLimits)."""

    def __init__(self, args: MagicArgs, flag: str, most: int):
        self.asked, self.flag, self.most = args, flag, most
        super().__init__(self.advice(None))

    def typed(self) -> str:
        """The flag as the user typed it: `--gpus 999`."""
        value = getattr(self.asked, {"--gpus-per-node": "gpus_per_node"}.get(self.flag, self.flag[2:]))
        return f"{self.flag} {value}"

    def advice(self, limits: JobLimits | None) -> str:
        """`--gpus 999 is more than your queue can ever get (4 GPUs in all); ask for at most --gpus 4`;
        without the queue's limits, the static bound."""
        most = self._queue_most(limits) if limits is not None else None
        if most is not None and most < self.most:
            return (
                f"{self.typed()} is more than queue {limits.queue} can ever get; ask for at most {self.flag} "
                f"{self._value(most)}"
            )
        return f"{self.typed()} is more than one job may ask for; ask for at most {self.flag} {self._value(self.most)}"

    def _queue_most(self, limits: JobLimits) -> int | None:
        """The flag's largest value whose job stays within the queue's limits (None: unbounded)."""
        res = self.asked.resources(bounded=False)
        if self.flag in ("--gpus", "--gpus-per-node"):
            total = limits.gpus
            return None if total is None else (total if self.flag == "--gpus" else total // res.nodes)
        if self.flag == "--nodes":
            fits = [
                limits.gpus // res.gpus_per_node if res.gpus_per_node and limits.gpus is not None else None,
                limits.cpus // res.cpus_per_node if limits.cpus is not None else None,
            ]
            fits = [f for f in fits if f is not None]
            return min(fits) if fits else None
        if self.flag == "--cpus":
            return None if limits.cpus is None else limits.cpus // (res.nodes * (res.tasks_per_node or 1))
        if self.flag == "--mem":
            return None if limits.memory_mb is None else limits.memory_mb // res.nodes
        return None

    def _value(self, most: int) -> str:
        if self.flag != "--mem":
            return str(most)
        return f"{most // 1024}G" if most >= 1024 and most % 1024 == 0 else f"{most}M"


SIZE_BOUNDS = {
    "nodes": Resources.model_fields["nodes"],
    "gpus_per_node": Resources.model_fields["gpus_per_node"],
    "cpus_per_task": Resources.model_fields["cpus_per_task"],
    "memory_mb_per_node": Resources.model_fields["memory_mb_per_node"],
}
"""The Resources fields whose upper bound a user meets by asking for too much (TooBig)."""


class MagicArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: int | None = Field(None, description="total GPUs (0 or absent: a CPU job)")
    nodes: int | None = None
    gpus_per_node: int | None = None
    tasks_per_node: int | None = None
    cpus: int | None = Field(None, description="CPU cores per task")
    mem: str | None = Field(None, description="memory per node, with a unit (4G, 512M)")
    launcher: Launcher = Launcher.torchrun
    backend: str | None = None
    site: str | None = None
    burst: str | None = None
    data: list[str] = Field(default_factory=list)
    data_mode: DataMode = DataMode.stage
    queue: str | None = None
    priority: str | None = None
    retries: int = 3
    retries_timeout: int = 0
    retries_user: int = 0
    stall_timeout: float | None = None
    name: str | None = Field(None, description="--name: the job's name (a slug); absent: made from its title")
    title: str | None = Field(
        None, description="where it came from (`train.ipynb [12]`): set by the magic and the command line, not a flag"
    )
    time: int = 60
    switches: int | None = None
    env: dict[str, str] = Field(default_factory=dict)
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(default_factory=list)
    detach: bool = False
    dry_run: bool = False
    sweep: bool = Field(False, description="%%cluster map: run the cell once per point of a grid")
    over: str | None = Field(None, description="%%cluster map: the notebook variable holding the grid")
    max_parallel: int = Field(64, description="%%cluster map: most tasks running at once")
    per_task: int = Field(1, description="%%cluster map: points one task runs one after another")
    bind_as: str | None = Field(None, description="%%cluster map --as NAME: bind the sweep's handle to NAME")

    def sweep_of(self, points: int, points_sha256: str) -> Sweep:
        """The spec's Sweep for a grid of `points` whose manifest has that hash."""
        try:
            return Sweep(
                points=points, points_sha256=points_sha256, max_parallel=self.max_parallel, per_task=self.per_task
            )
        except ValidationError as exc:
            raise MagicUsageError(explain(exc)) from None

    def resources(self, bounded: bool = True) -> Resources:
        """The gang the flags ask for. `bounded`: a size above the spec's bounds is a TooBig
        naming the flag typed (--gpus 999 sets gpus_per_node 999 on one node: it says --gpus);
        unbounded (to work out what to ask for instead), the sizes as asked."""
        nodes, per_node = self.nodes, self.gpus_per_node
        if nodes is not None and nodes < 1:
            raise MagicUsageError(f"--nodes {nodes}: a job runs on 1 node or more")
        if self.gpus == 0:
            if per_node:
                raise MagicUsageError("--gpus 0 is a CPU job: leave out --gpus-per-node")
        elif self.gpus is not None:
            if self.gpus < 0:
                raise MagicUsageError("--gpus must be 0 (a CPU job) or more")
            if nodes and per_node and nodes * per_node != self.gpus:
                raise MagicUsageError(f"--gpus {self.gpus} is not --nodes {nodes} × --gpus-per-node {per_node}")
            if nodes and not per_node:
                if self.gpus % nodes:
                    raise MagicUsageError(f"--gpus {self.gpus} does not split evenly over --nodes {nodes}")
                per_node = self.gpus // nodes
            elif per_node and not nodes:
                if self.gpus % per_node:
                    raise MagicUsageError(f"--gpus {self.gpus} is not a multiple of --gpus-per-node {per_node}")
                nodes = self.gpus // per_node
            elif not nodes:
                nodes, per_node = 1, self.gpus
        try:
            memory = parse_memory_mb(self.mem) if self.mem is not None else None
        except ValueError as exc:
            raise MagicUsageError(f"--mem {exc}") from None
        sizes = {
            "nodes": nodes or 1,
            "gpus_per_node": per_node or 0,
            "cpus_per_task": self.cpus if self.cpus is not None else 1,
            "memory_mb_per_node": memory,
        }
        if bounded:
            self._within_bounds(sizes)
        fields = dict(tasks_per_node=self.tasks_per_node, timeout_min=self.time, switches=self.switches)
        return Resources(**sizes, **fields) if bounded else Resources.model_construct(**sizes, **fields)

    def _within_bounds(self, sizes: dict[str, int | None]) -> None:
        """Raise TooBig for the first size above the spec's bound, named by the flag typed."""
        typed = {
            "nodes": "--nodes",
            "gpus_per_node": "--gpus-per-node" if self.gpus_per_node is not None else "--gpus",
            "cpus_per_task": "--cpus",
            "memory_mb_per_node": "--mem",
        }
        for field, info in SIZE_BOUNDS.items():
            most = next(m.le for m in info.metadata if getattr(m, "le", None) is not None)
            if sizes[field] is not None and sizes[field] > most:
                if typed[field] == "--gpus":  # one node unless --nodes: the bound is per node
                    most *= sizes["nodes"]
                raise TooBig(self, typed[field], most)

    def to_spec(self, source: str, inputs_sha256: str | None = None, sweep: Sweep | None = None) -> JobSpec:
        try:
            resources = self.resources()
        except ValidationError as exc:
            raise MagicUsageError(explain(exc)) from None
        try:
            return JobSpec(
                name=self.name or slug(self.title) or "cell",
                title=self.title,
                launcher=self.launcher,
                resources=resources,
                queue=self.queue,
                backend=self.backend,
                site=self.site,
                burst=self.burst,
                datasets=self.data,
                data_mode=self.data_mode,
                priority=self.priority,
                retries=Retries(
                    infrastructure=self.retries, timeout=self.retries_timeout, user_error=self.retries_user
                ),
                stall_timeout_s=self.stall_timeout,
                env=self.env,
                source=source,
                input_names=self.inputs,
                inputs_sha256=inputs_sha256,
                outputs=self.outputs,
                sweep=sweep,
            )
        except ValidationError as exc:
            raise MagicUsageError(explain(exc)) from None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise MagicUsageError(_suggest(message, self))


def _parser() -> _Parser:
    p = _Parser(prog="%%cluster", add_help=False, exit_on_error=False, allow_abbrev=False)
    p.add_argument("--gpus", type=int)
    p.add_argument("--nodes", type=int)
    p.add_argument("--gpus-per-node", type=int)
    p.add_argument("--tasks-per-node", type=int, help="processes per node (default: one per GPU for torchrun and jax)")
    p.add_argument("--cpus", type=int, help="CPU cores per task (default 1)")
    p.add_argument("--mem", help="memory per node, e.g. 4G or 512M")
    p.add_argument("--launcher", choices=[launcher.value for launcher in Launcher])
    p.add_argument("--backend")
    p.add_argument("--site", help="auto (default: placement weighs every site) or a site's name")
    p.add_argument(
        "--burst",
        choices=[policy.value for policy in BurstPolicy],
        help="may it go to a cloud site (default: the desk's)",
    )
    p.add_argument(
        "--data",
        action="append",
        default=[],
        help="datasets it reads: a registered NAME or NAME=URL@VERSION (comma-separated or repeated)",
    )
    p.add_argument(
        "--data-mode", choices=[mode.value for mode in DataMode], help="stage (default): copy to the nodes first"
    )
    p.add_argument("--queue")
    p.add_argument("--priority", help="priority class: low, normal (default), high")
    p.add_argument("--retries", type=int, help="retries after infrastructure faults (default 3)")
    p.add_argument("--retries-timeout", type=int, help="retries after running past --time (default 0)")
    p.add_argument("--retries-user", type=int, help="retries after an exception in the cell (default 0)")
    p.add_argument(
        "--stall-timeout", type=float, help="seconds without a new training step before the attempt counts as hung"
    )
    p.add_argument("--name")
    p.add_argument("--time", type=int, help="minutes")
    p.add_argument("--switches", type=int, help="most leaf switches the nodes may span")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--inputs", default="")
    p.add_argument("--outputs", default="")
    p.add_argument("--detach", action="store_true")
    p.add_argument("--dry-run", action="store_true")
    # %%cluster map only (parse_args refuses them elsewhere)
    p.add_argument("--over", metavar="GRID", help="map: the variable holding the grid")
    p.add_argument("--max-parallel", type=int, help="map: most points running at once (default 64)")
    p.add_argument("--per-task", type=int, help="map: points one task runs one after another (default 1)")
    p.add_argument("--as", dest="bind_as", metavar="NAME", help="map: bind the sweep's handle to NAME")
    return p


PARSER = _parser()
SWEEP_FLAGS = {"over": "--over", "max_parallel": "--max-parallel", "per_task": "--per-task", "bind_as": "--as"}
"""The flags of `%%cluster map` alone (MagicArgs field → flag)."""
MAP_HINT = "%%cluster map (e.g. %%cluster map --over grid --max-parallel 8)"


def parse_line(line: str) -> MagicArgs:
    """The `%%cluster` line, split as a shell would (quotes keep `--env "MSG=hello world"` whole).
    A first word `map` makes it a sweep (`%%cluster map --over grid ...`)."""
    try:
        argv = shlex.split(line)
    except ValueError as exc:
        raise MagicUsageError(f"cannot read the %%cluster line: {exc}") from None
    if argv[:1] == ["map"]:
        return parse_args(argv[1:], sweep=True)
    return parse_args(argv)


def parse_args(argv: list[str], sweep: bool = False, sweep_hint: str = MAP_HINT) -> MagicArgs:
    """`%%cluster` options already split into arguments (the command line's), taken as they are.
    `sweep`: options of a sweep (its flags allowed, --launcher plain unless said); elsewhere a
    sweep's flag is refused with `sweep_hint`, where it belongs."""
    try:
        ns = PARSER.parse_args(argv)
    except argparse.ArgumentError as exc:
        raise MagicUsageError(_argument_words(exc)) from None
    if not sweep:
        given = [flag for field, flag in SWEEP_FLAGS.items() if getattr(ns, field) is not None]
        if given:
            verb = "belongs" if len(given) == 1 else "belong"
            raise MagicUsageError(f"{', '.join(given)} {verb} to {sweep_hint}")
    elif ns.launcher is None:
        ns.launcher = Launcher.plain.value
    for field in ("over", "bind_as"):
        name = getattr(ns, field)
        if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
            raise MagicUsageError(f"{SWEEP_FLAGS[field]} {name!r} is not a Python variable name")
    env = {}
    for item in ns.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise MagicUsageError(f"--env {item!r} is not KEY=VALUE")
        env[key] = value
    values = {k: v for k, v in vars(ns).items() if v is not None}
    values.update(
        env=env, inputs=_names(ns.inputs), outputs=_names(ns.outputs), data=_names(",".join(ns.data)), sweep=sweep
    )
    try:
        return MagicArgs.model_validate(values)
    except ValidationError as exc:
        raise MagicUsageError(explain(exc)) from None


def usage() -> str:
    return " ".join(PARSER.format_usage().replace("usage: ", "").split())


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


LIST_FLAGS = "%cluster alone lists every flag"


def _argument_words(exc: argparse.ArgumentError) -> str:
    """argparse's refusal of one flag's value, in the words of the flag typed:
    "--gpus 'abc' is not a whole number", "--launcher 'x' is not one of torchrun, ray, ..."."""
    flag, message = exc.argument_name or "", exc.message
    if message.startswith("invalid int value: ") or message.startswith("invalid float value: "):
        kind = "a whole number" if "int" in message.split(":")[0] else "a number"
        return f"{flag} {message.split(': ', 1)[1]} is not {kind}"
    if message.startswith("invalid choice: "):
        value = message.split(": ", 1)[1].split(" (choose", 1)[0]
        choices = [action.choices for action in PARSER._actions if flag in action.option_strings][0]
        return f"{flag} {value} is not one of {', '.join(choices)}"
    if message.startswith("expected one argument"):
        return f"{flag} needs a value"
    return f"{flag}: {message}" if flag else message


def _suggest(message: str, parser: argparse.ArgumentParser) -> str:
    """An unrecognized word as what it most likely is: a misspelt flag ("unknown option --gpu
    (did you mean --gpus?)"; a word after it is its value, not named again), or a value with
    no flag before it."""
    if "unrecognized arguments" not in message:
        return message
    flags = [opt for action in parser._actions for opt in action.option_strings]
    words = message.split(":", 1)[1].split()
    unknown = [w for w in words if w.startswith("-") and not _is_number(w)]
    if not unknown:
        stray = " ".join(words)
        return f"unexpected {stray!r}: each value follows its flag (--gpus 2); {LIST_FLAGS}"
    hints = []
    for flag in unknown:
        close = difflib.get_close_matches(flag.split("=")[0], flags, n=1)
        hints.append(
            f"unknown option {flag.split('=')[0]} (did you mean {close[0]}?)" if close else f"unknown option {flag}"
        )
    said = "; ".join(hints)
    return said if all("did you mean" in h for h in hints) else f"{said}; {LIST_FLAGS}"


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True
