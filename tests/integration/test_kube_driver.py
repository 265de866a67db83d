"""The kubernetes driver against a REAL kube-apiserver (`kube_api`: Kubernetes 1.20 built from
Debian's source, the pinned CRDs installed) and its real watch streams: create a JobSet, see
Kueue's reason for holding it, see it admitted and finished; cancel; refuse what would hang
suspended; and lose the API mid-watch and resume from the resourceVersion (or list again after
410 Gone) without missing what changed meanwhile.

Kueue and the JobSet controller cannot run on 1.20: `kube_standin` (TEST-ONLY) writes the
Workloads and statuses they would. Nothing here runs a pod."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from pathlib import Path

import pytest
import yaml

from cellscale.spec import JobSpec
from cellscale.vocabulary import AttemptState
from cellscale_hub.drivers.kubernetes import KubernetesDriver
from cellscale_hub.drivers.kubernetes.watch import JOBSET
from cellscale_hub.drivers.types import AttemptRef, SpecRejected
from tests.integration.kube_fixtures import kube_api  # noqa: F401 - the session fixture
from tests.integration.kube_standin import KueueStandIn

pytestmark = pytest.mark.integration

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
FLAVOR = "k8s"


@dataclasses.dataclass
class Desk:
    """One desk's namespace, LocalQueue `default` and ClusterQueue (8 GPUs), under a fresh prefix."""

    prefix: str
    namespace: str
    cluster_queue: str


def make_desk(admin, prefix: str, tenant: str = "desk-a", gpus: int = 8, local_queue: bool = True) -> Desk:
    ns, cq = f"{prefix}{tenant}", f"{prefix}{tenant}"
    created = [
        ("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        (
            f"{KUEUE}/resourceflavors",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": f"{prefix}{FLAVOR}"},
            },
        ),
        (
            f"{KUEUE}/clusterqueues",
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": cq},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": f"{prefix}{FLAVOR}",
                                    "resources": [{"name": "nvidia.com/gpu", "nominalQuota": gpus}],
                                }
                            ],
                        }
                    ],
                },
            },
        ),
    ]
    if local_queue:
        created.append(
            (
                f"{KUEUE}/namespaces/{ns}/localqueues",
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "LocalQueue",
                    "metadata": {"name": "default", "namespace": ns},
                    "spec": {"clusterQueue": cq},
                },
            )
        )
    for path, body in created:
        answer = admin.post(path, json=body)
        assert answer.status_code in (201, 409), answer.text
    return Desk(prefix, ns, cq)


def attempt(
    tmp_path: Path, job_id: str, gpus_per_node: int = 4, nodes: int = 2, launcher: str = "torchrun", **changes
) -> AttemptRef:
    spec = JobSpec(source="x = 1", launcher=launcher, resources={"nodes": nodes, "gpus_per_node": gpus_per_node})
    job_dir = tmp_path / "jobs" / job_id
    job_dir.mkdir(parents=True)
    ref = AttemptRef(
        job_id=job_id, number=1, job_dir=job_dir, spec=spec, owner="alice", tenant="desk-a", queue="default"
    )
    return dataclasses.replace(ref, **changes)


def within(rendered, stored) -> bool:
    """Every field rendered is stored with its value (the API adds its defaults)."""
    if isinstance(rendered, dict):
        return isinstance(stored, dict) and all(k in stored and within(v, stored[k]) for k, v in rendered.items())
    if isinstance(rendered, list):
        return isinstance(stored, list) and len(rendered) == len(stored) and all(map(within, rendered, stored))
    return rendered == stored


def until(driver: KubernetesDriver, ref: AttemptRef, check, timeout: float = 30):
    """Poll as the controller does until `check(observation)`; the last observation."""
    deadline = time.monotonic() + timeout
    while True:
        obs = driver.poll([ref])[ref.key]
        if check(obs) or time.monotonic() > deadline:
            return obs
        time.sleep(0.05)


@pytest.fixture
def desk(kube_api):  # noqa: F811
    with kube_api.admin() as admin:
        yield make_desk(admin, kube_api.unique("kd") + "-")


def make_driver(kubeconfig: Path, desk: Desk, **traits) -> KubernetesDriver:
    driver = KubernetesDriver(
        name="k8s", kubeconfig=str(kubeconfig), namespace_prefix=desk.prefix, image="cellscale:test", **traits
    )
    return driver


