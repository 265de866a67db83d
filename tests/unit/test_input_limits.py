"""Input limits of the wire contract and of the OS: spec caps, the exec size check done before
submit, and a job the OS refuses to start because of its own input counted as a user error."""

from __future__ import annotations

import errno

import pytest
from pydantic import ValidationError

from cellscale.runtime.supervisor import launch_failure
from cellscale.spec import (
    MAX_ARG_STRLEN,
    MAX_ENV_BYTES,
    MAX_ENV_VARS,
    MAX_NAME_CHARS,
    MAX_NAMES,
    JobSpec,
    env_bytes,
    exec_limit,
    exec_refusal,
)
from cellscale.vocabulary import ExitReason, Fault
from cellscale.wire import explain
from cellscale_hub.faults import from_exit_records
from tests.unit.test_runtime import job_dir, supervise


def refusal(**fields) -> str:
    with pytest.raises(ValidationError) as info:
        JobSpec(source="x = 1", **fields)
    return explain(info.value)


@pytest.mark.parametrize(
    "fields, words",
    [
        (
            {"env": {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}},
            f"--env: Dictionary should have at most {MAX_ENV_VARS}",
        ),
        ({"env": {"BIG": "x" * MAX_ENV_BYTES}}, f"--env: 64.0 KiB of environment ({MAX_ENV_BYTES + 5} bytes"),
        ({"env": {"A" * (MAX_NAME_CHARS + 1): "1"}}, f"longer than {MAX_NAME_CHARS} characters"),
        ({"outputs": [f"v{i}" for i in range(MAX_NAMES + 1)]}, f"--outputs: List should have at most {MAX_NAMES}"),
        ({"outputs": ["v" * (MAX_NAME_CHARS + 1)]}, "--outputs: 'vvvvvvvvvvvvvvvvvvvv'... is longer than"),
        ({"input_names": ["v" * 10_000], "inputs_sha256": "0" * 64}, "--inputs: 'vvvvvvvvvvvvvvvvvvvv'... is longer"),
        ({"stall_timeout_s": float("nan")}, "--stall-timeout: Input should be a finite number"),
        ({"stall_timeout_s": float("inf")}, "--stall-timeout: Input should be a finite number"),
    ],
)
def test_spec_sizes_are_capped_and_named_by_flag(fields, words):
    assert words in refusal(**fields)


def test_the_caps_are_generous():
    env = {f"VAR_{i}": "v" * 200 for i in range(MAX_ENV_VARS)}  # 256 variables of 200 bytes: 53 KiB
    names = [f"name_{i}" for i in range(MAX_NAMES)]
    spec = JobSpec(source="x = 1", env=env, outputs=names, input_names=names, inputs_sha256="0" * 64)
    assert env_bytes(spec.env) <= MAX_ENV_BYTES and exec_refusal(spec.env) is None


def test_the_caps_are_documented_in_the_schema():
    fields = JobSpec.model_json_schema()["properties"]
    assert f"at most {MAX_ENV_VARS}" in fields["env"]["description"] and fields["env"]["maxProperties"] == MAX_ENV_VARS
    assert fields["outputs"]["maxItems"] == MAX_NAMES and str(MAX_NAME_CHARS) in fields["outputs"]["description"]


def test_env_and_arguments_are_checked_against_the_os_limits():
    assert exec_limit() >= 128 * 1024
    assert exec_refusal({"A": "1"}, ["python", "-m", "x"]) is None
    one = exec_refusal({"BIG": "x" * MAX_ARG_STRLEN}, arg_max=2**40)
    assert one.startswith("--env BIG:") and "Argument list too long" in one
    argument = exec_refusal({}, ["x" * MAX_ARG_STRLEN], arg_max=2**40)
    assert "argument is longer" in argument
    small_os = exec_refusal({f"V{i}": "x" * 1000 for i in range(100)}, arg_max=128 * 1024)  # `ulimit -s 512`
    assert small_os.startswith("--env and the job's arguments take") and "ARG_MAX" in small_os
    assert exec_refusal({f"V{i}": "x" * 1000 for i in range(100)}, arg_max=2 * 2**20) is None


@pytest.mark.parametrize(
    "exc, reason, fault",
    [
        (OSError(errno.E2BIG, "Argument list too long"), ExitReason.INPUT_REFUSED, Fault.USER_ERROR),
        (OSError(errno.ENOENT, "No such file or directory"), ExitReason.LAUNCH_FAILED, Fault.INFRASTRUCTURE),
        (RuntimeError("ray head did not start"), ExitReason.LAUNCH_FAILED, Fault.INFRASTRUCTURE),
    ],
)
def test_a_launch_refused_for_the_jobs_own_input_is_a_user_error(exc, reason, fault):
    record = launch_failure(exc)
    assert record.reason is reason and record.reason.fault is fault and record.code == 127
    assert from_exit_records([record.reason, ExitReason.FAILED]) is fault
    if reason is ExitReason.INPUT_REFUSED:
        assert "--env" in record.message


def test_the_supervisor_reports_e2big_as_the_jobs_own_fault(tmp_path):
    jd = job_dir(tmp_path, "print('never')", env={"BIG": "x" * (MAX_ARG_STRLEN + 1)})  # past the spec's cap
    supervise(jd)
    record = jd.read_exit(1)
    assert record.reason is ExitReason.INPUT_REFUSED and record.reason.fault is Fault.USER_ERROR, record
    assert "Argument list too long" in record.message and "input_refused" in jd.log.read_text()
