"""A cloud SIMULATION for the dev Slurm topology's burst partition (`dev.slurm up --sites`).

It stands in for a cloud provider's instance API, nothing more. Slurm's power saving is real:
slurmctld decides to power CLOUD nodes c1-c4 up and down and runs its ResumeProgram,
SuspendProgram and ResumeFailProgram (Python scripts this module writes into the state dir,
run by slurmctld as `slurm` with no PATH). Those scripts call this service on 127.0.0.1; it
"boots an instance" by starting `slurmd -D -b -N cN -f <dca's slurm.conf>` on this machine
after a boot delay, and "terminates" it by killing that slurmd. What it simulates:

- boot delay (`delay`, seconds; default from the config), stockouts (`mode stockout`: a
  resume request gets HTTP 503, the resume script marks the nodes `state=down
  reason="stockout: ..."` then `state=power_down`, so they end powered-down idle, never DOWN),
  hangs (`mode hang`: accepted, never boots; Slurm's ResumeTimeout then calls
  ResumeFailProgram, which powers the nodes down with reason `boot-failed: ...`);
- billing: every accepted instance is billed by the second, from the resume request to its
  stop, at price-per-GPU-hour x the node's GPUs; the ledger is readable at GET /ledger;
- spot reclaims (`reclaim NODE --notice S`): at once the node is drained with reason
  `spot-reclaim: terminating in S s` (what a reclaim notice looks like to cellscale), and
  after S seconds its slurmd gets SIGKILL and the node is set DOWN (ending its jobs) then
  powered down, so it ends powered-down idle (`idle~`), never left DOWN.

What stays unproven by it: a real cloud API's latency, errors, quotas and rate limits; real
instance boot (images, cloud-init, network, shared filesystems, GPU drivers); addresses that
change per instance (here every node is 127.0.0.1 with a fixed port); real billing rules
(minimum charges, per-minute granularity, spot price changes); real reclaim notice delivery
(metadata endpoints, 30 s/2 min notices that may come late or not at all).

Callers authenticate with a random token kept in `<state dir>/cloud/token`, readable by root
and the `slurm` group only (the power scripts run as `slurm`); requests without it get 401.
Node names are checked against the configured nodes; every command is an argv list.

This file is stdlib-only and runs as a script (`python cloud.py serve --state-dir DIR`), so
the daemon does not depend on how cellscale is installed. CLI for tests and docs:

    python -m cellscale_hub.dev.cloud mode ok|stockout|hang [--delay S] [--state-dir DIR]
    python -m cellscale_hub.dev.cloud reclaim c1 --notice 30 [--state-dir DIR]
    python -m cellscale_hub.dev.cloud ledger [--state-dir DIR]
"""

from __future__ import annotations

import argparse
import hmac
import json
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

DEFAULT_STATE_DIR = Path("/tmp/cellscale-slurm")
NODE_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")
MODES = ("ok", "stockout", "hang")
STOCKOUT_MESSAGE = "InsufficientInstanceCapacity: no capacity for this instance type in this zone (simulated)"


class CloudError(RuntimeError):
    """The cloud simulation refused or did not answer; the message says why."""


def config_path(state_dir: Path | str) -> Path:
    return Path(state_dir) / "cloud" / "config.json"


def load_config(state_dir: Path | str) -> dict:
    path = config_path(state_dir)
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise CloudError(f"no cloud simulation configured in {state_dir} ({exc}); run `dev.slurm up --sites`") from None


def new_token() -> str:
    return secrets.token_hex(24)


# ---------------------------------------------------------------------------- the service


