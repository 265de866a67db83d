"""Flavors shown only where they exist: a desk's quota (GET /api/quota, the panel's quota view)
and the admin page's quota table list the flavors of the backends this control plane runs, not
a tenancy's Slurm quota where no Slurm backend is configured; the admin's Flavors list says
which backends are missing, and the GPU-hours held on each flavor."""

from __future__ import annotations

from datetime import timedelta

from cellscale_hub.store.models import LedgerHour, utcnow
from tests.controlplane.conftest import Plane, two_desks

LOCAL_AND_SLURM = two_desks({"local": 2, "slurm": 16})


def test_a_quota_lists_only_the_flavors_of_configured_backends(tmp_path, store):
    plane = Plane(tmp_path, store, tenancy=LOCAL_AND_SLURM)  # the local backend alone
    quota = plane.http.get("/api/quota", headers=plane.as_("alice")).json()
    assert [(q["cluster_queue"], [f["flavor"] for f in q["flavors"]]) for q in quota] == [("desk-a", ["local"])]
    view = plane.http.get("/api/admin/tenancy", headers=plane.as_("admin")).json()
    assert {q["cluster_queue"]: [f["flavor"] for f in q["flavors"]] for q in view["usage"]} == {
        "desk-a": ["local"],
        "desk-b": ["local"],
    }
    flavors = {f["flavor"]: f for f in view["flavors"]}
    assert (flavors["slurm"]["capacity_gpus"], flavors["slurm"]["nominal_total"]) == (0, 32)  # "backend not configured"
    assert "slurm" in view["tenancy"]["cluster_queues"]["desk-a"]["quotas"]  # still in the document, editable


def test_the_admin_view_has_the_gpu_hours_of_each_flavor(tmp_path, store):
    plane = Plane(tmp_path, store, tenancy=LOCAL_AND_SLURM)
    hour = utcnow().replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    with plane.store.session() as session:
        for tenant, owner, gpu_s in (
            ("desk-a", "alice", 7200.0),
            ("desk-a", "carol", 1800.0),
            ("desk-b", "bob", 1800.0),
        ):
            session.add(
                LedgerHour(tenant=tenant, hour=hour, owner=owner, backend="local", flavor="local", gpu_s=gpu_s, usd=0.0)
            )
    view = plane.http.get("/api/admin/tenancy", headers=plane.as_("admin")).json()
    assert {f["flavor"]: f["gpu_hours"] for f in view["flavors"]} == {"local": 3.0, "slurm": 0.0}
