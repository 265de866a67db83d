"""The Kubernetes backend: one JobSet (torchrun, plain, jax) or RayJob (ray) per attempt,
submitted suspended through Kueue, in the desk's namespace.

`render()` is the exact manifest (golden-file tested, `manifests`). The Driver methods are
synchronous (the controller calls them); the client is asynchronous (kubernetes_asyncio) and
runs on an event loop of its own, in a thread (`watch.KubeWatches`). It keeps ONE
list-then-watch per kind (JobSet, RayJob, Kueue Workload) per desk namespace (the hub holds
namespaced Roles only: no cluster-wide list or watch), with a cache of the latest objects;
`poll` answers from the cache (UNKNOWN while a watch is cut off beyond `stale_after_s`, never
"gone"). A watch that ends resumes from its last resourceVersion; one the API answers 410 Gone
lists again. Every change to a watched object calls `notify()`, so Kueue's reason for holding
a job reaches "why pending" at once rather than at the next tick.

The pods run the per-node supervisor as the job's owner and write the job directory on a
shared volume (a PersistentVolumeClaim mounted where the control plane has its jobs root), so
logs, heartbeats, exit records and outputs are read as on Slurm, and log followers keep
following while the pods are pending.
"""

from __future__ import annotations

import json
import logging
import pwd
import time

from traitlets import Float, Integer, List, TraitError, Unicode, default

from cellscale.runtime.records import LaunchPlan, PreemptNotice
from cellscale.spec import BackendView, JobSpec, Launcher
from cellscale.vocabulary import AttemptState, ExitReason, Fault
from cellscale_hub.drivers.base import Driver
from cellscale_hub.drivers.capabilities import ChecksQueue, MirrorsTenancy
from cellscale_hub.drivers.jobfiles import fault_from_job_dir, heartbeat_of
from cellscale_hub.drivers.kubernetes import manifests
from cellscale_hub.drivers.kubernetes.names import NotAKubernetesName, namespace
from cellscale_hub.drivers.kubernetes.status import condition, observe
from cellscale_hub.drivers.kubernetes.tenancy import levels_of
from cellscale_hub.drivers.kubernetes.watch import (
    JOBSET,
    LOCALQUEUE,
    RAYJOB,
    WORKLOAD,
    Kind,
    KubeWatches,
    typed,
    why_unknown,
)
from cellscale_hub.drivers.owners import hand_files_to_owner, hand_to_owner
from cellscale_hub.drivers.types import AttemptRef, BackendUnreachable, Observation, SpecRejected
from cellscale_hub.tenancy import Tenancy

log = logging.getLogger("cellscale.kubernetes")


