"""kube.tenancy.render_tenancy: cellscale's tenancy as Kueue and RBAC objects for one backend
(pure; applying them to a real apiserver is tests/integration/test_kube_tenancy.py), the
KubeSpawner profiles' configuration checks, and dev/kube.py's CRD trimming for 1.20 and build cache."""

from __future__ import annotations

import pytest

from cellscale_hub.dev.kube import for_kube_1_20
from cellscale_hub.drivers.kubernetes.tenancy import HubIdentity, levels_of, main, object_path, render_tenancy
from cellscale_hub.tenancy import Tenancy

TENANCY_YAML = """
flavors:
  a100: {backend: k8s}
  h100: {backend: k8s}
  slurm: {backend: slurm}
cohorts:
  firm: {}
  trading: {parent: firm, weight: 1.5}
cluster_queues:
  desk-a:
    cohort: trading
    quotas:
      a100: {nominal: 8, borrowing_limit: 4, lending_limit: 2}
      h100: {nominal: 2, cpu: {nominal: 16}}
  solo:
    quotas:
      a100: {nominal: 4, borrowing_limit: 1}
  slurm-only:
    quotas:
      slurm: {nominal: 4}
tenants:
  desk-a: {queues: {default: {cluster_queue: desk-a}, solo: {cluster_queue: solo}}}
  desk-c: {queues: {default: {cluster_queue: slurm-only}}}
priority_classes: {normal: 0, high: 100}
"""
TENANCY = Tenancy.from_yaml(TENANCY_YAML)


def by_kind(objects: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for obj in objects:
        kinds.setdefault(obj["kind"], []).append(obj)
    return kinds


def test_one_backends_queues_flavors_cohorts_and_desks_are_mirrored_cluster_wide_ones_first():
    objects = render_tenancy(TENANCY, "k8s", "cs-")
    kinds = [obj["kind"] for obj in objects]
    assert kinds == [
        "ResourceFlavor", "ResourceFlavor", "Cohort", "Cohort", "ClusterQueue", "ClusterQueue",
        "WorkloadPriorityClass", "WorkloadPriorityClass", "Namespace", "ServiceAccount",
        "Namespace", "ServiceAccount", "ServiceAccount", "LocalQueue", "LocalQueue", "ResourceQuota", "Role",
        "RoleBinding",
    ]  # fmt: skip
    names = [(obj["kind"], obj["metadata"].get("namespace"), obj["metadata"]["name"]) for obj in objects]
    assert ("Namespace", None, "cs-desk-a") in names and ("Namespace", None, "cs-desk-c") not in names
    assert ("ClusterQueue", None, "cs-slurm-only") not in names  # no flavor of this backend
    assert ("LocalQueue", "cs-desk-a", "solo") in names
    assert {o["metadata"]["name"] for o in by_kind(objects)["WorkloadPriorityClass"]} == {"normal", "high"}
    assert "ClusterRole" not in kinds and "ClusterRoleBinding" not in kinds


def test_quotas_borrowing_only_in_a_cohort_and_a_namespace_selector_of_the_desks_using_the_queue():
    queues = {
        cq["metadata"]["name"]: cq["spec"] for cq in by_kind(render_tenancy(TENANCY, "k8s", "cs-"))["ClusterQueue"]
    }
    desk_a = queues["cs-desk-a"]
    assert desk_a["cohortName"] == "cs-trading"
    assert desk_a["namespaceSelector"] == {
        "matchExpressions": [{"key": "cellscale.io/tenant", "operator": "In", "values": ["desk-a"]}]
    }
    assert desk_a["resourceGroups"][0]["flavors"] == [
        {
            "name": "cs-a100",
            "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": "8", "borrowingLimit": "4", "lendingLimit": "2"},
                {"name": "cpu", "nominalQuota": "1000000000"},
                {"name": "memory", "nominalQuota": "1Ei"},
            ],
        },
        {
            "name": "cs-h100",
            "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": "2"},
                {"name": "cpu", "nominalQuota": "16"},
                {"name": "memory", "nominalQuota": "1Ei"},
            ],
        },
    ]
    assert "cohortName" not in queues["cs-solo"]  # Kueue refuses a borrowing limit outside a cohort
    assert queues["cs-solo"]["resourceGroups"][0]["flavors"][0]["resources"][0] == {
        "name": "nvidia.com/gpu",
        "nominalQuota": "4",
    }
    cohorts = {c["metadata"]["name"]: c["spec"] for c in by_kind(render_tenancy(TENANCY, "k8s", "cs-"))["Cohort"]}
    assert cohorts == {
        "cs-firm": {"fairSharing": {"weight": "1"}},
        "cs-trading": {"fairSharing": {"weight": "1.5"}, "parentName": "cs-firm"},
    }