class Cloud:
    """The simulated provider: instances (one per node at most), mode, delay, ledger."""

    def __init__(self, config: dict):
        self.config = config
        self.token = Path(config["token_file"]).read_text().strip()
        self.lock = threading.Lock()
        self.mode = "ok"
        self.delay = float(config["boot_delay"])
        self.instances: dict[str, dict] = {}  # node -> the running (or booting) instance
        self.ledger: list[dict] = []  # every instance ever accepted, stopped or not
        self.events: list[dict] = []  # stockouts, reclaims, refusals
        self.procs: dict[str, subprocess.Popen] = {}

    # -- helpers
    def log(self, message: str) -> None:
        print(f"{time.time():.3f} {message}", flush=True)

    def gpus(self, node: str) -> int:
        return int(self.config["nodes"][node])

    def valid_nodes(self, nodes: object) -> list[str]:
        if not isinstance(nodes, list) or not nodes:
            raise ValueError("nodes: a non-empty list of node names")
        for node in nodes:
            if not isinstance(node, str) or not NODE_NAME.match(node) or node not in self.config["nodes"]:
                raise ValueError(f"unknown node {node!r}; this cloud has {', '.join(self.config['nodes'])}")
        return nodes

    def scontrol(self, *args: str) -> None:
        argv = [self.config["scontrol"], *args]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": self.config["slurm_conf"], "LANG": "C.UTF-8"}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
        self.log(f"{argv} -> {result.returncode} {result.stdout.strip()} {result.stderr.strip()}")

    def bill(self, instance: dict, now: float) -> None:
        end = instance["stopped"] or now
        seconds = math.ceil(max(0.0, end - instance["requested"]))
        instance["billed_s"] = seconds
        instance["dollars"] = round(seconds / 3600 * instance["price_per_gpu_hour"] * instance["gpus"], 6)

    # -- resume / boot / stop
    def resume(self, nodes: list[str], jobs: list) -> tuple[int, dict]:
        now = time.time()
        with self.lock:
            if self.mode == "stockout":
                self.events.append({"event": "stockout", "nodes": nodes, "t": now})
                return 503, {"error": STOCKOUT_MESSAGE, "nodes": nodes}
            accepted = []
            for node in nodes:
                if node in self.instances:
                    continue  # already booting or running
                instance = {
                    "instance": f"i-{secrets.token_hex(6)}",
                    "node": node,
                    "gpus": self.gpus(node),
                    "price_per_gpu_hour": float(self.config["price_per_gpu_hour"]),
                    "requested": now,
                    "started": None,
                    "stopped": None,
                    "end": None,
                    "jobs": jobs,
                    "billed_s": 0,
                    "dollars": 0.0,
                }
                self.instances[node] = instance
                self.ledger.append(instance)
                accepted.append(node)
                if self.mode != "hang":
                    threading.Thread(target=self.boot, args=(instance, self.delay), daemon=True).start()
            return 202, {"accepted": accepted, "delay": self.delay, "mode": self.mode}

    def boot(self, instance: dict, delay: float) -> None:
        time.sleep(delay)
        node = instance["node"]
        with self.lock:
            if self.instances.get(node) is not instance:
                return  # stopped before it booted
            spool = Path(self.config["state_dir"]) / "spool" / f"slurmd-{node}"
            spool.mkdir(mode=0o755, exist_ok=True)
            console = open(Path(self.config["log_dir"]) / f"slurmd-{node}.out", "ab")  # noqa: SIM115
            env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": self.config["slurm_conf"], "LANG": "C.UTF-8"}
            child = subprocess.Popen(
                [self.config["slurmd"], "-D", "-b", "-N", node, "-f", self.config["slurm_conf"]],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            console.close()
            self.procs[node] = child
            instance["started"] = time.time()
            self.log(f"booted {node} ({instance['instance']}): slurmd pid {child.pid}, {delay:.1f} s after the request")

    def stop(self, node: str, end: str, sig: int = signal.SIGTERM) -> bool:
        with self.lock:
            instance = self.instances.pop(node, None)
            child = self.procs.pop(node, None)
        if instance is None:
            return False
        if child is not None and child.poll() is None:
            child.send_signal(sig)
            try:
                child.wait(timeout=15)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        now = time.time()
        with self.lock:
            instance["stopped"] = now
            instance["end"] = end
            self.bill(instance, now)
        self.log(f"stopped {node} ({instance['instance']}, {end}): billed {instance['billed_s']} s")
        return True

    def reclaim(self, node: str, notice: float) -> dict:
        now = time.time()
        with self.lock:
            running = node in self.instances
            self.events.append({"event": "reclaim", "node": node, "notice_s": notice, "t": now, "running": running})
        self.scontrol("update", f"nodename={node}", "state=drain", f"reason=spot-reclaim: terminating in {notice:g} s")
        threading.Thread(target=self._reclaim_later, args=(node, notice), daemon=True).start()
        return {"node": node, "notice_s": notice, "running": running}

    def _reclaim_later(self, node: str, notice: float) -> None:
        time.sleep(notice)
        self.stop(node, "reclaimed", signal.SIGKILL)
        # the instance is gone: DOWN ends what ran there at once (NODE_FAIL; otherwise Slurm
        # waits SlurmdTimeout), then power_down returns the node to powered-down idle (idle~
        # after SuspendTimeout). power_down_force alone left the job COMPLETING forever, its
        # epilog never answered by the dead slurmd (measured on 22.05).
        self.scontrol("update", f"nodename={node}", "state=down", "reason=spot-reclaim: reclaimed")
        self.scontrol("update", f"nodename={node}", "state=power_down")
        # a node that was drained and idle at the kill (its job already gone: cellscale
        # preempted it on the notice) ends `down~`, DOWN and powered down, and would stay so:
        # once powered down, resume clears DOWN and the node is `idle~` again (measured on 22.05)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not self.short_state(node).endswith("~"):
            time.sleep(0.5)
        if self.short_state(node).startswith(("down", "drain", "drng")):
            self.scontrol("update", f"nodename={node}", "state=resume")

    def short_state(self, node: str) -> str:
        """sinfo's short state of one node (`idle~`, `down~`, `mix#`, ...); empty if unknown."""
        argv = [str(Path(self.config["scontrol"]).with_name("sinfo")), "-h", "-N", "-n", node, "-o", "%t"]
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": self.config["slurm_conf"], "LANG": "C.UTF-8"}
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30, check=False)
        return result.stdout.strip().split("\n")[0] if result.returncode == 0 else ""

    def snapshot(self) -> dict:
        now = time.time()
        with self.lock:
            for instance in self.ledger:
                if instance["stopped"] is None:
                    self.bill(instance, now)
            return {
                "mode": self.mode,
                "delay": self.delay,
                "price_per_gpu_hour": float(self.config["price_per_gpu_hour"]),
                "running": sorted(self.instances),
                "instances": [dict(i) for i in self.ledger],
                "events": list(self.events),
                "dollars": round(sum(i["dollars"] for i in self.ledger), 6),
            }

    def shutdown(self) -> None:
        for node in list(self.instances):
            self.stop(node, "shutdown")


