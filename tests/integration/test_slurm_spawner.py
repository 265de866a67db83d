"""User servers on Slurm: batchspawner's SlurmSpawner starts a researcher's JupyterLab as a
Slurm job under their own Unix user, on the real dev cluster, reachable through the hub."""

import subprocess

import httpx
import pytest

from tests.integration.conftest import running_hub, start_server

pytestmark = pytest.mark.integration


def test_a_users_server_is_a_slurm_job_reachable_through_the_hub(tmp_path_factory, slurm_cluster):
    env = {"CELLSCALE_TEST_HUB_BASE": "jupyterhub_slurm_config.py", **slurm_cluster.env}
    with running_hub(tmp_path_factory.mktemp("slurmhub"), env) as hub:
        start_server(hub, "alice", timeout=240)
        jobs = subprocess.run(
            ["squeue", "-h", "-u", "alice", "-n", "jupyterhub-alice", "-o", "%i %T %u"],
            env=slurm_cluster.client_env(),
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        assert jobs[1:] == ["RUNNING", "alice"], jobs
        token = hub.admin.post("users/alice/tokens", json={"scopes": ["access:servers!user=alice"]}).json()["token"]
        status = httpx.get(f"{hub.url}/user/alice/api/status", headers={"Authorization": f"token {token}"}, timeout=30)
        assert status.status_code == 200, status.text
        assert hub.admin.delete("users/alice/server").status_code in (202, 204)