def test_the_desks_quota_is_the_most_its_queues_could_be_admitted_and_unbounded_resources_are_left_out():
    [quota] = by_kind(render_tenancy(TENANCY, "k8s"))["ResourceQuota"]
    # a100: desk-a 8 (+ 0 to borrow: nobody else in its tree) + solo 4 (no cohort); h100: 2
    assert quota["spec"]["hard"] == {"requests.nvidia.com/gpu": "14"}  # cpu and memory unbounded on a100


def test_the_hub_is_bound_in_each_desk_namespace_only_as_a_service_account_or_a_user():
    objects = render_tenancy(TENANCY, "k8s", hub=HubIdentity(name="hub", namespace="platform"))
    [binding] = by_kind(objects)["RoleBinding"]
    assert binding["metadata"]["namespace"] == "desk-a"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub", "namespace": "platform"}]
    [role] = by_kind(objects)["Role"]
    assert {verb for rule in role["rules"] for verb in rule["verbs"]} <= {
        "get", "list", "watch", "create", "delete", "patch", "update",
    }  # fmt: skip
    assert not [rule for rule in role["rules"] if "rbac.authorization.k8s.io" in rule["apiGroups"]]
    user = render_tenancy(TENANCY, "k8s", hub=HubIdentity(name="cellscale-hub", namespace=None))
    assert by_kind(user)["RoleBinding"][0]["subjects"] == [
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "cellscale-hub"}
    ]
    assert "cellscale" not in {o["metadata"]["name"] for o in by_kind(user)["Namespace"]}


BLOCK, RACK, HOST = "cloud.provider.com/topology-block", "cloud.provider.com/topology-rack", "kubernetes.io/hostname"


def test_with_a_topology_level_the_flavors_name_a_kueue_topology_of_the_backends_levels():
    objects = render_tenancy(TENANCY, "k8s", "cs-", topology_level=RACK, topology_levels=[BLOCK, RACK, HOST])
    assert objects[0] == {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Topology",
        "metadata": {"name": "cs-k8s", "labels": {"app.kubernetes.io/managed-by": "cellscale"}},
        "spec": {"levels": [{"nodeLabel": BLOCK}, {"nodeLabel": RACK}, {"nodeLabel": HOST}]},
    }
    assert {f["metadata"]["name"]: f["spec"] for f in by_kind(objects)["ResourceFlavor"]} == {
        "cs-a100": {"nodeLabels": {"cellscale.io/flavor": "cs-a100"}, "topologyName": "cs-k8s"},
        "cs-h100": {"nodeLabels": {"cellscale.io/flavor": "cs-h100"}, "topologyName": "cs-k8s"},
    }
    assert [o["kind"] for o in objects[1:]] == [o["kind"] for o in render_tenancy(TENANCY, "k8s", "cs-")]
    plain = render_tenancy(TENANCY, "k8s", "cs-")  # no topology level: no Topology, flavors without labels
    assert "Topology" not in by_kind(plain) and [f["spec"] for f in by_kind(plain)["ResourceFlavor"]] == [{}, {}]


LEVELS = [
    # (topology_level, topology_levels) -> the Topology's levels, or the refusal
    ("", [], ()),
    (RACK, [], (RACK, HOST)),  # the level above each node
    (HOST, [], (HOST,)),
    (RACK, [BLOCK, RACK, HOST], (BLOCK, RACK, HOST)),
    (BLOCK, [BLOCK, RACK], (BLOCK, RACK)),
    ("", [BLOCK, RACK], "topology_levels ['cloud.provider.com/topology-block', 'cloud.provider.com/topology-rack'] "
     "are set but topology_level is empty: set topology_level to the level `--switches 1` keeps a gang within "
     "(one of them)"),
    ("rack", [BLOCK, RACK, HOST], "topology_level 'rack' is not one of topology_levels "
     "['cloud.provider.com/topology-block', 'cloud.provider.com/topology-rack', 'kubernetes.io/hostname']: "
     "Kueue would never admit a --switches job asking for it; add it to the levels or choose one of them"),
    (RACK, [HOST, RACK], "topology_levels ['kubernetes.io/hostname', 'cloud.provider.com/topology-rack']: "
     "Kueue allows kubernetes.io/hostname only as the last (lowest) level"),
    (RACK, [RACK, RACK], "topology_levels ['cloud.provider.com/topology-rack', 'cloud.provider.com/topology-rack']: "
     "Kueue needs at most 16 levels, each a different node label"),
    (RACK, [f"l{i}" for i in range(16)] + [RACK], "Kueue needs at most 16 levels"),
    ("Rack Label", [], "topology level 'Rack Label' is not a Kubernetes label key"),
    ("EXAMPLE.com/rack", [], "topology level 'EXAMPLE.com/rack' is not a Kubernetes label key"),
    (RACK, [RACK, "a/b/c"], "topology level 'a/b/c' is not a Kubernetes label key"),
    (RACK, [RACK, "x" * 64], "is not a Kubernetes label key"),
]  # fmt: skip


