"""`%%cluster --backend k8s` through the REAL hub, the user's real server and kernel, to the dev
kube-apiserver: the cell's JobSet is created in the desk's namespace, Kueue (its TEST-ONLY
stand-in, `kube_standin`: Kueue cannot run on Kubernetes 1.20) finds its ClusterQueue stopped,
and the cell shows Kueue's words for why it waits, within moments, instead of hanging silently
(kueue#1844). Cancelling the job ends the cell."""

from __future__ import annotations

import threading
import time

import pytest

from tests.integration.conftest import api
from tests.integration.kube_standin import KueueStandIn
from tests.integration.test_kube_driver import KUEUE, make_desk

pytestmark = pytest.mark.integration

CELL = """%%cluster --backend k8s --nodes 2 --gpus-per-node 4 --launcher torchrun --name held
print("never runs here: no kubelet")
"""


def test_an_inadmissible_jobset_shows_kueues_reason_in_the_cell(hub, token, kernel, kube_api):
    if hub.kube_prefix is None:
        pytest.skip("the hub has no k8s backend (no dev kube-apiserver here)")
    with kube_api.admin() as admin, KueueStandIn(admin, [f"{hub.kube_prefix}desk-a"]) as standin:
        desk = make_desk(admin, hub.kube_prefix, "desk-a", gpus=16)
        standin.hold = True  # Kueue looks at the Workload only once the queue is stopped below
        k = kernel("alice")
        run: dict = {}
        shown = threading.Event()
        words = f"Kueue cannot admit it (inadmissible): ClusterQueue {desk.cluster_queue} is stopped"

        def watch(text: str) -> None:
            if words in text:
                shown.set()

        cell = threading.Thread(
            target=lambda: run.update(result=k.execute(CELL, timeout=180, on_output=watch)), daemon=True
        )
        cell.start()
        alice = api(hub, token("alice"))
        job = _wait(alice, lambda j: j["phase"] == "STARTING" and j["backend"] == "k8s")
        assert job["attempts"][0]["backend_ref"] == f"{desk.namespace}/{job['id']}-a1"

        stop = b'{"spec": {"stopPolicy": "Hold"}}'  # an admin stops desk-a's ClusterQueue after the submit
        headers = {"Content-Type": "application/merge-patch+json"}
        admin.patch(f"{KUEUE}/clusterqueues/{desk.cluster_queue}", content=stop, headers=headers).raise_for_status()
        standin.hold = False
        _wait(alice, lambda j: j["reason"] == words)
        assert shown.wait(timeout=60), "the cell never showed Kueue's reason"

        alice.post(f"jobs/{job['id']}/cancel").raise_for_status()
        cell.join(timeout=120)
        assert not cell.is_alive()
    assert words in run["result"].text, run["result"].text
    assert _wait(alice, lambda j: j["phase"] == "CANCELLED")["id"] == job["id"]


def _wait(client, check, timeout: float = 60) -> dict:
    """alice's newest job once `check` holds for it."""
    deadline = time.monotonic() + timeout
    while True:
        items = client.get("jobs", params={"limit": 1}).json()["items"]
        if items and check(items[0]):
            return items[0]
        if time.monotonic() > deadline:
            raise TimeoutError(f"job never got there: {items[0] if items else None}")
        time.sleep(0.2)
