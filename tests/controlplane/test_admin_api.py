"""The admin API: hub admins only; quota and weight edits validated as a whole and audited."""

from __future__ import annotations

import pytest

from cellscale_hub.tenancy import Tenancy
from tests.controlplane.conftest import Plane

CPU_POOL = Tenancy.model_validate(
    {
        "flavors": {"local": {"backend": "local"}, "cpus": {"backend": "local", "cpu_only": True}},
        "cluster_queues": {
            "desk-a": {
                "quotas": {
                    "local": {"nominal": 2},
                    "cpus": {"nominal": 0, "cpu": {"nominal": 4, "lending_limit": 2}, "memory": {"nominal": "8G"}},
                }
            }
        },
        "tenants": {"desk-a": {"queues": {"default": {"cluster_queue": "desk-a"}}}},
    }
)


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("get", "/api/admin/tenancy", None),
        ("get", "/api/admin/audit", None),
        ("put", "/api/admin/cluster-queues/desk-a/quotas/local", {"nominal": 4}),
        ("put", "/api/admin/cluster-queues/desk-a/weight", {"weight": 2}),
        ("put", "/api/admin/cohorts/firm/weight", {"weight": 2}),
        ("put", "/api/admin/cohorts/firm/short-work-share", {"short_work_share": 0.5}),
    ],
)
def test_only_admins_read_or_change_quotas(plane, method, path, body):
    for user, status in (("alice", 403), ("bob", 403), ("nobody", 401)):
        response = getattr(plane.http, method)(path, headers=plane.as_(user), **({"json": body} if body else {}))
        assert response.status_code == status, (user, response.text)
    assert (
        plane.http.get("/api/admin/tenancy", headers=plane.as_("admin")).json()["tenancy"]["cluster_queues"]["desk-a"][
            "quotas"
        ]["local"]["nominal"]
        == 2
    )  # nothing changed


def test_quota_change_is_applied_and_audited(plane):
    lowered = plane.http.put(
        "/api/admin/cluster-queues/desk-b/quotas/local", headers=plane.as_("admin"), json={"nominal": 1}
    )
    assert lowered.status_code == 200, lowered.text
    response = plane.http.put(
        "/api/admin/cluster-queues/desk-a/quotas/local",
        headers=plane.as_("admin"),
        json={"nominal": 3, "borrowing_limit": 0, "lending_limit": 1},
    )
    assert response.status_code == 200, response.text
    view = response.json()
    assert view["tenancy"]["cluster_queues"]["desk-a"]["quotas"]["local"] == {
        "nominal": 3,
        "borrowing_limit": 0,
        "lending_limit": 1,
    }
    assert view["flavors"] == [
        {
            "flavor": "local",
            "backend": "local",
            "cpu_only": False,
            "capacity_gpus": 4,
            "nominal_total": 4,
            "capacity_cpus": plane.driver.cpus,
            "capacity_memory_mb": plane.driver.memory_mb,
            "cpu_nominal_total": None,
            "memory_mb_nominal_total": None,
            "gpu_hours": 0.0,
        }
    ]
    latest = plane.http.get("/api/admin/audit", headers=plane.as_("admin")).json()[0]
    assert latest["actor"] == "admin" and latest["action"] == "set-quota"
    assert latest["target"] == "cluster_queues/desk-a/quotas/local"
    assert latest["before"] == {"nominal": 2, "borrowing_limit": None, "lending_limit": None}
    assert latest["after"] == {"nominal": 3, "borrowing_limit": 0, "lending_limit": 1}
    # the new quota is in force for admission: desk-a may no longer borrow
    refused = plane.submit(resources={"gpus_per_node": 4})
    assert refused.status_code == 422 and "at most 3" in refused.json()["detail"]


@pytest.mark.parametrize(
    "path, body, words",
    [
        (
            "/api/admin/cluster-queues/desk-a/quotas/local",
            {"nominal": 2, "lending_limit": 3},
            "lending_limit 3 exceeds nominal 2",
        ),
        ("/api/admin/cluster-queues/desk-a/quotas/local", {"nominal": 3.5}, "nominal"),
        ("/api/admin/cluster-queues/desk-a/quotas/local", {"nominal": -1}, "greater than or equal to 0"),
        ("/api/admin/cluster-queues/desk-a/quotas/local", {"nominal": 3, "typo": 1}, "typo"),
        (
            "/api/admin/cluster-queues/desk-a/quotas/local",
            {"nominal": 5},
            "would sum to 7 GPUs, more than its backend local has (4)",
        ),
        ("/api/admin/cluster-queues/desk-z/quotas/local", {"nominal": 1}, "no cluster queue 'desk-z'"),
        ("/api/admin/cluster-queues/desk-a/quotas/h100", {"nominal": 1}, "no flavor 'h100'"),
        ("/api/admin/cluster-queues/desk-a/weight", {"weight": 0}, "greater than 0"),
        ("/api/admin/cohorts/firm/short-work-share", {"short_work_share": 1.5}, "less than or equal to 1"),
        ("/api/admin/cohorts/nope/short-work-share", {"short_work_share": 0.2}, "no cohort 'nope'"),
    ],
)
def test_invalid_changes_are_refused_and_change_nothing(plane, path, body, words):
    before = plane.http.get("/api/admin/audit", headers=plane.as_("admin")).json()
    response = plane.http.put(path, headers=plane.as_("admin"), json=body)
    assert response.status_code in (404, 422), response.text
    assert words in str(response.json()["detail"])
    assert plane.http.get("/api/admin/audit", headers=plane.as_("admin")).json() == before


