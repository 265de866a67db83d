import pytest
from pydantic import ValidationError

from cellscale.spec import JobSpec, Phase, Resources


def spec(**kw):
    return JobSpec(source="x = 1", **kw)


def test_defaults_are_a_small_torchrun_job():
    s = spec()
    assert s.launcher.value == "torchrun" and s.resources.gpus == 0 and s.resources.timeout_min == 60


def test_unknown_fields_are_refused():
    with pytest.raises(ValidationError, match="Extra inputs"):
        JobSpec.model_validate({"source": "x", "gpu": 2})


def test_inputs_need_their_bundle():
    with pytest.raises(ValidationError, match="go together"):
        spec(input_names=["df"])


def test_env_refuses_newlines():
    with pytest.raises(ValidationError, match="newline"):
        spec(env={"A": "1\n2"})


def test_resources_bounds():
    with pytest.raises(ValidationError):
        Resources(nodes=0)
    assert Resources(nodes=2, gpus_per_node=8).gpus == 16


def test_terminal_phases():
    assert {p for p in Phase if p.terminal} == {Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED}


def test_jax_starts_a_process_per_gpu_or_as_many_as_tasks_per_node_says():
    assert spec(launcher="jax", resources={"gpus_per_node": 4}).resources.tasks_per_node == 4
    assert spec(launcher="jax").resources.tasks_per_node == 1
    on_cpus = spec(launcher="jax", resources={"tasks_per_node": 2, "cpus_per_task": 2})
    assert on_cpus.resources.tasks_per_node == 2 and on_cpus.resources.cpus == 4


def test_a_jax_jobs_coordinates_are_cellscales_own():
    with pytest.raises(ValidationError, match="set by cellscale itself"):
        spec(launcher="jax", env={"JAX_PROCESS_ID": "0"})
