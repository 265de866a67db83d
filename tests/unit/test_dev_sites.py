"""The sites topology's pure parts: configs render with every value, an old cluster's
slurmctld state is cleared, the power scripts are plain Python."""

from __future__ import annotations

import ast
from pathlib import Path

from cellscale_hub.dev import cloud as dev_cloud
from cellscale_hub.dev import slurm as dev_slurm


def settings() -> dev_slurm.Settings:
    return dev_slurm.Settings(
        hostname="vm",
        mariadb_port=26306,
        slurmctld_port=26817,
        slurmdbd_port=26819,
        slurmd_port_first=27001,
        db_password="ab12",
        dcb_slurmctld_port=26827,
        cloud_port=26900,
        cloud_slurmd_port_first=27011,
        dcb_slurmd_port_first=27021,
    )


def test_both_clusters_configs_render(tmp_path):
    values = dev_slurm.template_values(dev_slurm.Layout(tmp_path), settings())
    dca = dev_slurm.render("slurm.conf", values)
    assert "ClusterName=dca\n" in dca and "PartitionName=burst Nodes=c[1-4]" in dca
    assert "Port=[27011-27014]" in dca and "State=CLOUD" in dca and "SuspendTime=INFINITE" in dca
    assert f"ResumeProgram={tmp_path}/bin/cloud-resume" in dca and f"PrologSlurmctld={tmp_path}/bin/prolog-ctld" in dca
    dcb = dev_slurm.render("dcb-slurm.conf", values)
    assert "ClusterName=dcb\n" in dcb and "SlurmctldPort=26827" in dcb and "Port=[27021-27022]" in dcb
    assert f"StateSaveLocation={tmp_path}/spool/slurmctld-dcb" in dcb and "burst" not in dcb
    assert "NodeName=b[1-2]" in dev_slurm.render("dcb-gres.conf", values)
    assert "c[1-4]" in dev_slurm.render("topology.conf", values)  # a node under no switch is unusable


def test_a_ctld_state_made_for_the_old_cluster_name_is_cleared(tmp_path):
    layout = dev_slurm.Layout(tmp_path)
    old = tmp_path / "spool" / "slurmctld"
    (old / "hash.1").mkdir(parents=True)
    (old / "clustername").write_text("cellscale\n")
    (old / "job_state").write_text("x")
    mine = tmp_path / "spool" / "slurmctld-dcb"
    mine.mkdir()
    (mine / "clustername").write_text("dcb\n")
    layout.jobs.mkdir()
    (layout.jobs / "126.out").write_text("the old cluster's job 126")
    (layout.jobs / "notes.out").write_text("not a job's")
    dev_slurm.clear_foreign_ctld_state(layout, lambda line: None)
    assert list(old.iterdir()) == []
    assert (mine / "clustername").exists()
    assert sorted(p.name for p in layout.jobs.iterdir()) == ["notes.out"]  # job ids start again at 1


def test_power_scripts_are_python_with_absolute_paths(tmp_path):
    for program, kind in dev_cloud.POWER_PROGRAMS.items():
        text = dev_cloud.power_script(kind, tmp_path / "cloud" / "config.json")
        assert text.startswith("#!/usr/bin/python3 -I\n"), program
        ast.parse(text)
        assert f"KIND = {kind!r}" in text and f"CONFIG = {str(tmp_path / 'cloud' / 'config.json')!r}" in text


def test_the_cloud_refuses_unknown_nodes(tmp_path):
    token = tmp_path / "token"
    token.write_text("t\n")
    config = {"nodes": {"c1": 8}, "token_file": str(token), "boot_delay": 0, "price_per_gpu_hour": 2.5}
    cloud = dev_cloud.Cloud(config)
    assert cloud.valid_nodes(["c1"]) == ["c1"]
    for bad in (["c9"], ["c1; rm -rf /"], [], "c1"):
        try:
            cloud.valid_nodes(bad)
        except ValueError:
            continue
        raise AssertionError(f"accepted {bad!r}")
    cloud.mode = "stockout"
    code, body = cloud.resume(["c1"], [1])
    assert code == 503 and "InsufficientInstanceCapacity" in body["error"] and cloud.ledger == []
    assert Path(config["token_file"]).exists()
