"""Sites through the control plane (real store, real local supervisors as each site's
backend): placement at admission with its reasons, a site whose scheduler stops answering,
a cloud pool's stockout and spot reclaim. The same paths on real Slurm daemons:
tests/integration/test_sites_e2e.py."""

from __future__ import annotations

from cellscale.runtime.jobdir import JobDir
from cellscale.spec import Phase
from cellscale.vocabulary import AttemptState, Fault
from cellscale_hub.drivers import BackendUnreachable, Observation
from cellscale_hub.drivers.capabilities import WatchesNodes
from cellscale_hub.drivers.local import LocalDriver
from cellscale_hub.tenancy import Tenancy
from tests.controlplane.conftest import Plane

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}


def site_tenancy(burst: str = "allow", budget: float | None = None) -> Tenancy:
    desk = {"queues": {"default": {"cluster_queue": "desk-a"}}, "burst": burst}
    if budget is not None:
        desk["budget"] = {"usd": budget, "period": "week", "covers": "cloud"}
    return Tenancy.model_validate(
        {
            "sites": {
                "dca": {"gpu_hour_usd": 1.0, "egress_usd_per_gb": 0.09},
                "dcb": {"gpu_hour_usd": 1.0, "egress_usd_per_gb": 0.09},
                "burst": {"kind": "cloud", "gpu_hour_usd": 2.5, "boot_s": 60, "idle_tail_s": 30},
            },
            "flavors": {name: {"backend": name, "site": name} for name in ("dca", "dcb", "burst")},
            "datasets": {"bars": {"site": "dca", "size_gb": 40}},
            "cohorts": {"firm": {}},
            "cluster_queues": {
                desk: {
                    "cohort": "firm",
                    "quotas": {"dca": {"nominal": 2}, "dcb": {"nominal": 2}, "burst": {"nominal": 2}},
                }
                for desk in ("desk-a", "desk-b")
            },
            "tenants": {
                "desk-a": desk,
                "desk-b": {"queues": {"default": {"cluster_queue": "desk-b"}}},
            },
        }
    )


class Site(LocalDriver, WatchesNodes):
    """A local backend that can be made to stop answering, to have no capacity, or to
    announce that its nodes go away."""

    lost = False
    stockout = False
    notices: dict[str, str] = {}

    def poll(self, refs):
        if self.lost:
            raise BackendUnreachable(f"{self.name}: Unable to contact slurm controller (connect failure)")
        observed = super().poll(refs)
        if self.stockout:
            return {
                key: Observation(AttemptState.LOST, fault=Fault.CAPACITY, reason="stockout: no capacity for node1")
                for key in observed
            }
        return {key: _on_node(obs, self.name) for key, obs in observed.items()}

    def submit(self, ref):
        if self.lost or self.stockout:
            return f"{self.name}-queued-{ref.job_id}"  # accepted, never started (the site is cut off)
        return super().submit(ref)

    def node_notices(self):
        return dict(self.notices)


def _on_node(obs: Observation, name: str) -> Observation:
    from dataclasses import replace

    return replace(obs, nodes=(f"{name}-node1",)) if obs.state in (AttemptState.RUNNING, AttemptState.STARTING) else obs


def sites_plane(tmp_path, store, **tenancy) -> Plane:
    drivers = {name: Site(name=name, gpus=4, submit_as=[]) for name in ("dca", "dcb", "burst")}
    return Plane(tmp_path, store, drivers=drivers, tenancy=site_tenancy(**tenancy))


def events(plane, job_id):
    return plane.http.get(f"/api/jobs/{job_id}/events", headers=plane.as_("admin")).json()


def test_a_job_goes_where_its_data_is_and_says_why(tmp_path, store):
    plane = sites_plane(tmp_path, store)
    job = plane.submit(resources={"gpus_per_node": 1}, source="print('ran')", datasets=["bars"]).json()
    assert plane.run_until(job["id"], TERMINAL)["phase"] == "SUCCEEDED"
    final = plane.http.get(f"/api/jobs/{job['id']}", headers=plane.as_("alice")).json()
    assert final["backend"] == "dca"
    admitted = next(e for e in events(plane, job["id"]) if e["reason"] == "QuotaReserved")
    assert "placed at dca: dca starts now; dcb starts now, moving 40 GB (≈$3.60 egress)" in admitted["message"]


def test_burst_only_when_allowed(tmp_path, store):
    plane = sites_plane(tmp_path, store, burst="never")
    job = plane.submit(resources={"gpus_per_node": 1}, source="print('x')", site="burst", burst="never")
    assert job.status_code == 422
    assert "add --burst allow" in job.json()["detail"]


