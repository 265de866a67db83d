"""User servers on Kubernetes through KubeSpawner's own code (DeskKubeSpawner, drivers/kubernetes/spawner.py),
against the real dev kube-apiserver, as the hub's own ServiceAccount (namespaced Roles only):
alice of desk-a gets her pod in desk-a's namespace with her desk's profile; desk-b's profile
is refused with words, and nothing is created for it.

The pod never runs (no scheduler or kubelet here): the test checks the pod object the apiserver
stored, then stops the server (KubeSpawner deletes the pod)."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from jupyterhub import orm
from jupyterhub.objects import Hub
from jupyterhub.user import User
from kubernetes_asyncio.config import kube_config
from kubespawner import clients as kubespawner_clients
from traitlets.config import Config

from cellscale_hub.drivers.kubernetes.spawner import DeskKubeSpawner, ProfileRefused

pytestmark = pytest.mark.integration

IMAGE_A = "quay.io/jupyter/pytorch-notebook:2024-12-02"
IMAGE_B = "quay.io/jupyter/scipy-notebook:2024-12-02"
PROFILES = {
    "desk-a": [
        {"slug": "desk-a-cpu", "display_name": "desk-a: CPU", "kubespawner_override": {"image": IMAGE_A}},
        {
            "slug": "desk-a-gpu",
            "display_name": "desk-a: one GPU",
            "kubespawner_override": {
                "image": IMAGE_A,
                "cpu_guarantee": 2,
                "mem_guarantee": "4G",
                "extra_resource_limits": {"nvidia.com/gpu": "1"},
            },
        },
    ],
    "desk-b": [{"slug": "desk-b-cpu", "display_name": "desk-b: CPU", "kubespawner_override": {"image": IMAGE_B}}],
}


def spawner_of(name: str, groups: list[str], prefix: str) -> DeskKubeSpawner:
    """The user's default server's spawner, made by JupyterHub's own User from its ORM records."""
    db = orm.new_session_factory("sqlite:///:memory:")()
    user = orm.User(name=name)
    user.groups = [orm.Group(name=group) for group in groups]
    db.add(user)
    db.add(orm.Spawner(user=user, name=""))
    db.commit()
    config = Config()
    config.DeskKubeSpawner.desk_profiles = PROFILES
    config.DeskKubeSpawner.namespace_prefix = prefix
    config.DeskKubeSpawner.cpu_guarantee = 0.5
    config.DeskKubeSpawner.mem_guarantee = "1G"
    config.DeskKubeSpawner.start_timeout = 60
    settings = {"spawner_class": DeskKubeSpawner, "config": config, "hub": Hub(), "domain": ""}
    return User(user, settings=settings, db=db).spawners[""]


async def wait_for_pod(admin: httpx.AsyncClient, namespace: str, name: str, timeout: float = 60) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        response = await admin.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if response.status_code == 200:
            return response.json()
        await asyncio.sleep(0.2)
    raise TimeoutError(f"pod {namespace}/{name} not created within {timeout} s")


def test_alice_gets_her_desks_profile_in_her_desks_namespace_and_not_desk_bs(
    kube_api, kube_desks, tmp_path, monkeypatch
):
    # KubeSpawner loads the default kubeconfig once per process (kubernetes_asyncio read $KUBECONFIG
    # at import): here, the hub's own identity, its ServiceAccount token
    hub_kubeconfig = kube_api.kubeconfig_for(kube_desks.hub_token, tmp_path / "hub.kubeconfig")
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(hub_kubeconfig))
    kubespawner_clients.load_config.cache_clear()
    desk_a, desk_b = kube_desks.namespace("desk-a"), kube_desks.namespace("desk-b")

    async def scenario() -> tuple[dict, str, str, list[str]]:
        admin = httpx.AsyncClient(base_url=kube_api.server, verify=str(kube_api.ca_file), timeout=30)
        admin.headers["Authorization"] = f"Bearer {kube_api.admin_token}"
        async with admin:
            alice = spawner_of("alice", ["desk-a"], kube_desks.prefix)
            form = await alice.get_options_form()
            alice.user_options = {"profile": "desk-a-gpu"}
            starting = asyncio.ensure_future(alice.start())
            try:
                pod = await wait_for_pod(admin, desk_a, alice.pod_name)
            finally:
                await alice.stop(now=True)
                starting.cancel()
            gone = (await admin.get(f"/api/v1/namespaces/{desk_a}/pods/{alice.pod_name}")).status_code

            refused = spawner_of("alice", ["desk-a"], kube_desks.prefix)
            refused.user_options = {"profile": "desk-b-cpu"}
            with pytest.raises(ProfileRefused) as refusal:
                await refused.start()
            in_b = (await admin.get(f"/api/v1/namespaces/{desk_b}/pods", params={"labelSelector": "component"})).json()
        return pod, form, str(refusal.value), [gone, *(p["metadata"]["name"] for p in in_b["items"])]

    pod, form, refusal, [gone, *servers_in_b] = asyncio.run(scenario())

    assert pod["metadata"]["namespace"] == desk_a
    assert pod["metadata"]["labels"]["cellscale.io/tenant"] == "desk-a"
    assert pod["metadata"]["labels"]["hub.jupyter.org/username"] == "alice"
    assert pod["spec"]["serviceAccountName"] == "cellscale-servers"
    assert pod["spec"]["automountServiceAccountToken"] is False
    [container] = pod["spec"]["containers"]
    assert container["image"] == IMAGE_A
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "4294967296", "nvidia.com/gpu": "1"},  # KubeSpawner: 4G = 4 GiB in bytes
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert gone == 404  # stopping the server deleted its pod
    assert "desk-a-gpu" in form and "desk-a-cpu" in form and "desk-b" not in form
    assert refusal == (
        "server profile 'desk-b-cpu' belongs to desk desk-b, and alice is not in desk-b (their desks: desk-a); "
        "choose one of your desk's profiles: desk-a-cpu, desk-a-gpu"
    )
    assert servers_in_b == []
