"""The cost API: a desk member sees only their desks' cost and budgets, an admin every desk and
the fleet's reconciliation; /metrics is for admins and names no job; a series is bounded."""

from __future__ import annotations

import pytest

from cellscale.spec import Phase
from cellscale_hub.tenancy import Tenancy
from tests.controlplane.conftest import Plane, two_desks

PRICE = 2.0  # dollars per GPU-hour on the local flavor


def priced_and_budgeted() -> Tenancy:
    doc = two_desks({"local": 2}).model_dump(mode="json")
    doc["flavors"]["local"]["gpu_hour_usd"] = PRICE
    doc["tenants"]["desk-a"]["budget"] = {"usd": 100.0, "period": "week"}
    doc["tenants"]["desk-b"]["budget"] = {"gpu_hours": 10.0, "period": "day", "hard_stop": True}
    return Tenancy.model_validate(doc)


@pytest.fixture
def plane(tmp_path, store):
    """Both desks have run a job (alice on desk-a, bob on desk-b): the ledger has rows of both."""
    the_plane = Plane(tmp_path, store, tenancy=priced_and_budgeted())
    for user in ("alice", "bob"):
        response = the_plane.submit(user, source="import time; time.sleep(0.5)", resources={"gpus_per_node": 1})
        assert response.status_code == 201, response.text
        job = the_plane.run_until(response.json()["id"], {Phase.SUCCEEDED, Phase.FAILED})
        assert job["phase"] == "SUCCEEDED", job
    the_plane.controller.cycle()  # the ended attempts' last ledger rows
    return the_plane


def _cost(plane, user: str, **params) -> dict:
    response = plane.http.get("/api/cost", params={"days": 1} | params, headers=plane.as_(user))
    assert response.status_code == 200, response.text
    return response.json()


def test_a_desk_member_sees_only_their_desks_cost_and_no_fleet(plane):
    admin = _cost(plane, "admin")
    assert {d["tenant"] for d in admin["desks"]} == {"desk-a", "desk-b"}, admin
    assert all(d["gpu_hours"] > 0 for d in admin["desks"]), admin["desks"]

    alice = _cost(plane, "alice")
    assert [d["tenant"] for d in alice["desks"]] == ["desk-a"]
    assert {(u["tenant"], u["user"]) for u in alice["users"]} == {("desk-a", "alice")}
    assert {j["tenant"] for j in alice["top_idle_jobs"]} <= {"desk-a"}
    assert alice["fleet"] is None
    bob = _cost(plane, "bob")
    assert [d["tenant"] for d in bob["desks"]] == ["desk-b"] and bob["fleet"] is None
    # a user of no desk sees nothing of anyone's
    dave = _cost(plane, "dave")
    assert (dave["desks"], dave["users"], dave["top_idle_jobs"], dave["fleet"]) == ([], [], [], None)


def test_an_admin_gets_the_fleets_reconciliation(plane):
    fleet = _cost(plane, "admin")["fleet"]
    assert fleet is not None
    assert set(fleet) == {"fleet_usd", "desks_usd", "shared_idle_usd", "overhead_usd", "identity_error"}
    desks = _cost(plane, "admin")["desks"]
    assert fleet["desks_usd"] == pytest.approx(sum(d["total_usd"] for d in desks))
    assert fleet["desks_usd"] > 0


def test_metrics_are_for_admins_and_name_no_job(plane):
    for user, status in (("alice", 403), ("bob", 403), ("reader", 403), ("nobody", 401)):
        assert plane.http.get("/api/metrics", headers=plane.as_(user)).status_code == status, user
    response = plane.http.get("/api/metrics", headers=plane.as_("admin"))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert "desk-a" in text  # it does report the desks' cost
    assert "job_id" not in text
    jobs = plane.http.get("/api/jobs?scope=all", headers=plane.as_("admin")).json()["items"]
    assert jobs and not [j["id"] for j in jobs if j["id"] in text]


def test_a_series_is_at_most_400_steps(plane):
    too_many = plane.http.get("/api/cost/series", params={"days": 5, "step_s": 600}, headers=plane.as_("admin"))
    assert too_many.status_code == 400, too_many.text
    assert "at most 400 steps" in too_many.json()["detail"]
    ok = plane.http.get("/api/cost/series", params={"days": 2, "step_s": 3600}, headers=plane.as_("alice"))
    assert ok.status_code == 200, ok.text
    series = ok.json()
    assert series["step_s"] == 3600
    assert {p["tenant"] for p in series["points"]} == {"desk-a"}  # alice's desk only
    admin = plane.http.get("/api/cost/series", params={"days": 2, "step_s": 3600}, headers=plane.as_("admin")).json()
    assert {p["tenant"] for p in admin["points"]} == {"desk-a", "desk-b"}


def test_budgets_show_only_the_callers_desks(plane):
    def budgets(user: str) -> list[dict]:
        response = plane.http.get("/api/budgets", headers=plane.as_(user))
        assert response.status_code == 200, response.text
        return response.json()

    assert [b["tenant"] for b in budgets("admin")] == ["desk-a", "desk-b"]
    alice = budgets("alice")
    assert [b["tenant"] for b in alice] == ["desk-a"]
    assert (alice[0]["usd"], alice[0]["period"], alice[0]["hard_stop"]) == (100.0, "week", False)
    assert alice[0]["spent_usd"] > 0 and not alice[0]["holding"]
    bob = budgets("bob")
    assert [b["tenant"] for b in bob] == ["desk-b"]
    assert (bob[0]["gpu_hours"], bob[0]["usd"], bob[0]["hard_stop"]) == (10.0, None, True)
    assert budgets("dave") == []


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"until": "0001-01-01T00:00:00Z"}, "the window cannot end at 0001-01-01T00:00:00+00:00: give a later until"),
        (
            {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
            "the window must start before it ends and last at most 400 days",
        ),
    ],
)
def test_an_impossible_window_is_refused_with_what_to_change(tmp_path, store, params, words):
    plane = Plane(tmp_path, store, tenancy=priced_and_budgeted())
    response = plane.http.get("/api/cost", params=params, headers=plane.as_("alice"))
    assert (response.status_code, response.json()["detail"]) == (400, words)
