"""CPU jobs on the local backend: a desk at its CPU quota waits with the reason and runs when
cores free; the machine's cores bound CPU work; refusals name the flag and the numbers."""

from __future__ import annotations

from cellscale.spec import Phase
from cellscale_hub.tenancy import Tenancy
from tests.controlplane.conftest import Plane

CPU_DESKS = Tenancy.model_validate(
    {
        "flavors": {"local": {"backend": "local"}},
        "cluster_queues": {
            "desk-a": {"quotas": {"local": {"nominal": 2, "cpu": {"nominal": 3}, "memory": {"nominal": "8G"}}}},
            "desk-b": {"quotas": {"local": {"nominal": 2, "cpu": {"nominal": 3}}}},
        },
        "tenants": {
            "desk-a": {"queues": {"default": {"cluster_queue": "desk-a"}}},
            "desk-b": {"queues": {"default": {"cluster_queue": "desk-b"}}},
        },
    }
)
SLEEPER = "import time\ntime.sleep(60)"


def job(plane, job_id):
    return plane.http.get(f"/api/jobs/{job_id}", headers=plane.as_("alice")).json()


def test_a_desk_at_its_cpu_quota_waits_and_runs_when_cores_free(tmp_path, store):
    plane = Plane(tmp_path, store, tenancy=CPU_DESKS)
    plane.driver.cpus = 8
    big = plane.submit(source=SLEEPER, launcher="plain", resources={"cpus_per_task": 2, "memory_mb_per_node": 2048})
    plane.run_until(big.json()["id"], {Phase.RUNNING})
    backtest = plane.submit(source="print('done')", launcher="plain", resources={"cpus_per_task": 2}).json()
    plane.controller.cycle()
    waiting = job(plane, backtest["id"])
    assert waiting["phase"] == "PENDING"
    assert waiting["pending"]["resource"] == "cpu" and (
        waiting["pending"]["needs"],
        waiting["pending"]["available"],
    ) == (
        2,
        1,
    )
    assert waiting["reason"] == (
        f"waiting for 2 CPUs, 1 free to it: your job {big.json()['name']} holds 2 of the desk's CPUs. Details: "
        "queue desk-a is at its local cpu quota (3 nominal, no cohort to borrow from); held by "
        f"{big.json()['id']} (desk-a, 2 CPUs, same queue)"
    )
    quota = plane.http.get("/api/quota", headers=plane.as_("alice")).json()[0]
    assert (quota["flavors"][0]["cpus_used"], quota["flavors"][0]["cpu_nominal"]) == (2, 3)
    assert (quota["flavors"][0]["memory_mb_used"], quota["flavors"][0]["memory_mb_nominal"]) == (2048, 8192)
    assert quota["pending_cpus"] == 2
    plane.http.post(f"/api/jobs/{big.json()['id']}/cancel", headers=plane.as_("alice"))
    assert plane.run_until(backtest["id"], {Phase.SUCCEEDED})["phase"] == "SUCCEEDED"


def test_the_machines_cores_bound_cpu_work(tmp_path, store):
    plane = Plane(tmp_path, store, tenancy=CPU_DESKS)
    plane.driver.cpus = 3  # desk-a and desk-b may each have 3 cores; the machine has 3 in all
    a = plane.submit(source=SLEEPER, launcher="plain", resources={"cpus_per_task": 2}).json()
    plane.run_until(a["id"], {Phase.RUNNING})
    b = plane.submit(user="bob", source="pass", launcher="plain", resources={"cpus_per_task": 2}).json()
    plane.controller.cycle()
    reason = plane.http.get(f"/api/jobs/{b['id']}", headers=plane.as_("bob")).json()["pending"]
    assert reason["code"] == "CapacityFull" and reason["available"] == 1
    assert "all 3 CPUs (local) are in use" in reason["message"]
    plane.http.post(f"/api/jobs/{a['id']}/cancel", headers=plane.as_("alice"))
    plane.run_until(a["id"], {Phase.CANCELLED})
    plane.run_until(b["id"], {Phase.SUCCEEDED})