def test_create_watch_admit_succeed(kube_api, desk, tmp_path):  # noqa: F811
    driver = make_driver(kube_api.kubeconfig, desk)
    woken = threading.Event()
    driver.notify = woken.set
    ref = attempt(tmp_path, "cs-aaaaaaaaaaaa")
    try:
        with kube_api.admin() as admin, KueueStandIn(admin, [desk.namespace]) as standin:
            standin.hold = True  # Kueue has not looked at it yet
            ref = dataclasses.replace(ref, backend_ref=driver.submit(ref))
            assert ref.backend_ref == f"{desk.namespace}/cs-aaaaaaaaaaaa-a1"
            path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{desk.namespace}/jobsets/cs-aaaaaaaaaaaa-a1"
            stored = admin.get(path).json()
            assert within(yaml.safe_load(driver.render(ref))["spec"], stored["spec"])  # as rendered, plus defaults
            assert driver.submit(dataclasses.replace(ref, resubmit=True)) == ref.backend_ref  # adopted, not twice

            queued = until(driver, ref, lambda o: o.reason and o.reason.startswith("queued in Kueue"))
            assert (queued.state, queued.reason) == (
                AttemptState.STARTING,
                "queued in Kueue (not yet considered for admission)",
            )
            woken.clear()
            standin.hold = False
            admitted = until(driver, ref, lambda o: o.reason and o.reason.endswith("its pods are starting"))
            assert admitted.reason == f"admitted by Kueue to {desk.cluster_queue}; its pods are starting"
            assert woken.is_set()  # the watch told the controller at once

            standin.complete(desk.namespace, "JobSet", "cs-aaaaaaaaaaaa-a1")
            done = until(driver, ref, lambda o: o.state.ended)
            assert (done.state, done.reason) == (AttemptState.SUCCEEDED, "every node's Job completed")
    finally:
        driver.close()


def test_kueues_reasons_for_waiting_and_cancel(kube_api, desk, tmp_path):  # noqa: F811
    """8 GPUs of desk-a's 8 held by another job: Kueue's pending message is why it waits;
    cancelling deletes the JobSet (its pods first) and the attempt ends cancelled."""
    driver = make_driver(kube_api.kubeconfig, desk)
    holder, ref = attempt(tmp_path, "cs-bbbbbbbbbbbb"), attempt(tmp_path, "cs-cccccccccccc")
    try:
        with kube_api.admin() as admin, KueueStandIn(admin, [desk.namespace]):
            holder = dataclasses.replace(holder, backend_ref=driver.submit(holder))
            until(driver, holder, lambda o: o.reason and o.reason.endswith("its pods are starting"))
            ref = dataclasses.replace(ref, backend_ref=driver.submit(ref))
            waiting = until(driver, ref, lambda o: o.reason and o.reason.startswith("Kueue queues it"))
            assert waiting.reason == (
                "Kueue queues it: couldn't assign flavors to pod set node: insufficient unused quota for "
                f"nvidia.com/gpu in flavor {desk.prefix}{FLAVOR}, 8 more needed"
            )
            driver.cancel(ref)
            gone = until(driver, ref, lambda o: o.state.ended)
            assert gone.state is AttemptState.CANCELLED
            path = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{desk.namespace}/jobsets/cs-cccccccccccc-a1"
            left = admin.get(path)  # no garbage collector here: a foreground delete leaves it marked
            assert left.status_code == 404 or left.json()["metadata"]["deletionTimestamp"]
    finally:
        driver.close()


def test_never_submits_what_would_hang_suspended(kube_api, tmp_path):  # noqa: F811
    with kube_api.admin() as admin:
        desk = make_desk(admin, kube_api.unique("kd") + "-", local_queue=False)
        driver = make_driver(kube_api.kubeconfig, desk, queue_check_seconds=0)
        spec = JobSpec(source="x", resources={"gpus_per_node": 1})
        try:
            with pytest.raises(SpecRejected) as refused:
                driver.validate_for(spec, "desk-a", "default")
            assert str(refused.value) == (
                f"Kueue has no LocalQueue 'default' in namespace {desk.namespace}: the job would wait suspended "
                "forever; ask an admin to apply the desk's tenancy to the cluster (docs/kubernetes.md)"
            )
            local = {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "default", "namespace": desk.namespace},
                "spec": {"clusterQueue": desk.cluster_queue, "stopPolicy": "Hold"},
            }
            assert admin.post(f"{KUEUE}/namespaces/{desk.namespace}/localqueues", json=local).status_code == 201
            with pytest.raises(SpecRejected) as refused:
                driver.submit(attempt(tmp_path, "cs-dddddddddddd"))
            assert str(refused.value) == (
                f"Kueue's LocalQueue 'default' in {desk.namespace} is stopped (stopPolicy Hold): nothing new is "
                "admitted until an admin resumes it"
            )
            jobsets = admin.get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{desk.namespace}/jobsets").json()
            assert jobsets["items"] == []  # nothing was created
        finally:
            driver.close()


