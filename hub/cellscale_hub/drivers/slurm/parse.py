"""What Slurm's commands answer, parsed: job states (and ONE table of what each end state
means to cellscale), `sbatch --test-only` estimates, node lists, partition and TRES fields,
and the stderr of a Slurm client that cannot reach its controller. Pure: no command runs here."""

from __future__ import annotations

import json
import re
import shlex
import time
from dataclasses import dataclass

from cellscale.vocabulary import AttemptState, Fault
from cellscale_hub.drivers.types import BackendUnreachable

UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Unable to establish controller|Connection refused|"
    r"Socket timed out|Zero Bytes were transmitted or received|Problem talking to the database|"
    r"Connection timed out|Communication connection failure|No route to host|"
    r"Unable to connect to database|slurm_persist_conn_open",
    re.IGNORECASE,
)

# the reason a node's Slurm state carries: the cloud simulation (and real cloud glue, by
# convention) marks a resume that found no capacity "stockout: ...", one that never
# registered "boot-failed: ...", and a spot reclaim notice "spot-reclaim: ..."
CAPACITY_REASONS = ("stockout", "boot-failed")
NOTICE_REASON = "spot-reclaim"
ESTIMATE = re.compile(r"to start at (\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)")
ESTIMATE_NODES = re.compile(r" on nodes (\S+) in partition")
QUEUED = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED"}
ACTIVE = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}


@dataclass(frozen=True)
class End:
    """What one Slurm end state means to cellscale, for an attempt and for a sweep's task."""

    state: AttemptState  # the attempt's
    fault: Fault | None  # why it did not succeed (None: it did, or was cancelled)
    words: str | None = None  # how it ended ({nodes}, {limit} filled in); None: the job's own words
    job_says: bool = False  # the attempt's exit records say its fault better (`fault` is a task's)
    nodes_failed: bool = False  # its nodes failed: their Slurm reasons say why


# every Slurm state a job ends in; a task that ends in one not here ended as `OTHER_END`
ENDED = {
    "COMPLETED": End(AttemptState.SUCCEEDED, None, "every rank exited 0"),
    "CANCELLED": End(AttemptState.CANCELLED, None),
    "FAILED": End(AttemptState.FAILED, Fault.INFRASTRUCTURE, job_says=True),
    "TIMEOUT": End(AttemptState.FAILED, Fault.TIMEOUT, "ran past {limit}"),
    "NODE_FAIL": End(AttemptState.FAILED, Fault.INFRASTRUCTURE, "node failure: {nodes}", nodes_failed=True),
    "PREEMPTED": End(AttemptState.FAILED, Fault.PREEMPTION, "preempted by Slurm"),
    "OUT_OF_MEMORY": End(AttemptState.FAILED, Fault.INFRASTRUCTURE, job_says=True),
    "BOOT_FAIL": End(AttemptState.FAILED, Fault.INFRASTRUCTURE, job_says=True),
    "DEADLINE": End(AttemptState.FAILED, Fault.INFRASTRUCTURE, job_says=True),
}
OTHER_END = End(AttemptState.FAILED, Fault.INFRASTRUCTURE, job_says=True)


def job_state(entry: dict) -> str:
    """A job's state from squeue's or sacct's JSON (the field moved between Slurm versions)."""
    state = entry.get("job_state") or entry.get("state", {})
    if isinstance(state, dict):
        state = state.get("current", "")
    if isinstance(state, list):
        state = state[0] if state else ""
    return str(state).split()[0] if state else ""


def command_error(argv: list[str], returncode: int, stderr: str) -> RuntimeError:
    """The error a failed Slurm command raises: BackendUnreachable when its stderr says the
    controller (or slurmdbd) does not answer, else a RuntimeError with the stderr's tail."""
    tail = stderr.strip()[-500:]
    if UNREACHABLE.search(stderr):
        return BackendUnreachable(f"{shlex.join(argv)}: Slurm does not answer ({tail})")
    return RuntimeError(f"{shlex.join(argv)} failed ({returncode}): {tail}")


