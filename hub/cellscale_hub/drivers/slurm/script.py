"""What goes into a Slurm batch script: the names it may hold, the options cellscale sets
itself, the template and its fields, and sbatch's quoting. Pure: the checks the driver's
traits (`extra_directives`, `prologue`, `batch_template`) are validated with are here too."""

from __future__ import annotations

import re
import string

from traitlets import TraitError

from cellscale_hub.drivers.types import AttemptRef, SpecRejected

SAFE_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SAFE_NODE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
SBATCH_BARE = re.compile(r"[\w@%+=:,./-]+", re.ASCII)  # what an #SBATCH line may hold unquoted
# the options render() sets itself: an extra directive must not override them (--account is the
# desk's charge, --job-name finds a job again after a restart, --output/--chdir the job dir)
MANAGED_OPTIONS = frozenset(
    {
        "job-name",
        "account",
        "partition",
        "nodes",
        "ntasks-per-node",
        "cpus-per-task",
        "mem",
        "mem-per-cpu",  # sbatch refuses it beside --mem
        "mem-per-gpu",
        "cpus-per-gpu",  # would change the cores a GPU job holds behind cellscale's back
        "gres",
        "time",
        "switches",
        "exclude",
        "chdir",
        "output",
        "requeue",
        "no-requeue",
        "comment",
        "array",  # a sweep's, with its throttle
    }
)
DEFAULT_BATCH_TEMPLATE = """\
#!/bin/bash
{header}
{directives}
{prologue}
{command}
"""
TEMPLATE_FIELDS = {
    "header": "the `# cellscale job ...` comment line",
    "directives": "every `#SBATCH` line, cellscale's then `extra_directives`",
    "prologue": "the `prologue` lines",
    "command": "`exec srun ... <supervisor>`: one cellscale supervisor per node",
    "supervisor": "the supervisor's command line alone (for a template with its own srun line)",
    "job_name": "the Slurm job name (`<job id>-a<attempt>`)",
    "job_id": "the cellscale job id",
    "attempt": "the attempt number",
    "owner": "the researcher (Unix user) the job runs as",
    "tenant": "the desk, which is the Slurm account",
    "partition": "the partition",
    "nodes": "the number of nodes",
    "gpus_per_node": "GPUs per node",
    "cpus_per_node": "cores per node: the --cpus-per-task of the node's one task (the supervisor)",
    "timeout_min": "the wall-clock limit in minutes",
    "launcher": "torchrun, ray, plain or jax",
    "job_dir": "the job directory (shell-quoted)",
    "python": "the Python that runs the supervisor (shell-quoted)",
}


def job_name(ref: AttemptRef) -> str:
    return f"{ref.job_id}-a{ref.number}"


def check_names(ref: AttemptRef) -> None:
    """What goes into the script's names must be a plain account, user and job name."""
    if not SAFE_NAME.match(ref.tenant):
        raise SpecRejected(f"tenant {ref.tenant!r} cannot be a Slurm account name (lower-case letters, digits, -, _)")
    if not SAFE_NAME.match(ref.owner):
        raise SpecRejected(f"user name {ref.owner!r} is not a valid Unix user name; Slurm jobs run as their owner")
    if not SAFE_NODE.match(ref.job_id):
        raise SpecRejected(f"job id {ref.job_id!r} cannot be part of a Slurm job name")


def check_directives(directives: list[str]) -> list[str]:
    """`SlurmDriver.extra_directives`, each one long sbatch option cellscale does not set itself."""
    for directive in directives:
        if _unprintable(directive):
            raise TraitError(
                f"SlurmDriver.extra_directives: {directive!r} holds a newline or control "
                "character; give one option per entry"
            )
        if not re.fullmatch(r"--[A-Za-z][A-Za-z0-9-]*(=.*)?", directive):
            raise TraitError(
                f"SlurmDriver.extra_directives: {directive!r} is not a long sbatch option; "
                "write each as --name or --name=value, e.g. --constraint=a100"
            )
        option = directive[2:].split("=", 1)[0]
        if option in MANAGED_OPTIONS:
            raise TraitError(
                f"SlurmDriver.extra_directives: --{option} is set by cellscale for every job "
                "(from the job's resources, its desk and the driver's traits) and cannot be "
                "overridden"
            )
    return directives


def check_prologue(lines: list[str]) -> list[str]:
    """`SlurmDriver.prologue`: one shell line per entry, no `#SBATCH` line."""
    for line in lines:
        if _unprintable(line, tab=True):
            raise TraitError(
                f"SlurmDriver.prologue: {line!r} holds a newline or control character; give one shell line per entry"
            )
        if line.lstrip().startswith("#SBATCH"):
            raise TraitError(
                f"SlurmDriver.prologue: {line!r} is an #SBATCH line; put sbatch options in SlurmDriver.extra_directives"
            )
    return lines


def check_template(template: str) -> str:
    """`SlurmDriver.batch_template`: a script sbatch takes, with known fields, its directives and its command."""
    if not template.startswith("#!"):
        raise TraitError(
            "SlurmDriver.batch_template must start with an interpreter line such as #!/bin/bash "
            "(sbatch refuses a script without one)"
        )
    if "\0" in template:
        raise TraitError("SlurmDriver.batch_template holds a NUL character")
    try:
        fields = [parsed for line in template.splitlines() for parsed in string.Formatter().parse(line)]
    except ValueError as exc:
        raise TraitError(f"SlurmDriver.batch_template: {exc} (write {{{{ and }}}} for literal braces)") from None
    used = set()
    for _, name, spec, conversion in fields:
        if name is None:
            continue
        if name not in TEMPLATE_FIELDS or spec or conversion:
            raise TraitError(
                f"SlurmDriver.batch_template: unknown placeholder {{{name}}}; the fields are "
                f"{', '.join('{' + f + '}' for f in TEMPLATE_FIELDS)} (write {{{{ and }}}} for "
                "literal braces, e.g. ${{SLURM_JOB_ID}})"
            )
        used.add(name)
    if "directives" not in used:
        raise TraitError("SlurmDriver.batch_template must contain {directives}: they name, place and charge the job")
    if not used & {"command", "supervisor"}:
        raise TraitError(
            "SlurmDriver.batch_template must contain {command} (or {supervisor} in an srun line "
            "of its own): it is what runs the job"
        )
    return template


def sbatch_quote(option: str) -> str:
    """One argument of an `#SBATCH` line. sbatch splits the line at blanks and honours double
    quotes and backslashes (not single quotes, unlike a shell), and an unquoted `#` ends it."""
    if SBATCH_BARE.fullmatch(option):
        return option
    return '"' + option.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fill_template(template: str, fields: dict[str, str]) -> str:
    """`template` with its `{field}`s filled, line by line; a line that is only one field whose
    value is empty is left out (the default template's `{prologue}` when there is none)."""
    lines = []
    for line in template.splitlines(keepends=True):
        parsed = list(string.Formatter().parse(line.rstrip("\n")))
        if len(parsed) == 1 and parsed[0][0] == "" and parsed[0][1] and fields.get(parsed[0][1]) == "":
            continue
        lines.append(line.format_map(fields))
    return "".join(lines)


def _unprintable(text: str, tab: bool = False) -> bool:
    return any(ord(c) < 32 and not (tab and c == "\t") or ord(c) == 127 for c in text)