def make_handler(cloud: Cloud) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def reply(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, fmt, *args):  # noqa: A002
            cloud.log("http " + fmt % args)

        def authorised(self) -> bool:
            given = self.headers.get("Authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {cloud.token}".encode()):
                return True
            self.reply(401, {"error": "missing or wrong token"})
            return False

        def do_GET(self):  # noqa: N802
            if not self.authorised():
                return
            if self.path in ("/ledger", "/state"):
                return self.reply(200, cloud.snapshot())
            self.reply(404, {"error": "not found"})

        def do_POST(self):  # noqa: N802
            if not self.authorised():
                return
            try:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(min(length, 1 << 20)) or b"{}")
                if not isinstance(body, dict):
                    raise ValueError("a JSON object")
                if self.path == "/resume":
                    nodes = cloud.valid_nodes(body.get("nodes"))
                    jobs = [j for j in body.get("jobs", []) if isinstance(j, int)]
                    code, answer = cloud.resume(nodes, jobs)
                    return self.reply(code, answer)
                if self.path == "/suspend":
                    nodes = cloud.valid_nodes(body.get("nodes"))
                    end = "resume-failed" if body.get("failed") else "suspended"
                    return self.reply(200, {"stopped": [n for n in nodes if cloud.stop(n, end)]})
                if self.path == "/mode":
                    mode, delay = body.get("mode"), body.get("delay")
                    if mode is not None and mode not in MODES:
                        raise ValueError(f"mode: one of {', '.join(MODES)}")
                    if delay is not None and not (isinstance(delay, int | float) and 0 <= delay <= 600):
                        raise ValueError("delay: seconds, 0 to 600")
                    with cloud.lock:
                        cloud.mode = mode or cloud.mode
                        cloud.delay = float(cloud.delay if delay is None else delay)
                        cloud.log(f"mode {cloud.mode}, boot delay {cloud.delay} s")
                        return self.reply(200, {"mode": cloud.mode, "delay": cloud.delay})
                if self.path == "/reclaim":
                    (node,) = cloud.valid_nodes([body.get("node")])
                    notice = body.get("notice", 30)
                    if not (isinstance(notice, int | float) and 0 <= notice <= 3600):
                        raise ValueError("notice: seconds, 0 to 3600")
                    return self.reply(200, cloud.reclaim(node, float(notice)))
            except (ValueError, TypeError) as exc:
                return self.reply(400, {"error": str(exc)})
            self.reply(404, {"error": "not found"})

    return Handler


