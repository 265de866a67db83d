"""Users kept apart by the OS: servers, kernels and local jobs run as their users' own Unix
identities. As bob, through his kernel and through his job, try to read or write alice's job
directory, log, result, inputs bundle and notebook: every attempt is refused by the OS.
A desk-mate's kernel never unpickles alice's outputs (no result key); alice's own does."""

from __future__ import annotations

import json
import os

import pytest

from tests.integration.conftest import api

pytestmark = pytest.mark.integration

ALICE_CELL = """private = "alice's inputs"
open(os.path.expanduser("~/secret.ipynb"), "w").write("{}")
"""
ALICE_JOB = """%%cluster --gpus 1 --launcher plain --inputs private --outputs secret --name private
secret = private.upper()
"""
PROBE = """
import json, os
def probe(path, how):
    try:
        if how == "read":
            open(path, "rb").read(1)
        elif how == "write":
            open(path, "ab").close()
        else:
            os.listdir(path)
        return "allowed"
    except PermissionError:
        return "denied"
    except FileNotFoundError:
        return "missing"
verdict = {name: probe(path, how) for name, (path, how) in TARGETS.items()}
"""


def _targets(hub, job_id: str, bundle: str) -> dict[str, tuple[str, str]]:
    job_dir = hub.jobs_root / job_id
    return {
        "job dir": (str(job_dir), "list"),
        "log": (str(job_dir / "output.log"), "read"),
        "result (read)": (str(job_dir / "result.pkl"), "read"),
        "result (write)": (str(job_dir / "result.pkl"), "write"),
        "inputs": (str(job_dir / "inputs.pkl"), "read"),
        "bundle": (str(hub.data_dir / "bundles" / "alice" / bundle), "read"),
        "store": (str(hub.data_dir / "cellscale.sqlite"), "read"),
        "notebook": ("/home/alice/secret.ipynb", "read"),
    }


def test_one_user_cannot_touch_anothers_files_from_a_kernel_or_a_job(hub, token, kernel):
    if os.geteuid() != 0:
        pytest.skip("users are kept apart only when the hub runs as root (single-user mode otherwise)")
    alice = kernel("alice")
    assert alice.execute("import os\n" + ALICE_CELL).reply["status"] == "ok"
    run = alice.execute(ALICE_JOB, timeout=300)
    assert run.reply["status"] == "ok", run.text
    assert alice.execute("print(secret)").text.strip() == "ALICE'S INPUTS"  # checked, then unpickled
    job = api(hub, token("alice")).get("jobs", params={"limit": 1}).json()["items"][0]
    targets = _targets(hub, job["id"], job["spec"]["inputs_sha256"])
    assert all(os.path.exists(path) for path, _ in targets.values()), targets  # they are there, as root sees

    bob = kernel("bob")
    from_kernel = bob.execute(f"TARGETS = {targets!r}\n{PROBE}\nprint(json.dumps(verdict))")
    assert json.loads(from_kernel.text.strip().splitlines()[-1]) == dict.fromkeys(targets, "denied")

    job_cell = f"%%cluster --gpus 1 --launcher plain --outputs verdict --name probe\nTARGETS = {targets!r}\n{PROBE}"
    assert bob.execute(job_cell, timeout=300).reply["status"] == "ok"
    from_job = bob.execute("import json\nprint(json.dumps(verdict))")
    assert json.loads(from_job.text.strip().splitlines()[-1]) == dict.fromkeys(targets, "denied")

    carol = kernel("carol")  # alice's desk-mate may read the job through the API, never unpickle its outputs
    check = carol.execute(
        "from cellscale.client import Client, ResultUnverified\n"
        f"try:\n    Client.from_env().result({job['id']!r})\n"
        "except ResultUnverified as exc:\n    print('refused:', exc)"
    )
    assert "refused:" in check.text and "no result key" in check.text, check.text