def test_a_lost_site_keeps_running_work_unknown_and_moves_what_never_started(tmp_path, store):
    plane = sites_plane(tmp_path, store)
    dca, dcb = plane.drivers["dca"], plane.drivers["dcb"]
    plane.tune(site_lost_timeout_s=0.0)
    dca.lost = True
    job = plane.submit(
        resources={"gpus_per_node": 1}, source="print('moved')", site="auto"
    ).json()  # dca is first: it goes there
    plane.controller.cycle()  # admitted to dca, submitted (accepted, never started)
    attempt1 = plane.http.get(f"/api/jobs/{job['id']}", headers=plane.as_("alice")).json()
    assert attempt1["backend"] == "dca"
    cancelled = []
    dca.cancel = lambda ref: cancelled.append(ref.key)
    final = plane.run_until(job["id"], TERMINAL)
    assert final["phase"] == "SUCCEEDED" and final["backend"] == "dcb"
    moved = [e for e in events(plane, job["id"]) if "moved: dca has not answered" in (e["message"] or "")]
    assert moved, events(plane, job["id"])
    assert JobDir(plane.jobs_root / job["id"]).pass_gate(1, "started") == "fenced"  # it can never start at dca
    dca.lost = False
    plane.controller.cycle()
    assert cancelled == [(job["id"], 1)]  # and is cancelled there once dca answers
    assert dcb.name == "dcb"


def test_a_stockout_closes_the_pool_and_the_job_is_placed_elsewhere(tmp_path, store):
    plane = sites_plane(tmp_path, store)
    burst = plane.drivers["burst"]
    burst.stockout = True
    job = plane.submit(resources={"gpus_per_node": 1}, source="print('after stockout')").json()
    for name in ("dca", "dcb"):  # the datacenters are full for hours (no known end)
        plane.drivers[name].gpus = 0
    plane.controller.cycle()
    plane.controller.cycle()
    for name in ("dca", "dcb"):
        plane.drivers[name].gpus = 4
    final = plane.run_until(job["id"], TERMINAL)
    assert final["phase"] == "SUCCEEDED" and final["backend"] in ("dca", "dcb")
    assert plane.controller.sites.unavailable("burst").startswith("it had no capacity")


def test_a_spot_reclaim_notice_preempts_with_the_checkpoint_warning(tmp_path, store):
    plane = sites_plane(tmp_path, store)
    plane.tune(preemption_grace_s=1.0)
    dca = plane.drivers["dca"]
    job = plane.submit(resources={"gpus_per_node": 1}, source="import time\ntime.sleep(600)").json()
    plane.run_until(job["id"], {Phase.RUNNING})
    dca.notices = {"dca-node1": "spot-reclaim: terminating in 30 s"}
    plane.controller.cycle()
    preempting = [e for e in events(plane, job["id"]) if e["reason"] == "Preempting"]
    assert preempting and "dca-node1 is being reclaimed (spot-reclaim: terminating in 30 s)" in preempting[0]["message"]
    dca.notices = {}
    assert plane.controller.sites.unavailable("dca").startswith("it reclaimed dca-node1")
    plane.run_until(job["id"], {Phase.PENDING, Phase.ADMITTED, Phase.STARTING})  # preempted, requeued
    requeued = plane.run_until(job["id"], {Phase.RUNNING})
    assert requeued["backend"] != "dca"  # the reclaiming pool gets nothing new for a while
    plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("alice"))
    plane.run_until(job["id"], TERMINAL)


def test_an_admin_sets_a_desks_cloud_policy_and_budget_audited(tmp_path, store):
    plane = sites_plane(tmp_path, store, burst="never")
    body = {"burst": "allow", "budget": {"usd": 250, "period": "week"}}
    assert plane.http.put("/api/admin/tenants/desk-a/cloud", json=body, headers=plane.as_("alice")).status_code == 403
    view = plane.http.put("/api/admin/tenants/desk-a/cloud", json=body, headers=plane.as_("admin")).json()
    assert view["tenancy"]["tenants"]["desk-a"]["budget"] == {"usd": 250.0, "period": "week"}
    assert view["tenancy"]["tenants"]["desk-a"]["burst"] == "allow"
    audit = plane.http.get("/api/admin/audit", headers=plane.as_("admin")).json()[0]
    assert (audit["action"], audit["target"]) == ("set-cloud", "tenants/desk-a/cloud")
    assert audit["before"] == {"burst": "never", "budget": None}
    missing = plane.http.put("/api/admin/tenants/nobody/cloud", json=body, headers=plane.as_("admin"))
    assert missing.status_code == 404


def test_a_budget_spent_keeps_the_desk_off_the_cloud_with_the_numbers(tmp_path, store):
    plane = sites_plane(tmp_path, store, budget=1.0)
    job = plane.submit(resources={"gpus_per_node": 1}, source="print('x')", site="burst").json()
    plane.controller.cycle()
    view = plane.http.get(f"/api/jobs/{job['id']}", headers=plane.as_("alice")).json()
    assert view["phase"] == "PENDING"
    pending = view["pending"]
    assert (
        "burst ≈1 min for ≈$2.56 (256% of desk-a's weekly budget): not allowed, would cost ≈$2.56 > $1.00 left"
        in (pending["message"])
    )
    (offer,) = pending["sites"]
    assert offer["site"] == "burst" and offer["cloud"] and offer["excluded"].startswith("would cost")
    plane.http.post(f"/api/jobs/{job['id']}/cancel", headers=plane.as_("alice"))
