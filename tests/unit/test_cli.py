"""The command line: arguments reach the %%cluster parser as the shell split them, and every
refusal is one line on stderr with exit 2 (change the request) or 1 (a failure), never a traceback."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from cellscale import cli
from cellscale.client import ApiError, Client
from cellscale.spec import JobLimits, JobPage, JobSpec, JobView, Phase, RenderView


class FakeClient:
    def __init__(self, error: Exception | None = None):
        self.error = error
        self.specs = []

    def render(self, spec):
        self.specs.append(spec)
        return RenderView(backend="local", script="#!/bin/sh\n")

    def get(self, job_id):
        raise self.error

    def holds_token(self, value):
        return value == "the-token"

    def list(self, **_):
        if self.error is None:
            return JobPage(items=[])
        raise self.error

    def limits(self, queue=None, backend=None):
        return JobLimits(queue=queue or "default", cluster_queue="desk-a", gpus=4, cpus=32, memory_mb=65536)


@pytest.fixture
def client(monkeypatch):
    fake = FakeClient()
    monkeypatch.setattr(cli.Client, "from_env", classmethod(lambda cls: fake))
    return fake


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_arguments_pass_through_unsplit(tmp_path, client, capsys):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    argv = ["submit", str(script), "--env", "MSG=hello world", '--env=QUOTE=it\'s "x"', "--name", "a-b", "--dry-run"]
    code, out, err = run(capsys, *argv)
    assert code == 0 and out == "#!/bin/sh\n"  # the script alone on stdout; the environment on stderr
    assert err.splitlines()[1:] == ["  MSG=hello world", '  QUOTE=it\'s "x"']
    assert client.specs[0].env == {"MSG": "hello world", "QUOTE": 'it\'s "x"'} and client.specs[0].name == "a-b"


@pytest.mark.parametrize(
    "content, words",
    [
        (None, "cannot read {path}: No such file or directory"),
        (b"print('caf\xe9')\n", "{path} is not UTF-8 text (byte 10); save it as UTF-8"),
    ],
    ids=["missing file", "non-UTF-8 file"],
)
def test_an_unreadable_file_is_one_line(tmp_path, client, capsys, content, words):
    path = tmp_path / "train.py"
    if content is not None:
        path.write_bytes(content)
    code, out, err = run(capsys, "submit", str(path), "--dry-run")
    assert code == 2 and out == "" and err == f"cellscale: {words.format(path=path)}\n"


@pytest.mark.parametrize(
    "error, code, words",
    [
        (ApiError(404, "no job cs-x visible to you"), 2, "cellscale: no job cs-x visible to you"),
        (ApiError(503, "backend 'slurm' is not configured\non this control plane"), 1, "backend 'slurm' is not"),
        (httpx.ConnectError("[Errno 111] Connection refused"), 1, "cannot reach the control plane: [Errno 111]"),
        (RuntimeError("the personal control plane did not start"), 1, "the personal control plane did not start"),
        (KeyError("phase"), 1, "cellscale: internal error: KeyError: 'phase' (CELLSCALE_DEBUG=1 shows where)"),
    ],
    ids=["refused", "server error", "unreachable", "personal plane", "a bug"],
)
def test_errors_are_one_line_without_a_traceback(client, capsys, error, code, words):
    client.error = error
    status, out, err = run(capsys, "status", "cs-x")
    assert status == code and out == "" and words in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_a_bad_option_says_what_to_change(tmp_path, client, capsys):
    script = tmp_path / "train.py"
    script.write_text("x = 1\n")
    code, _, err = run(capsys, "submit", str(script), "--gpu", "2")
    assert code == 2 and err == "cellscale: unknown option --gpu (did you mean --gpus?)\n"
    code, _, err = run(capsys, "submit", str(script), "--gpus", "999", "--dry-run")
    assert (
        code == 2 and err == "cellscale: --gpus 999 is more than queue default can ever get; ask for at most --gpus 4\n"
    )
    code, _, err = run(capsys, "submit", str(script), "--env", "X=" + "v" * 70_000, "--dry-run")
    assert err == (
        "cellscale: --env: 68.4 KiB of environment (70003 bytes, each KEY=VALUE with its NUL); a job's environment "
        "may be at most 64 KiB: ship large values as a file or with --inputs\n"
    )
    assert code == 2


def test_a_submitted_file_is_named_after_it_and_list_shows_titles(tmp_path, client, capsys, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    code, _, err = run(capsys, "submit", str(script), "--dry-run", "--env", "API_KEY=k", "--env", "T=the-token")
    assert code == 0 and err.splitlines()[1:] == ["  API_KEY=****", "  T=****"]
    assert (client.specs[0].title, client.specs[0].name) == ("train.py", "train.py")

    now = datetime.now(UTC)
    views = [
        JobView(
            id=f"cs-00000000000{i}",
            name=spec.name,
            owner="alice",
            tenant="desk-a",
            queue="default",
            backend="local",
            phase=Phase.SUCCEEDED,
            spec=spec,
            created_at=now,
            updated_at=now,
            started_at=now,
            finished_at=now,
            cancel_requested=False,
            result_available=False,
            attempts=[],
        )
        for i, spec in enumerate([client.specs[0], JobSpec(source="x", name="ddp")], start=1)
    ]
    monkeypatch.setattr(client, "list", lambda **_: JobPage(items=views), raising=False)
    code, out, err = run(capsys, "list")
    assert code == 0 and err == ""
    assert out.splitlines() == [
        "cs-000000000001  train.py  SUCCEEDED · 00:00 · attempt - · 1 CPU on local",
        "cs-000000000002  ddp       SUCCEEDED · 00:00 · attempt - · 1 CPU on local",
    ]


def test_an_empty_list_says_so_on_stderr(client, capsys):
    assert run(capsys, "list") == (0, "", "no jobs yet; submit one: cellscale submit train.py\n")
    assert run(capsys, "list", "--phase", "RUNNING") == (0, "", "no running jobs\n")


def test_a_client_knows_its_own_token_in_a_value_and_nothing_else():
    real = Client("http://127.0.0.1:1", "s3cr3t-token")
    try:
        assert real.holds_token("Bearer s3cr3t-token") and not real.holds_token("another value")
    finally:
        real.close()