def serve(state_dir: Path) -> None:
    config = load_config(state_dir)
    cloud = Cloud(config)
    server = ThreadingHTTPServer(("127.0.0.1", int(config["port"])), make_handler(cloud))
    server.daemon_threads = True

    def on_term(*_):
        cloud.log("SIGTERM: stopping every instance")
        cloud.shutdown()
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    cloud.log(f"cloud simulation on 127.0.0.1:{config['port']} (boot delay {cloud.delay} s)")
    server.serve_forever()


# ---------------------------------------------------------------------------- the client


class CloudClient:
    """Talks to a running cloud simulation (as root: the token file is root's and slurm's)."""

    def __init__(self, state_dir: Path | str = DEFAULT_STATE_DIR, timeout: float = 10):
        config = load_config(state_dir)
        self.url = f"http://127.0.0.1:{int(config['port'])}"
        self.token = Path(config["token_file"]).read_text().strip()
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.url + path,
            data=data,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:  # noqa: S310 (127.0.0.1 only)
                return json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise CloudError(f"{method} {path}: HTTP {exc.code} {exc.read().decode(errors='replace')}") from None
        except OSError as exc:
            raise CloudError(f"{method} {path}: the cloud simulation does not answer ({exc})") from None

    def mode(self, mode: str | None = None, delay: float | None = None) -> dict:
        """Set the mode (ok, stockout, hang) and/or the boot delay; returns both."""
        return self._call("POST", "/mode", {"mode": mode, "delay": delay})

    def reclaim(self, node: str, notice: float = 30) -> dict:
        return self._call("POST", "/reclaim", {"node": node, "notice": notice})

    def ledger(self) -> dict:
        return self._call("GET", "/ledger")


# ---------------------------------------------------------------------------- power scripts