def test_weights_change_and_are_audited(plane):
    plane.http.put("/api/admin/cohorts/firm/weight", headers=plane.as_("admin"), json={"weight": 3})
    plane.http.put("/api/admin/cluster-queues/desk-b/weight", headers=plane.as_("admin"), json={"weight": 0.5})
    doc = plane.http.get("/api/admin/tenancy", headers=plane.as_("admin")).json()["tenancy"]
    assert doc["cohorts"]["firm"]["weight"] == 3 and doc["cluster_queues"]["desk-b"]["weight"] == 0.5
    audit = plane.http.get("/api/admin/audit", headers=plane.as_("admin")).json()
    assert [(e["target"], e["before"], e["after"]) for e in audit[:2]] == [
        ("cluster_queues/desk-b/weight", {"value": 1.0}, {"value": 0.5}),
        ("cohorts/firm/weight", {"value": 1.0}, {"value": 3.0}),
    ]


def test_the_short_work_share_is_set_per_tree_and_shows_what_it_lends(plane):
    view = plane.http.get("/api/admin/tenancy", headers=plane.as_("admin")).json()
    assert [(r["share"], r["gpus"]) for r in view["short_work"]] == [(0.1, 0)]  # 10% of 4 GPUs: no whole GPU
    response = plane.http.put(
        "/api/admin/cohorts/firm/short-work-share", headers=plane.as_("admin"), json={"short_work_share": 0.5}
    )
    assert response.status_code == 200, response.text
    assert response.json()["short_work"] == [
        {"cohort": "firm", "flavor": "local", "share": 0.5, "gpus": 2, "lent": 0, "jobs": [], "lender_wait_max_s": 0.0}
    ]
    audit = plane.http.get("/api/admin/audit", headers=plane.as_("admin")).json()
    assert (audit[0]["target"], audit[0]["before"], audit[0]["after"]) == (
        "cohorts/firm/short_work_share",
        {"value": 0.1},
        {"value": 0.5},
    )


def test_admin_page_needs_a_session_and_an_admin(plane):
    assert plane.http.get("/admin", follow_redirects=False).headers["location"] == "/login?next=/admin"
    assert plane.http.get("/admin", headers=plane.as_("alice")).status_code == 403
    page = plane.http.get("/admin", headers=plane.as_("admin"))
    assert page.status_code == 200 and "cellscale admin" in page.text
    assert "default-src 'self'" in page.headers["content-security-policy"]


def test_nodes_blamed_for_faults_are_flagged_to_admins(plane):
    from datetime import timedelta

    from cellscale.spec import JobSpec
    from cellscale_hub.store.models import Attempt, Job, utcnow

    with plane.store.session() as session:
        for i, nodes in enumerate((["node3"], ["node3", "node1"], ["node2"])):
            job = Job(
                id=f"cs-00000000000{i}",
                idempotency_key=str(i),
                owner="alice",
                tenant="desk-a",
                queue="default",
                backend="local",
                name="cell",
                spec=JobSpec(source="pass"),
                phase="RUNNING",
            )
            job.attempts.append(
                Attempt(
                    number=1,
                    backend="local",
                    state="FAILED",
                    fault="infrastructure",
                    failed_nodes=nodes,
                    ended_at=utcnow() - timedelta(hours=i),
                )
            )
            session.add(job)
    assert plane.http.get("/api/admin/nodes", headers=plane.as_("alice")).status_code == 403
    nodes = plane.http.get("/api/admin/nodes", headers=plane.as_("admin")).json()
    assert [(n["node"], n["faults"], n["flagged"]) for n in nodes] == [
        ("node3", 2, True),
        ("node1", 1, False),
        ("node2", 1, False),
    ]
    assert nodes[0]["jobs"] == ["cs-000000000000", "cs-000000000001"]


def test_cpu_pools_and_cpu_and_memory_quotas_are_shown_and_edited_whole(tmp_path, store):
    plane = Plane(tmp_path, store, tenancy=CPU_POOL)
    plane.driver.cpus, plane.driver.memory_mb = 16, 65536
    view = plane.http.get("/api/admin/tenancy", headers=plane.as_("admin")).json()
    flavors = {f["flavor"]: f for f in view["flavors"]}
    assert (flavors["cpus"]["cpu_only"], flavors["cpus"]["capacity_cpus"], flavors["cpus"]["capacity_memory_mb"]) == (
        True,
        16,
        65536,
    )
    assert (flavors["cpus"]["cpu_nominal_total"], flavors["cpus"]["memory_mb_nominal_total"]) == (4, 8192)
    assert (flavors["local"]["cpu_only"], flavors["local"]["cpu_nominal_total"]) == (False, None)
    # the page sends the whole quota, memory as written ("16G"): every part is stored
    body = {
        "nominal": 0,
        "borrowing_limit": None,
        "lending_limit": None,
        "cpu": {"nominal": 6, "borrowing_limit": 2, "lending_limit": 2},
        "memory": {"nominal": "16G", "borrowing_limit": None, "lending_limit": None},
    }
    response = plane.http.put("/api/admin/cluster-queues/desk-a/quotas/cpus", headers=plane.as_("admin"), json=body)
    assert response.status_code == 200, response.text
    stored = response.json()["tenancy"]["cluster_queues"]["desk-a"]["quotas"]["cpus"]
    assert stored["cpu"] == {"nominal": 6, "borrowing_limit": 2, "lending_limit": 2}
    assert stored["memory"] == {"nominal": 16384, "borrowing_limit": None, "lending_limit": None}
    usage = next(f for f in response.json()["usage"][0]["flavors"] if f["flavor"] == "cpus")
    assert (usage["cpu_nominal"], usage["memory_mb_nominal"]) == (6, 16384)