def json_answer(argv: list[str], out: str) -> dict:
    """A `--json` answer; its `errors` (22.05 exits 0 with them when the controller does not
    answer, and an empty list of jobs or nodes) become BackendUnreachable."""
    answer = json.loads(out)
    # sacct's "Nothing found with query" (no such job in accounting) is an answer, not an error
    errors = [e for e in answer.get("errors") or [] if "nothing found" not in json.dumps(e).lower()]
    if errors:
        words = "; ".join(f"{e.get('source') or ''} {e.get('description') or e.get('error') or ''}" for e in errors)
        raise BackendUnreachable(f"{shlex.join(argv)}: Slurm answered with errors ({words.strip()})")
    return answer


def parse_estimate(text: str) -> float | None:
    """`sbatch: Job 5 to start at 2026-12-06T20:09:10 using 2 processors on nodes b[1-2] in
    partition gpu` -> that time (local time, as sbatch writes it) in epoch seconds."""
    match = ESTIMATE.search(text)
    if not match:
        return None
    return time.mktime(time.strptime(match.group(1), "%Y-%m-%dT%H:%M:%S"))


def parse_estimate_nodes(text: str) -> list[str]:
    """The nodes of a `sbatch --test-only` answer (`... on nodes b[1-2] in partition gpu`)."""
    match = ESTIMATE_NODES.search(text)
    return expand_hostlist(match.group(1)) if match else []


def capacity_words(short: list[tuple[str, str]]) -> str:
    names = ", ".join(name for name, _ in short)
    kind = short[0][1].split(":", 1)[0]
    return f"the cloud had no capacity for {names} ({kind}): {short[0][1]}"


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compact node list as names: 'c[1-2],node[1,3-4],cpu1' -> ['c1', 'c2', 'node1',
    'node3', 'node4', 'cpu1']; zero padding kept ('n[01-02]'). '', 'None assigned' -> []."""
    text = text.strip()
    if not text or text.startswith("None") or text == "(null)":
        return []
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", text):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            first, _, last = part.partition("-")
            if not last:
                names.append(prefix + first)
                continue
            width = len(first) if first.startswith("0") else 0
            names += [f"{prefix}{i:0{width}d}" for i in range(int(first), int(last) + 1)]
    return names


def slurm_minutes(value: str) -> float:
    """A partition's MaxTime ('7-00:00:00', '60', '1:00:00', 'UNLIMITED') in minutes; inf when unlimited."""
    if not value or value.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return float("inf")
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        minutes = parts[0]
    elif len(parts) == 2:
        minutes = parts[0] + parts[1] / 60
    else:
        minutes = parts[0] * 60 + parts[1] + parts[2] / 60
    return (int(days) if days else 0) * 1440 + minutes


def gpus_of(gres: str) -> int:
    """'gpu:8' or 'gpu:tesla:8(S:0)' → 8."""
    match = re.search(r"gpu(?::[^:,(]+)?:(\d+)", gres)
    return int(match.group(1)) if match else 0


def tres(text: str) -> dict[str, str]:
    """'cpu=4,gres/gpu=0' → {'cpu': '4', 'gres/gpu': '0'}."""
    return dict(item.split("=", 1) for item in text.strip().split(",") if "=" in item)


def key_values(line: str) -> dict[str, str]:
    """`scontrol -o show ...`'s `Key=Value Key=Value` line as a dict."""
    return dict(item.split("=", 1) for item in line.split() if "=" in item)


def held(entry: dict | None) -> tuple[float, float | None] | None:
    """The allocation's start and end as Slurm's own records have them (squeue's start_time of a
    started job; sacct's time.start and time.end); None before it started."""
    if entry is None or job_state(entry) in QUEUED:
        return None
    times = entry.get("time")
    if isinstance(times, dict):  # sacct
        start, end = times.get("start") or 0, times.get("end") or 0
    else:  # squeue: a running job's end_time is its time limit, not an end
        start, end = entry.get("start_time") or 0, (entry.get("end_time") or 0) if job_state(entry) in ENDED else 0
    if not start:
        return None
    return float(start), float(end) if end and end >= start else None


def exit_code(entry: dict) -> int | None:
    code = entry.get("exit_code")
    if isinstance(code, dict):
        return code.get("return_code")
    return code if isinstance(code, int) else None