class CuttableProxy:
    """A TCP forwarder to the apiserver that a test can cut (every connection closed, new ones
    refused) and restore on the same port: the driver's watch really loses its stream."""

    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self.port = 0
        self._conns: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.restore()

    def restore(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(16)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() below, freeing the port
        except OSError:
            pass
        self._listener.close()
        for conn in self._conns:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.close()
        self._conns.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self._conns += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for s in (source, sink):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def proxied_kubeconfig(kube_api, port: int, path: Path) -> Path:  # noqa: F811
    config = yaml.safe_load(Path(kube_api.kubeconfig).read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path.write_text(yaml.safe_dump(config))
    return path


def test_a_cut_watch_resumes_from_its_resource_version(kube_api, desk, tmp_path):  # noqa: F811
    """The API goes away mid-watch: the cache answers for `stale_after_s`, then UNKNOWN (never
    gone); what changed meanwhile is seen when the watch resumes from its resourceVersion (no
    new list); a resourceVersion the API has forgotten (410 Gone) makes it list again."""
    host, port = kube_api.server.removeprefix("https://").rsplit(":", 1)
    proxy = CuttableProxy((host, int(port)))
    kubeconfig = proxied_kubeconfig(kube_api, proxy.port, tmp_path / "kubeconfig")
    driver = make_driver(kubeconfig, desk, stale_after_s=1.0)
    ref = attempt(tmp_path, "cs-eeeeeeeeeeee")
    try:
        with kube_api.admin() as admin, KueueStandIn(admin, [desk.namespace]) as standin:
            ref = dataclasses.replace(ref, backend_ref=driver.submit(ref))
            until(driver, ref, lambda o: o.reason and o.reason.endswith("its pods are starting"))
            stream = driver.stream(JOBSET, desk.namespace)
            assert stream.relists == 1

            proxy.cut()
            standin.complete(desk.namespace, "JobSet", "cs-eeeeeeeeeeee-a1")  # while the driver is away
            away = until(driver, ref, lambda o: o.state is AttemptState.UNKNOWN, timeout=20)
            assert away.state is AttemptState.UNKNOWN, away
            assert away.reason.startswith(f"the watch of jobsets in {desk.namespace} has been cut off for ")

            proxy.restore()
            done = until(driver, ref, lambda o: o.state.ended)
            assert done.state is AttemptState.SUCCEEDED
            assert stream.relists == 1  # resumed from its resourceVersion, not listed again

            stream.resource_version = "1"  # long compacted away: the API answers 410 Gone
            proxy.cut()
            proxy.restore()
            relisted = time.monotonic() + 20
            while stream.relists == 1 and time.monotonic() < relisted:
                time.sleep(0.05)
            assert stream.relists == 2
            assert until(driver, ref, lambda o: o.state.ended).state is AttemptState.SUCCEEDED
    finally:
        driver.close()
        proxy.cut()


def test_the_hubs_namespaced_role_is_enough(kube_api, kube_desks, tmp_path):  # noqa: F811
    """As the hub's own ServiceAccount (namespaced Roles from `kube.tenancy`, no cluster-wide
    right) in the mirrored desks: check the queue, create, watch and cancel."""
    kubeconfig = kube_api.kubeconfig_for(kube_desks.hub_token, tmp_path / "hub-kubeconfig")
    driver = KubernetesDriver(name="k8s", kubeconfig=str(kubeconfig), namespace_prefix=kube_desks.prefix)
    ref = attempt(tmp_path, "cs-ffffffffffff", gpus_per_node=2)
    try:
        with kube_api.admin() as admin, KueueStandIn(admin, [kube_desks.namespace("desk-a")]):
            driver.validate_for(ref.spec, "desk-a", "default")
            ref = dataclasses.replace(ref, backend_ref=driver.submit(ref))
            admitted = until(driver, ref, lambda o: o.reason and o.reason.endswith("its pods are starting"))
            assert admitted.reason == f"admitted by Kueue to {kube_desks.prefix}desk-a; its pods are starting"
            driver.cancel(ref)
            assert until(driver, ref, lambda o: o.state.ended).state is AttemptState.CANCELLED
    finally:
        driver.close()


def test_a_ray_cell_is_a_rayjob_through_kueue(kube_api, desk, tmp_path):  # noqa: F811
    driver = make_driver(kube_api.kubeconfig, desk)
    ref = attempt(tmp_path, "cs-999999999999", gpus_per_node=2, launcher="ray")
    try:
        with kube_api.admin() as admin, KueueStandIn(admin, [desk.namespace]) as standin:
            ref = dataclasses.replace(ref, backend_ref=driver.submit(ref))
            admitted = until(driver, ref, lambda o: o.reason and o.reason.endswith("its pods are starting"))
            assert admitted.reason == f"admitted by Kueue to {desk.cluster_queue}; its pods are starting"
            standin.fail(
                desk.namespace, "RayJob", "cs-999999999999-a1", "Job entrypoint command failed with exit code 1"
            )
            failed = until(driver, ref, lambda o: o.state.ended)
            assert (failed.state, failed.reason) == (
                AttemptState.FAILED,
                "RayJob failed: Job entrypoint command failed with exit code 1",
            )
    finally:
        driver.close()
