"""The Slurm cluster's nodes, as the driver sees them: the partition's capacity (what its
jobs may use of each node), the nodes' states and reasons (failed nodes, spot reclaim
notices), and, for a partition of rented nodes, its cloud bill and which attempt held which
node when."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx

from cellscale.spec import BackendView, Launcher
from cellscale_hub.drivers.capabilities import CloudPool, Instance, Run, WatchesNodes
from cellscale_hub.drivers.slurm.parse import NOTICE_REASON, expand_hostlist, gpus_of, key_values, tres
from cellscale_hub.drivers.types import AttemptRef
from cellscale_hub.scheduling.resources import Amounts


@dataclass(frozen=True)
class PartitionLimits:
    """What a partition keeps from its jobs on every node."""

    max_cpus_per_node: int | None  # MaxCPUsPerNode: the cores all its jobs together may hold on a node
    no_gpus: bool  # its QOS allows no GPU

    def cores_of(self, node_cpus: int) -> int:
        return node_cpus if self.max_cpus_per_node is None else min(node_cpus, self.max_cpus_per_node)


class SlurmNodes(WatchesNodes, CloudPool):
    """A mixin of `SlurmDriver`: `sinfo --json` (reused `nodes_seconds`), the partition's limits,
    and the cloud ledger (`cloud_ledger_url`)."""

    def capacity(self) -> BackendView:
        """The partition's nodes, GPUs, cores and memory (sinfo, `scontrol show partition`),
        as far as its jobs may use them: at most `MaxCPUsPerNode` cores of each node (a
        partition that shares nodes with another, like a CPU partition on GPU nodes), and no
        GPUs when the partition's QOS allows none."""
        now = time.monotonic()
        if self._capacity and now - self._capacity[0] < self.capacity_seconds:
            return self._capacity[1]
        nodes = [n for n in self._nodes() if self.partition in n.get("partitions", [])]
        limits = self._partition_limits() if nodes else PartitionLimits(None, no_gpus=False)  # no such partition
        gpus = [0 if limits.no_gpus else gpus_of(n.get("gres", "")) for n in nodes]
        cpus = [limits.cores_of(int(n.get("cpus", 0))) for n in nodes]
        memory = [int(n.get("real_memory", 0)) for n in nodes]
        per_node = max(gpus, default=0)
        view = BackendView(
            name=self.name,
            kind=self.kind,
            capacity_gpus=sum(gpus),
            max_nodes=len(nodes),
            gpus_per_node=per_node,
            launchers=list(Launcher),
            capacity_cpus=sum(cpus),
            cpus_per_node=max(cpus, default=0),
            capacity_memory_mb=sum(memory),
            memory_mb_per_node=max(memory, default=0),
        )
        self._capacity = (now, view)
        return view

    def _nodes(self, fresh: bool = False) -> list[dict]:
        """Every node of the cluster, as `sinfo --json` describes it (reused `nodes_seconds`,
        unless `fresh`)."""
        now = time.monotonic()
        if not fresh and self._node_info and now - self._node_info[0] < self.nodes_seconds:
            return self._node_info[1]
        nodes = self._json(["sinfo", "--json"])["nodes"]
        self._node_info = (now, nodes)
        return nodes

    def _partition_limits(self) -> PartitionLimits:
        """What the partition itself holds back: its MaxCPUsPerNode, and whether its QOS
        (a partition QOS with MaxTRESPerJob or MaxTRESPerNode gres/gpu=0) allows no GPU."""
        fields = key_values(self._run(["scontrol", "-o", "show", "partition", self.partition]))
        max_cpus = fields.get("MaxCPUsPerNode", "")
        qos = fields.get("QoS", "N/A")
        no_gpus = False
        if qos not in ("N/A", "(null)", ""):
            rows = self._run(["sacctmgr", "-n", "-P", "show", "qos", qos, "format=maxtres,maxtrespernode"])
            no_gpus = any(tres(limit).get("gres/gpu") == "0" for limit in re.split(r"[|\n]", rows))
        return PartitionLimits(int(max_cpus) if max_cpus.isdigit() else None, no_gpus)

    def _cluster_amounts(self) -> Amounts:
        """GPUs, cores and memory (MiB) of this backend's whole cluster (the one its
        `slurm_conf` names), every partition's nodes, powered-down CLOUD nodes included (a burst
        partition's jobs are charged to the same accounts): an account's GrpTRES counts its
        jobs in all of them."""
        nodes = self._nodes()
        return Amounts(
            sum(gpus_of(n.get("gres", "")) for n in nodes),
            sum(int(n.get("cpus", 0)) for n in nodes),
            sum(int(n.get("real_memory", 0)) for n in nodes),
        )

    def cloud_instances(self) -> list[Instance]:
        if not self.cloud_ledger_url:
            return []
        token = Path(self.cloud_ledger_token_file).read_text().strip() if self.cloud_ledger_token_file else ""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        answer = httpx.get(self.cloud_ledger_url, headers=headers, timeout=self.command_timeout)
        answer.raise_for_status()
        return [
            Instance(
                str(i["node"]),
                float(i["requested"]),
                None if i.get("stopped") is None else float(i["stopped"]),
                float(i["dollars"]),
            )
            for i in answer.json()["instances"]
        ]

    def node_runs(self, refs: list[AttemptRef]) -> list[Run]:
        """From sacct: each attempt's nodes, from its allocation (its Start: the nodes were
        requested then) to its end."""
        ids = {ref.backend_ref: ref for ref in refs if ref.backend_ref}
        if not ids:
            return []
        jobs = self._json(["sacct", "--json", "-X", f"--clusters={self.cluster_name()}", "-j", ",".join(ids)])["jobs"]
        runs = []
        for job in jobs:
            ref = ids.get(str(job.get("job_id")))
            times = job.get("time") or {}
            if ref is None or not times.get("start"):
                continue
            end = float(times["end"]) if times.get("end") else None
            for node in expand_hostlist(str(job.get("nodes") or "")):
                runs.append(Run(ref.key, node, float(times["start"]), end))
        return runs

    def node_notices(self) -> dict[str, str]:
        """This partition's nodes whose Slurm reason is a spot reclaim notice
        (`spot-reclaim: terminating in 30 s`): node -> the notice."""
        return {
            n["name"]: str(n.get("reason") or "")
            for n in self._nodes()
            if self.partition in n.get("partitions", [])
            and str(n.get("reason") or "").startswith(NOTICE_REASON)
            and "POWERED_DOWN" not in n.get("state_flags", [])  # already gone: no longer a notice
        }

    def _node_reasons(self, nodes: Iterable[str]) -> dict[str, str]:
        """Slurm's reason of each of these nodes that has one, whatever its state (a
        stockout leaves the nodes powered-down idle, with the reason kept). Read fresh: asked
        once a job's nodes failed, and a node list kept from before the failure lacks the reason
        (the job's capacity fault was then called an infrastructure one)."""
        wanted = set(nodes)
        if not wanted:
            return {}
        try:
            info = self._nodes(fresh=True)
        except (RuntimeError, ValueError, KeyError):
            return {}
        return {n["name"]: str(n["reason"]) for n in info if n["name"] in wanted and n.get("reason")}

    def _down_nodes(self, nodes: str) -> list[tuple[str, str]]:
        """(name, Slurm's reason) of the job's nodes that are down, drained or failed."""
        try:
            hosts = set(self._run(["scontrol", "show", "hostnames", nodes]).split()) if nodes else set()
            info = json.loads(self._run(["sinfo", "--json"]))["nodes"]
        except (RuntimeError, ValueError, KeyError):
            return []
        return [
            (n["name"], n.get("reason") or "down")
            for n in info
            if n["name"] in hosts and any(s in str(n.get("state", "")).upper() for s in ("DOWN", "DRAIN", "FAIL"))
        ]