@pytest.mark.parametrize(("level", "levels", "expected"), LEVELS)
def test_topology_levels_default_below_the_level_and_are_refused_as_kueue_would(level, levels, expected):
    if isinstance(expected, tuple):
        assert levels_of(level, levels) == expected
        return
    with pytest.raises(ValueError) as refused:
        render_tenancy(TENANCY, "k8s", topology_level=level, topology_levels=levels)
    assert expected in str(refused.value)


def test_the_command_line_takes_the_drivers_topology_traits_and_refuses_bad_ones(tmp_path, capsys):
    tenancy = tmp_path / "tenants.yaml"
    tenancy.write_text(TENANCY_YAML)
    assert main([str(tenancy), "--backend", "k8s", "--topology-level", RACK, "--topology-levels", BLOCK, RACK]) == 0
    assert "kind: Topology\nmetadata:\n  name: k8s\n" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exited:
        main([str(tenancy), "--backend", "k8s", "--topology-levels", BLOCK, RACK])
    assert exited.value.code == 2
    assert "topology_level is empty" in capsys.readouterr().err


def test_object_paths_cover_every_rendered_kind():
    paths = {object_path(obj) for obj in render_tenancy(TENANCY, "k8s")}
    assert "/apis/kueue.x-k8s.io/v1beta2/namespaces/desk-a/localqueues/default" in paths
    assert "/api/v1/namespaces/desk-a/resourcequotas/cellscale" in paths
    assert "/apis/rbac.authorization.k8s.io/v1/namespaces/desk-a/rolebindings/cellscale-hub" in paths


def test_the_crds_lose_only_what_kube_1_20_refuses_or_does_not_know():
    crd = {
        "spec": {
            "versions": [
                {
                    "name": "v1",
                    "selectableFields": [{"jsonPath": ".spec.x"}],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-validations": [{"rule": "true"}],
                            "properties": {
                                "secrets": {
                                    "type": "array",
                                    "x-kubernetes-list-type": "map",
                                    "x-kubernetes-list-map-keys": ["name"],
                                    "items": {
                                        "type": "object",
                                        "properties": {"name": {"type": "string", "default": ""}},
                                    },
                                },
                                "mode": {"type": "string", "default": "fast"},
                            },
                        }
                    },
                }
            ]
        }
    }
    stripped, removed = for_kube_1_20(crd)
    schema = stripped["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert "x-kubernetes-validations" not in schema and "selectableFields" not in stripped["spec"]["versions"][0]
    assert schema["properties"]["mode"]["default"] == "fast"
    assert schema["properties"]["secrets"]["items"] == {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
    }
    assert len(removed) == 4 and crd["spec"]["versions"][0]["selectableFields"]  # the original is untouched


def test_desk_profiles_need_unique_slugs_and_may_not_choose_their_namespace():
    from cellscale_hub.drivers.kubernetes.spawner import check_desk_profiles

    with pytest.raises(ValueError, match="profile slug 'cpu' is used by desks desk-a and desk-b: slugs are unique"):
        check_desk_profiles({"desk-a": [{"slug": "cpu"}], "desk-b": [{"slug": "cpu"}]})
    with pytest.raises(ValueError, match="profile 'a' overrides namespace: its desk decides them"):
        check_desk_profiles({"desk-a": [{"slug": "a", "kubespawner_override": {"namespace": "x"}}]})


def test_the_shipped_profiles_are_valid_and_cover_the_demo_desks():
    from pathlib import Path

    import yaml

    from cellscale_hub.drivers.kubernetes.spawner import check_desk_profiles

    shipped = yaml.safe_load((Path(__file__).parents[2] / "config" / "kubernetes" / "profiles.yaml").read_text())
    check_desk_profiles(shipped)
    assert sorted(shipped) == ["desk-a", "desk-b"]


def test_a_built_apiserver_is_reused_and_a_failed_build_is_reported_not_retried_by_the_fixture(tmp_path):
    from cellscale_hub.dev import kube as dev_kube

    build = dev_kube.build_for(tmp_path)
    build.root.mkdir(parents=True)
    build.failed.write_text("`go build ...` exited 2 (see build.log)\n")
    build.log.write_text("cmd/kube-apiserver/app/server.go:477:87: undefined: openapi.GetOpenAPIDefinitions\n")
    with pytest.raises(dev_kube.KubeError) as failed:
        dev_kube.build(tmp_path, log=lambda line: None, retry_failed=False)
    assert str(failed.value).startswith("the kube-apiserver build failed: `go build ...` exited 2 (see build.log)")
    assert "undefined: openapi.GetOpenAPIDefinitions" in str(failed.value)
    assert str(failed.value).endswith("Fix the cause, then build it again: python -m cellscale_hub.dev.kube build")
    build.apiserver.write_text("")
    assert dev_kube.build(tmp_path, log=lambda line: None, retry_failed=False) == build.apiserver