class KubernetesDriver(KubeWatches, Driver, ChecksQueue, MirrorsTenancy):
    kind = "kubernetes"

    kubeconfig = Unicode(
        "",
        help="""The kubeconfig the control plane uses (its identity needs only the namespaced Role
        `drivers.kubernetes.tenancy` renders in each desk's namespace). Empty: the in-cluster service account
        (when the hub runs in a pod), else ~/.kube/config.""",
    ).tag(config=True)
    context = Unicode("", help="The kubeconfig context to use; empty: its current context.").tag(config=True)
    namespace_prefix = Unicode(
        "", help="Prefix of every desk's namespace (`<prefix><desk>`), as `drivers.kubernetes.tenancy` creates them."
    ).tag(config=True)
    image = Unicode(
        "cellscale:latest",
        help="The jobs' pods' container image: cellscale (and torch, ray, jax as the site's jobs need) installed.",
    ).tag(config=True)
    python = Unicode("python3", help="The Python in `image` that runs the per-node supervisor.").tag(config=True)
    jobs_claim = Unicode(
        "cellscale-jobs",
        help="""The PersistentVolumeClaim, in every desk's namespace, holding the jobs root (a ReadWriteMany
        volume: NFS, CephFS, Lustre). The pods mount it where the control plane has its jobs root
        (ControlPlane.jobs_root): the job directory is the same path on both sides.""",
    ).tag(config=True)
    jobs_root = Unicode(
        "", help="The jobs root as the control plane and the pods see it; empty: the control plane's (set at start)."
    ).tag(config=True)
    service_account = Unicode(
        "cellscale-jobs", help="The ServiceAccount (in each desk's namespace) the jobs' pods run under: no API rights."
    ).tag(config=True)
    topology_level = Unicode(
        "",
        help="""The node label of one leaf switch's domain, a level of the Kueue Topology the flavor names
        (e.g. cloud.provider.com/topology-block). `--switches 1` then requires the gang under one such
        domain, more switches prefer as few as possible. Empty: --switches is refused. The tenancy mirror
        (`drivers.kubernetes.tenancy --topology-level`) creates the Topology and names it in the flavors.""",
    ).tag(config=True)
    topology_levels = List(
        Unicode(),
        help="""Every level of the backend's Kueue Topology, widest first, each a node label: e.g.
        [cloud.provider.com/topology-block, cloud.provider.com/topology-rack, kubernetes.io/hostname]
        (kubernetes.io/hostname only last). `topology_level` must be one of them. Empty: `topology_level`
        above kubernetes.io/hostname. Give the mirror the same (`--topology-levels`).""",
    ).tag(config=True)
    master_port = Integer(29500, help="The rendezvous port on node 0's pod (torchrun, jax).").tag(config=True)
    nodes = Integer(4, min=1, help="Nodes of the fleet behind the flavor (the hub cannot list nodes).").tag(config=True)
    gpus_per_node = Integer(8, min=0, help="GPUs (nvidia.com/gpu) of each node.").tag(config=True)
    cpus_per_node = Integer(64, min=1, help="Allocatable cores of each node.").tag(config=True)
    memory_mb_per_node = Integer(512 * 1024, min=1, help="Allocatable memory of each node, MiB.").tag(config=True)
    stale_after_s = Float(
        30.0,
        help="""How long the cache answers after a watch was cut off: beyond it, `poll` says UNKNOWN for the
        namespace's attempts (kept, never taken as gone) until the watch is back.""",
    ).tag(config=True)
    queue_check_seconds = Float(
        10.0, help="How long a desk's LocalQueue, as read for the check before submit, is reused."
    ).tag(config=True)
    request_timeout = Float(20.0, help="Seconds one API request may take.").tag(config=True)
    watch_timeout_s = Integer(
        240, min=5, help="Seconds the API server keeps one watch open before the driver resumes it."
    ).tag(config=True)

    @default("name")
    def _default_name(self) -> str:
        return "k8s"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        try:
            levels_of(self.topology_level, self.topology_levels)
        except ValueError as exc:
            raise TraitError(f"KubernetesDriver {self.name!r}: {exc}") from None
        self._queues: dict[tuple[str, str], tuple[float, dict | None]] = {}
        self._cancelled: set[tuple[str, int]] = set()  # attempts cancel() deleted: their absence is no loss
        self._created: dict[tuple[str, int], float] = {}  # attempts submit() created, when

    # -- capacity, shape, validation -----------------------------------------------------------------
    def capacity(self) -> BackendView:
        return BackendView(
            name=self.name,
            kind=self.kind,
            capacity_gpus=self.nodes * self.gpus_per_node,
            max_nodes=self.nodes,
            gpus_per_node=self.gpus_per_node,
            launchers=list(Launcher),
            capacity_cpus=self.nodes * self.cpus_per_node,
            cpus_per_node=self.cpus_per_node,
            capacity_memory_mb=self.nodes * self.memory_mb_per_node,
            memory_mb_per_node=self.memory_mb_per_node,
        )

    def validate(self, spec: JobSpec) -> None:
        super().validate(spec)  # sweeps are refused before, by placement (it is no RunsSweeps)
        if spec.resources.switches and not self.topology_level:
            raise SpecRejected(
                f"backend {self.name!r} has no topology level configured for --switches; leave --switches out"
            )

    def validate_for(self, spec: JobSpec, tenant: str, queue: str) -> None:
        """Refuse what Kueue would hold suspended forever: the desk's LocalQueue missing,
        stopped or inactive (its ClusterQueue missing or stopped, as Kueue reports it on the
        LocalQueue). Quota a job could never get is refused before, by cellscale's own tenancy,
        which the ClusterQueues mirror. An API that does not answer is said so, not guessed."""
        ns = self._namespace(tenant)
        lq = self._local_queue(ns, queue)
        if lq is None:
            raise SpecRejected(
                f"Kueue has no LocalQueue {queue!r} in namespace {ns}: the job would wait suspended forever; "
                "ask an admin to apply the desk's tenancy to the cluster (docs/kubernetes.md)"
            )
        stop = (lq.get("spec") or {}).get("stopPolicy") or "None"
        if stop != "None":
            raise SpecRejected(
                f"Kueue's LocalQueue {queue!r} in {ns} is stopped (stopPolicy {stop}): nothing new is admitted "
                "until an admin resumes it"
            )
        active = condition(lq, "Active")
        if active is not None and active.get("status") == "False":
            raise SpecRejected(
                f"Kueue's LocalQueue {queue!r} in {ns} is inactive ({active.get('reason')}: "
                f"{active.get('message')}): the job would wait suspended; ask an admin to fix its ClusterQueue "
                f"{(lq.get('spec') or {}).get('clusterQueue')!r}"
            )

    def _local_queue(self, ns: str, queue: str) -> dict | None:
        from kubernetes_asyncio.client.exceptions import ApiException

        key = (ns, queue)
        cached = self._queues.get(key)
        if cached and time.monotonic() - cached[0] < self.queue_check_seconds:
            return cached[1]
        try:
            lq = self._run(self._request("GET", self._path(LOCALQUEUE, ns, queue)))
        except ApiException as exc:
            if exc.status != 404:
                raise BackendUnreachable(
                    f"the Kubernetes API did not say whether LocalQueue {queue!r} in {ns} can admit jobs "
                    f"({exc.status} {exc.reason}); try again"
                ) from None
            lq = None
        except Exception as exc:
            raise BackendUnreachable(
                f"the Kubernetes API does not answer ({type(exc).__name__}: {exc}); cannot check LocalQueue "
                f"{queue!r} in {ns}: try again"
            ) from None
        self._queues[key] = (time.monotonic(), lq)
        return lq

    # -- the manifest --------------------------------------------------------------------------------
    def _namespace(self, tenant: str) -> str:
        try:
            return namespace(tenant, self.namespace_prefix)
        except NotAKubernetesName as exc:
            raise SpecRejected(str(exc)) from None

    def settings(self, ref: AttemptRef) -> manifests.KubeSettings:
        return manifests.KubeSettings(
            image=self.image,
            python=self.python,
            jobs_claim=self.jobs_claim,
            jobs_root=self.jobs_root or str(ref.job_dir.parent),
            namespace_prefix=self.namespace_prefix,
            service_account=self.service_account,
            topology_level=self.topology_level,
            master_port=self.master_port,
        )

    def attempt(self, ref: AttemptRef) -> manifests.Attempt:
        try:
            owner = pwd.getpwnam(ref.owner)
        except KeyError:
            raise SpecRejected(f"there is no Unix user {ref.owner!r}: the job's pods run as its owner's uid") from None
        return manifests.Attempt(
            job_id=ref.job_id,
            number=ref.number,
            job_dir=ref.job_dir,
            spec=ref.spec,
            owner=ref.owner,
            tenant=ref.tenant,
            queue=ref.queue or "default",
            uid=owner.pw_uid,
            gid=owner.pw_gid,
        )

    def manifest(self, ref: AttemptRef) -> dict:
        try:
            return manifests.render(self.attempt(ref), self.settings(ref))
        except (NotAKubernetesName, ValueError) as exc:
            raise SpecRejected(str(exc)) from None

    def render(self, ref: AttemptRef) -> str:
        """The exact JobSet or RayJob `submit` creates (YAML): a pure function of the attempt
        and the traits (the owner's uid from the user database, no API request)."""
        return manifests.to_yaml(self.manifest(ref))

    def launch_plan(self, ref: AttemptRef) -> LaunchPlan:
        """Node 0 by its DNS name in the JobSet's headless service; a RayJob's cluster is KubeRay's."""
        plan = super().launch_plan(ref)
        if ref.spec.launcher is Launcher.ray:
            return plan.model_copy(update={"ray_cluster": "backend"})
        host = manifests.master_host(self.attempt(ref)) if ref.spec.resources.nodes > 1 else "127.0.0.1"
        return plan.model_copy(update={"master_addr": host, "master_port": self.master_port})

    # -- submit / poll / cancel / warn ---------------------------------------------------------------
    def submit(self, ref: AttemptRef) -> str:
        """Create the JobSet or RayJob (suspended; Kueue admits it). Idempotent: one that exists
        already (submitted before a restart) is adopted. Checked again just before: a LocalQueue
        that stopped since the job was admitted fails the submit with words, nothing created."""
        from kubernetes_asyncio.client.exceptions import ApiException

        manifest = self.manifest(ref)
        ns, name = manifest["metadata"]["namespace"], manifest["metadata"]["name"]
        self.watch_namespace(ns)
        self.validate_for(ref.spec, ref.tenant, ref.queue or "default")
        hand_to_owner(ref.owner, ref.job_dir)
        kind = _kind(ref.spec)
        try:
            created = self._run(self._request("POST", self._path(kind, ns), body=manifest))
        except ApiException as exc:
            if exc.status != 409:  # 409: it exists (a resubmit after a restart): adopt it
                raise RuntimeError(f"creating {kind.kind} {ns}/{name} failed: {exc.status} {_api_words(exc)}") from None
        else:
            stream = self.stream(kind, ns)
            if stream is not None and name not in stream.objects:
                stream.objects[name] = typed(created, kind)  # the watch's ADDED event may come after the next poll
        self._created[ref.key] = time.monotonic()  # a list begun before the create may not hold it yet
        return f"{ns}/{name}"

    def poll(self, refs: list[AttemptRef]) -> dict[tuple[str, int], Observation]:
        observed: dict[tuple[str, int], Observation] = {}
        for ref in refs:
            if not ref.backend_ref:
                observed[ref.key] = Observation(AttemptState.SUBMITTING)
                continue
            observed[ref.key] = self._observe(ref)
        return observed

    def _observe(self, ref: AttemptRef) -> Observation:
        ns, name = ref.backend_ref.split("/", 1)
        kind = _kind(ref.spec)
        self.watch_namespace(ns)
        stream, workloads = self.stream(kind, ns), self.stream(WORKLOAD, ns)
        unknown = why_unknown(stream, self.stale_after_s) or why_unknown(workloads, self.stale_after_s)
        if unknown:
            return Observation(AttemptState.UNKNOWN, reason=unknown)
        obj = stream.objects.get(name)
        if obj is None:
            return self._gone(ref, kind)
        workload = _workload_of(list(workloads.objects.values()), kind.kind, name)  # a copy: the loop thread writes
        view = observe(obj, workload)
        supervisors = self._supervisors(ref)
        if view.state is AttemptState.CANCELLED and ref.key not in self._cancelled:
            return Observation(AttemptState.LOST, reason=f"its {kind.kind} is being deleted (not by cellscale)")
        if view.state is AttemptState.FAILED:
            error = ref.dir.read_error(ref.number)
            reason = error.summary if error else view.reason
            return Observation(AttemptState.FAILED, reason=reason, fault=fault_from_job_dir(ref, supervisors))
        if view.state.ended:
            return Observation(
                view.state, exit_code=0 if view.state is AttemptState.SUCCEEDED else None, reason=view.reason
            )
        started = ref.dir.read_started(ref.number)
        if view.evicted and started:
            return Observation(
                AttemptState.FAILED, reason=f"{view.reason.split('; Kueue queues it')[0]}", fault=Fault.PREEMPTION
            )
        if view.reason and view.reason.startswith("admitted by Kueue"):
            running = ref.dir.ranks_started(ref.number) >= self.launch_plan(ref).expected_ranks
            heartbeat, step = heartbeat_of(ref, supervisors)
            if running:
                return Observation(AttemptState.RUNNING, heartbeat=heartbeat, step=step)
            return Observation(AttemptState.STARTING, reason=view.reason, heartbeat=heartbeat, step=step)
        return Observation(view.state, reason=view.reason)

    def _gone(self, ref: AttemptRef, kind: Kind) -> Observation:
        """The object is not (or no longer) in the API: its supervisors' exit records say how it
        ended; cancelled by cellscale without any; else lost (deleted by someone else)."""
        records = [ref.dir.read_exit(ref.number, node) for node in range(self._supervisors(ref))]
        if records and all(r is not None for r in records):
            if all(r.reason is ExitReason.SUCCEEDED for r in records):
                return Observation(AttemptState.SUCCEEDED, exit_code=0, reason="every rank exited 0")
            if any(r.reason is ExitReason.CANCELLED for r in records) and ref.key in self._cancelled:
                return Observation(AttemptState.CANCELLED, reason="cancelled")
            fault = fault_from_job_dir(ref, len(records))
            return Observation(AttemptState.FAILED, reason=f"its {kind.kind} is gone; a node failed", fault=fault)
        if ref.key in self._cancelled:
            return Observation(AttemptState.CANCELLED, reason=f"its {kind.kind} was deleted on request")
        if time.monotonic() - self._created.get(ref.key, -1e9) < self.stale_after_s:
            return Observation(AttemptState.STARTING, reason=f"{kind.kind} created; its watch has not seen it yet")
        return Observation(
            AttemptState.LOST,
            reason=f"its {kind.kind} {ref.backend_ref} was deleted outside cellscale",
        )

    def _supervisors(self, ref: AttemptRef) -> int:
        """Supervisors of the attempt: one per node; one for a RayJob (its entrypoint's)."""
        return 1 if ref.spec.launcher is Launcher.ray else ref.spec.resources.nodes

    def cancel(self, ref: AttemptRef) -> None:
        """Delete the JobSet or RayJob, its pods first (foreground propagation): the supervisors
        get SIGTERM and write their exit records; Kueue releases the quota."""
        from kubernetes_asyncio.client.exceptions import ApiException

        self._cancelled.add(ref.key)
        if not ref.backend_ref:
            return
        ns, name = ref.backend_ref.split("/", 1)
        kind = _kind(ref.spec)
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"}
        try:
            self._run(self._request("DELETE", self._path(kind, ns, name), body=body))
        except ApiException as exc:
            if exc.status != 404:
                raise RuntimeError(
                    f"deleting {kind.kind} {ref.backend_ref} failed: {exc.status} {_api_words(exc)}"
                ) from None

    def warn(self, ref: AttemptRef) -> None:
        """The preemption warning, through the job directory (what a supervisor's SIGUSR1
        handler writes): the control plane cannot signal processes in pods."""
        ref.dir.write_preempt_notice(ref.number, PreemptNotice(at=time.time()))
        hand_files_to_owner(ref.owner, [ref.dir.preempt_notice(ref.number)])

    def apply_tenancy(self, tenancy: Tenancy) -> None:
        """Watch the namespace of every desk with quota on this backend (so its attempts are in
        the cache before they are polled). The Kueue objects themselves are `drivers.kubernetes.tenancy`'s."""
        for tenant, config in tenancy.tenants.items():
            queues = {local.cluster_queue for local in config.queues.values()}
            if any(tenancy.flavors_for(cq, self.name) for cq in queues):
                try:
                    self.watch_namespace(namespace(tenant, self.namespace_prefix))
                except NotAKubernetesName:
                    log.warning("desk %r cannot be a Kubernetes namespace: it cannot use backend %s", tenant, self.name)


def _kind(spec: JobSpec) -> Kind:
    """What one attempt is: a RayJob for a Ray cell, else a JobSet."""
    return RAYJOB if spec.launcher is Launcher.ray else JOBSET


def _workload_of(workloads, kind: str, name: str) -> dict | None:
    """Kueue's Workload of the JobSet or RayJob (its owner reference names it)."""
    for workload in workloads:
        for owner in (workload.get("metadata") or {}).get("ownerReferences") or []:
            if owner.get("kind") == kind and owner.get("name") == name:
                return workload
    return None


def _api_words(exc) -> str:
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)