def test_impossible_cpu_and_memory_asks_are_refused_with_the_numbers(tmp_path, store):
    plane = Plane(tmp_path, store, tenancy=CPU_DESKS)
    plane.driver.cpus, plane.driver.memory_mb = 8, 16384
    too_wide = plane.submit(launcher="plain", resources={"cpus_per_task": 12})
    assert too_wide.status_code == 422
    assert too_wide.json()["detail"] == (
        "12 CPUs per node (1 task(s) x --cpus 12) is more than any node of backend 'local' has (8); "
        "ask for at most --cpus 8"
    )
    over_quota = plane.submit(launcher="plain", resources={"cpus_per_task": 4})
    assert over_quota.status_code == 422 and over_quota.json()["detail"] == (
        "4 CPUs can never be admitted: queue desk-a can get at most 3 CPUs (local) (nominal 3 + 0 borrowable from "
        "its cohort); ask for at most --cpus 3, or ask an admin to raise the quota"
    )
    too_much = plane.submit(launcher="plain", resources={"memory_mb_per_node": "9G"})
    assert too_much.status_code == 422 and too_much.json()["detail"] == (
        "--mem 9216M on 1 node(s) can never be admitted: queue desk-a can get at most 8 GiB of memory (local) "
        "(nominal 8192 + 0 borrowable from its cohort); ask for at most --mem 8G, or ask an admin to raise the quota"
    )
    node = plane.submit(launcher="plain", resources={"memory_mb_per_node": "32G"})
    assert node.status_code == 422 and "--mem 32768M per node is more than any node" in node.json()["detail"]


def test_a_job_runs_as_many_threads_as_cores_it_asked_for(tmp_path, store):
    plane = Plane(tmp_path, store, tenancy=CPU_DESKS)
    plane.driver.cpus = 8
    cell = "import os\nprint('threads', os.environ['OMP_NUM_THREADS'])"
    done = plane.run_until(
        plane.submit(source=cell, launcher="plain", resources={"cpus_per_task": 3}).json()["id"], {Phase.SUCCEEDED}
    )
    log = plane.http.get(f"/api/jobs/{done['id']}/logs", headers=plane.as_("alice")).json()["text"]
    assert "[rank 0] threads 3" in log


def test_an_admin_cannot_promise_more_cores_than_the_backend_has(tmp_path, store):
    plane = Plane(tmp_path, store, tenancy=CPU_DESKS)
    plane.driver.cpus = 8
    url = "/api/admin/cluster-queues/desk-a/quotas/local"
    refused = plane.http.put(url, headers=plane.as_("admin"), json={"nominal": 2, "cpu": {"nominal": 6}})
    assert refused.status_code == 422
    assert "would sum to 9 CPUs, more than its backend local has (8)" in refused.json()["detail"]
    kept = plane.http.put(url, headers=plane.as_("admin"), json={"nominal": 2, "cpu": {"nominal": 5}})
    assert kept.status_code == 200, kept.text
    view = kept.json()
    assert view["tenancy"]["cluster_queues"]["desk-a"]["quotas"]["local"]["cpu"]["nominal"] == 5
    flavor = next(f for f in view["flavors"] if f["flavor"] == "local")
    assert (flavor["capacity_cpus"], flavor["cpu_nominal_total"]) == (8, 8)


def test_a_cpu_backtest_cell_runs_on_the_local_backend(plane):
    """`%%cluster --cpus 8 --mem 4G` with no GPUs: admitted against the machine's cores."""
    plane.driver.cpus, plane.driver.memory_mb = 8, 8192
    cell = "import os\nprint('cores', os.environ['OMP_NUM_THREADS'], 'gpus', repr(os.environ['CUDA_VISIBLE_DEVICES']))"
    job = plane.submit(source=cell, launcher="plain", resources={"cpus_per_task": 8, "memory_mb_per_node": "4G"}).json()
    assert (job["spec"]["resources"]["cpus_per_task"], job["spec"]["resources"]["memory_mb_per_node"]) == (8, 4096)
    done = plane.run_until(job["id"], {Phase.SUCCEEDED})
    log = plane.http.get(f"/api/jobs/{done['id']}/logs", headers=plane.as_("alice")).json()["text"]
    assert "[rank 0] cores 8 gpus ''" in log