# Written into <state dir>/bin by `dev.slurm up` and run by slurmctld as `slurm`, with no PATH
# and only SLURM_CONF (+ SLURM_RESUME_FILE / SLURM_JOB_*) in the environment: absolute paths,
# stdlib only, argv lists only. KIND and CONFIG are filled in with repr().
POWER_SCRIPT = r'''#!/usr/bin/python3 -I
"""Generated by cellscale_hub.dev.cloud (dev.slurm up): slurmctld's %(kind)s program for
the burst partition. Do not edit: `up` writes it again."""
import json, os, re, subprocess, sys, time, urllib.error, urllib.request

KIND = %(kind)r
CONFIG = %(config)r
NODE_NAME = re.compile(r"^[a-z][a-z0-9]{0,15}$")
cfg = json.load(open(CONFIG))
ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SLURM_CONF": cfg["slurm_conf"], "LANG": "C.UTF-8"}


def log(message):
    try:
        with open(cfg["power_log"], "a") as out:
            out.write("%%.3f [%%s pid=%%d] %%s\n" %% (time.time(), KIND, os.getpid(), message))
    except OSError:
        pass


def hostnames(expr):
    if not expr or not re.fullmatch(r"[A-Za-z0-9\[\],-]+", expr):
        return []
    out = subprocess.run([cfg["scontrol"], "show", "hostnames", expr],
                         capture_output=True, text=True, env=ENV, timeout=30)
    return [n for n in out.stdout.split() if NODE_NAME.match(n)]


def scontrol(*args):
    result = subprocess.run([cfg["scontrol"], *args], capture_output=True, text=True, env=ENV, timeout=30)
    log("scontrol %%s -> %%d %%s" %% (list(args), result.returncode, (result.stdout + result.stderr).strip()))


def call(path, body):
    token = open(cfg["token_file"]).read().strip()
    request = urllib.request.Request(
        "http://127.0.0.1:%%d%%s" %% (int(cfg["port"]), path), data=json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"{}")
        except ValueError:
            return exc.code, {}
    except OSError as exc:
        return 0, {"error": "the cloud simulation does not answer (%%s)" %% exc}


def power_down(nodes, reason):
    """Down with a reason, then power_down: the nodes end powered-down idle (idle~), keep the
    reason, and never stay DOWN (the cluster-toolkit pattern)."""
    expr = ",".join(nodes)
    scontrol("update", "nodename=" + expr, "state=down", "reason=" + reason[:200])
    scontrol("update", "nodename=" + expr, "state=power_down")


def main():
    if KIND == "prolog-ctld":
        nodes = [n for n in hostnames(os.environ.get("SLURM_JOB_NODELIST", "")) if n in cfg["nodes"]]
        if not nodes:
            return 0
        deadline = time.time() + float(cfg["resume_timeout"]) + 5
        while time.time() < deadline:
            out = subprocess.run([cfg["sinfo"], "-h", "-N", "-n", ",".join(nodes), "-o", "%%N %%t"],
                                 capture_output=True, text=True, env=ENV, timeout=30).stdout
            states = dict(line.split(None, 1) for line in out.splitlines() if line.strip())
            if len(states) == len(nodes) and not any(c in s for s in states.values() for c in "~#%%*!"):
                log("job %%s: %%s registered" %% (os.environ.get("SLURM_JOB_ID"), ",".join(nodes)))
                return 0
            time.sleep(0.2)
        log("job %%s: nodes not up after ResumeTimeout; letting slurmctld decide" %% os.environ.get("SLURM_JOB_ID"))
        return 0
    nodes = [n for n in hostnames(sys.argv[1] if len(sys.argv) > 1 else "") if n in cfg["nodes"]]
    if not nodes:
        log("no known node in %%r" %% sys.argv[1:])
        return 1
    if KIND == "resume":
        jobs = []
        if os.environ.get("SLURM_RESUME_FILE"):
            try:
                jobs = [j.get("job_id") for j in json.load(open(os.environ["SLURM_RESUME_FILE"])).get("jobs", [])]
            except (OSError, ValueError):
                pass
        code, body = call("/resume", {"nodes": nodes, "jobs": jobs})
        log("resume %%s (jobs %%s) -> %%s %%s" %% (nodes, jobs, code, body))
        if code == 202:
            return 0
        power_down(nodes, "stockout: %%s" %% body.get("error", "HTTP %%s" %% code))
        return 1
    if KIND == "suspend":
        code, body = call("/suspend", {"nodes": nodes})
        log("suspend %%s -> %%s %%s" %% (nodes, code, body))
        return 0
    if KIND == "resume-fail":
        code, body = call("/suspend", {"nodes": nodes, "failed": True})
        log("resume-fail %%s -> %%s %%s" %% (nodes, code, body))
        power_down(nodes, "boot-failed: not registered within ResumeTimeout (%%s s)" %% cfg["resume_timeout"])
        return 0
    return 1


sys.exit(main())
'''

POWER_PROGRAMS = {  # file in <state dir>/bin -> its kind
    "cloud-resume": "resume",
    "cloud-suspend": "suspend",
    "cloud-resume-fail": "resume-fail",
    "prolog-ctld": "prolog-ctld",
}


def power_script(kind: str, config_file: Path) -> str:
    return POWER_SCRIPT % {"kind": kind, "config": str(config_file)}


# ---------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cellscale_hub.dev.cloud", description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR, help=f"default: {DEFAULT_STATE_DIR}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="run the service (dev.slurm up --sites starts it)")
    mode = sub.add_parser("mode", help="ok | stockout | hang, and/or --delay S")
    mode.add_argument("mode", choices=MODES, nargs="?")
    mode.add_argument("--delay", type=float, help="boot delay, seconds")
    reclaim = sub.add_parser("reclaim", help="spot-reclaim a node after a notice")
    reclaim.add_argument("node")
    reclaim.add_argument("--notice", type=float, default=30, help="seconds of notice (default 30)")
    sub.add_parser("ledger", help="instances, billed seconds and dollars, as JSON")
    args = parser.parse_args(argv)
    state_dir = Path(os.path.abspath(args.state_dir))
    try:
        if args.command == "serve":
            serve(state_dir)
            return 0
        client = CloudClient(state_dir)
        if args.command == "mode":
            answer = client.mode(args.mode, args.delay)
        elif args.command == "reclaim":
            answer = client.reclaim(args.node, args.notice)
        else:
            answer = client.ledger()
        print(json.dumps(answer, indent=2))
        return 0
    except CloudError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
