"""The magic in a bare IPython InteractiveShell, with a recording client: checks that bad
input is refused before anything is sent, and that results land in the namespace."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import cloudpickle
import pytest
from IPython.core.interactiveshell import InteractiveShell

from cellscale.bundle import InputError, pack_inputs
from cellscale.client import ApiError
from cellscale.magics import ClusterMagics, JobFailed
from cellscale.spec import CostEstimate, JobCost, JobLimits, JobPage, JobSpec, JobView, LogChunk, Phase, RenderView

NOW = datetime.now(UTC)


class RecordingClient:
    def __init__(self, phase=Phase.SUCCEEDED, outputs=None):
        self.calls, self.phase, self.outputs = [], phase, outputs or {}
        self.spec = None

    def render(self, spec):
        self.calls.append("render")
        return RenderView(backend="local", script="#!/bin/sh\nexec supervisor\n")

    def holds_token(self, value):
        return "hub-token-123" in value

    def upload_inputs(self, blob):
        self.calls.append("upload")
        self.blob = blob
        return type("Ref", (), {"sha256": hashlib.sha256(blob).hexdigest()})()  # content-addressed, as served

    def submit(self, spec):
        self.calls.append("submit")
        self.spec = spec
        return self._view()

    def get(self, job_id):
        return self._view()

    def follow_logs(self, job_id, offset=0):
        yield LogChunk(offset=0, next_offset=20, text="[rank 0] hello\n", complete=False)
        yield LogChunk(offset=20, next_offset=20, text="", complete=True)

    def result(self, job_id):
        self.calls.append("result")
        return self.outputs

    def _view(self):
        return JobView(
            id="cs-000000000001",
            name="cell",
            owner="alice",
            tenant="desk-a",
            queue="default",
            backend="local",
            phase=self.phase,
            reason="because",
            spec=self.spec,
            created_at=NOW,
            updated_at=NOW,
            started_at=NOW,
            finished_at=NOW,
            cancel_requested=False,
            result_available=bool(self.outputs),
            attempts=[],
        )


@pytest.fixture
def shell():
    sh = InteractiveShell()
    yield sh
    sh.clear_instance()


def run(shell, client, line, cell="x = 1\n"):
    shell.register_magics(ClusterMagics(shell, client=client))
    return shell.run_cell(f"%%cluster {line}\n{cell}")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("--gpu 2", "unknown option --gpu (did you mean --gpus?)"),
        ("--gpus -1", "--gpus must be 0 (a CPU job) or more"),
        ("--launcher mpi", "--launcher 'mpi' is not one of torchrun, ray, plain, jax"),
    ],
)
def test_bad_flags_send_nothing(shell, line, message, capsys):
    client = RecordingClient()
    result = run(shell, client, line)
    assert not result.success and str(result.error_in_exec) == message
    assert client.calls == []


class LimitedClient(RecordingClient):
    def __init__(self, refuse=False):
        super().__init__()
        self.refuse = refuse

    def limits(self, queue=None, backend=None):
        self.calls.append(("limits", queue, backend))
        if self.refuse:
            raise ApiError(503, "the control plane is restarting")
        return JobLimits(queue=queue or "default", cluster_queue="desk-a", gpus=4, cpus=32, memory_mb=65536)


def test_too_many_gpus_asks_for_what_the_queue_can_ever_get(shell):
    """--gpus 999 is past the spec's bound (64 on a node): the magic asks the control plane
    what the queue can ever get and says that, in the flag typed; nothing is sent."""
    client = LimitedClient()
    result = run(shell, client, "--gpus 999 --queue big --dry-run")
    assert str(result.error_in_exec) == "--gpus 999 is more than queue big can ever get; ask for at most --gpus 4"
    assert client.calls == [("limits", "big", None)]


def test_too_big_without_an_answer_says_the_static_bound(shell):
    result = run(shell, LimitedClient(refuse=True), "--mem 99999T")
    assert str(result.error_in_exec) == "--mem 99999T is more than one job may ask for; ask for at most --mem 65536G"


def test_unpicklable_input_is_refused_before_submit(shell):
    shell.user_ns["gen"] = (i for i in range(3))
    client = RecordingClient()
    result = run(shell, client, "--inputs gen")
    assert "gen: a generator cannot be pickled" in str(result.error_in_exec)
    assert client.calls == []


def test_undefined_input_is_named(shell):
    client = RecordingClient()
    result = run(shell, client, "--inputs nothere")
    assert "nothere, not defined" in str(result.error_in_exec)
    assert client.calls == []


def test_oversized_inputs_are_refused_with_the_biggest_named():
    with pytest.raises(InputError, match="largest: big"):
        pack_inputs({"big": b"x" * 5000, "small": 1}, ["big", "small"], limit=1000)


def test_inputs_round_trip_by_name():
    blob = pack_inputs({"lr": 0.1, "f": lambda v: v * 2}, ["lr", "f"])
    loaded = cloudpickle.loads(blob)
    assert loaded["lr"] == 0.1 and loaded["f"](2) == 4


def test_dry_run_renders_and_submits_nothing(shell, capsys):
    client = RecordingClient()
    assert run(shell, client, "--gpus 2 --dry-run").success
    assert client.calls == ["render"]
    assert "exec supervisor" in capsys.readouterr().out


def test_detach_prints_how_to_reattach(shell, capsys):
    client = RecordingClient()
    assert run(shell, client, "--gpus 1 --detach").success
    assert client.calls == ["submit"]
    assert "%cluster attach cs-000000000001" in capsys.readouterr().out


def test_attached_cell_streams_logs_and_sets_outputs(shell, capsys):
    shell.user_ns["lr"] = 0.5
    client = RecordingClient(outputs={"loss": 0.25})
    assert run(shell, client, "--gpus 2 --inputs lr --outputs loss", "loss = lr / 2\n").success
    out = capsys.readouterr().out
    assert "[rank 0] hello" in out and "SUCCEEDED" in out
    assert shell.user_ns["loss"] == 0.25
    assert client.calls == ["upload", "submit", "result"]
    assert client.spec.input_names == ["lr"] and client.spec.inputs_sha256 == hashlib.sha256(client.blob).hexdigest()


def test_failed_job_raises_with_its_reason(shell):
    client = RecordingClient(phase=Phase.FAILED)
    result = run(shell, client, "--gpus 1")
    assert isinstance(result.error_in_exec, JobFailed)
    assert "failed: because" in str(result.error_in_exec)


def test_line_magic_usage(shell):
    shell.register_magics(ClusterMagics(shell, client=RecordingClient()))
    result = shell.run_cell("%cluster frobnicate")
    assert "unknown %cluster command 'frobnicate'" in str(result.error_in_exec)
    result = shell.run_cell("%cluster status")
    assert "needs one job id" in str(result.error_in_exec)


def test_interrupting_the_cell_detaches_and_says_how_to_reattach(shell, capsys):
    class Interrupted(RecordingClient):
        gets = 0

        def get(self, job_id):
            self.gets += 1
            if self.gets > 1:
                raise KeyboardInterrupt
            return self._view()

        def follow_logs(self, job_id, offset=0):
            yield LogChunk(offset=0, next_offset=9, text="[rank 0] started\n", complete=False)

    client = Interrupted(phase=Phase.RUNNING)
    assert run(shell, client, "--gpus 1").success
    out = capsys.readouterr().out
    assert "keeps running. Re-attach with: %cluster attach cs-000000000001" in out
    assert "result" not in client.calls


class ListingClient(RecordingClient):
    """A client whose one job is a CPU job of 8 cores and 4 GiB, for `%cluster list` and `status`."""

    def __init__(self):
        super().__init__(phase=Phase.RUNNING)
        self.spec = JobSpec(source="pass", resources={"cpus_per_task": 8, "memory_mb_per_node": "4G"})

    def list(self, scope="mine"):
        return JobPage(items=[self._view()])

    def checkpoints(self, job_id):
        return []

    def events(self, job_id):
        return []


def test_list_and_status_show_cpus_and_memory(shell, capsys):
    shell.register_magics(ClusterMagics(shell, client=ListingClient()))
    assert shell.run_cell("%cluster list").success
    assert "attempt - · 8 CPUs · 4 GiB on local" in capsys.readouterr().out
    assert shell.run_cell("%cluster status cs-000000000001").success
    assert capsys.readouterr().out.startswith(
        "cs-000000000001 · cell · RUNNING · 00:00 · attempt - · 8 CPUs · 4 GiB on local"
    )


def test_the_attached_status_line_shows_gpus_cpus_and_memory(shell, capsys):
    assert run(shell, RecordingClient(), "--gpus 2 --cpus 4 --mem 16G").success
    assert (
        "[cellscale] cs-000000000001 · x = 1 · SUCCEEDED · 00:00 · attempt - · 2 GPUs · 8 CPUs · 16 GiB on local"
        in (capsys.readouterr().out)
    )


def test_a_notebook_cell_is_named_by_its_notebook_and_execution_count(shell):
    shell.user_ns["__session__"] = "/home/alice/experiments/train.ipynb"  # ipykernel's, from JPY_SESSION_NAME
    client = RecordingClient()
    shell.register_magics(ClusterMagics(shell, client=client))
    shell.run_cell("x = 1", store_history=True)  # a cell before it: this one is In [2]
    result = shell.run_cell(
        "%%cluster --gpus 1\nimport torch\nmodel.fit(x)\n", store_history=True
    )  # as a kernel runs it
    assert result.success and result.execution_count == 2
    assert (client.spec.title, client.spec.name) == ("train.ipynb [2]", "train.ipynb-2")


def test_in_a_terminal_ipython_a_cell_is_named_by_its_first_meaningful_line(shell):
    client = RecordingClient()
    cell = "\n# train the model\nimport torch\nfrom x import y\n\nfor step in range(1000):  # " + "x" * 80 + "\n"
    assert run(shell, client, "--gpus 1", cell=cell).success
    assert client.spec.title == "for step in range(1000): # " + "x" * 32 + "…"
    assert client.spec.name == "for-step-in-range-1000-" + "x" * 32


def test_name_overrides_the_title(shell):
    shell.user_ns["__session__"] = "train.ipynb"
    client = RecordingClient()
    assert run(shell, client, "--gpus 1 --name resnet-v2").success
    assert (client.spec.name, client.spec.title) == ("resnet-v2", None)


def test_list_shows_each_job_by_its_title_in_a_column(shell, capsys):
    class Two(ListingClient):
        def list(self, scope="mine"):
            one = self._view()
            two = one.model_copy(
                update={"id": "cs-000000000002", "spec": JobSpec(source="pass", title="train.ipynb [12]")}
            )
            return JobPage(items=[one, two])

    shell.register_magics(ClusterMagics(shell, client=Two()))
    assert shell.run_cell("%cluster list").success
    assert capsys.readouterr().out.splitlines() == [
        "cs-000000000001  cell              RUNNING · 00:00 · attempt - · 8 CPUs · 4 GiB on local · because",
        "cs-000000000002  train.ipynb [12]  RUNNING · 00:00 · attempt - · 1 CPU on local · because",
    ]


def test_a_dry_run_shows_the_environment_with_secrets_masked(shell, capsys):
    line = (
        "--gpus 1 --dry-run --env LR=0.1 --env HF_TOKEN=hf_abc --env DB_PASSWORD=pw --env AWS_SECRET_ACCESS_KEY=s "
        "--env MY_CREDENTIALS=c --env COPY=hub-token-123"
    )
    client = RecordingClient()
    assert run(shell, client, line).success
    out = capsys.readouterr().out
    assert out.splitlines()[-7:] == [
        "[cellscale] environment: --env as below; cellscale adds CELLSCALE_JOB_ID, CELLSCALE_ATTEMPT, CELLSCALE_NODE, "
        "CELLSCALE_JOB_DIR, RANK, LOCAL_RANK, WORLD_SIZE, CUDA_VISIBLE_DEVICES, OMP_NUM_THREADS "
        "(and the launcher its own)",
        "  LR=0.1",
        "  HF_TOKEN=****",
        "  DB_PASSWORD=****",
        "  AWS_SECRET_ACCESS_KEY=****",
        "  MY_CREDENTIALS=****",
        "  COPY=****",  # the control plane's own token, whatever its name
    ]
    assert "hf_abc" not in out and "hub-token-123" not in out and client.calls == ["render"]


def test_an_environment_too_large_is_refused_with_its_size_before_anything_is_sent(shell):
    client = RecordingClient()
    shell.user_ns["big"] = "x" * 300 * 1024
    result = run(shell, client, "--gpus 1 --env BIG=$big")  # IPython puts the variable's value in the line
    assert not result.success and client.calls == []
    assert str(result.error_in_exec) == (
        "--env: 300.0 KiB of environment (307205 bytes, each KEY=VALUE with its NUL); a job's environment may be "
        "at most 64 KiB: ship large values as a file or with --inputs"
    )


ESTIMATE = CostEstimate(
    gpus=16,
    seconds=7200,
    basis="time_limit",
    usd_per_gpu_hour=2.6,
    usd=84.0,
    budget_fraction=0.06,
    words="≈16 GPU × 2.0 h ≈ $84, 6% of desk-a's weekly budget (at most: its --time)",
)


class CostingClient(RecordingClient):
    def render(self, spec):
        return super().render(spec).model_copy(update={"estimate": ESTIMATE})

    def _view(self):
        cost = JobCost(
            gpu_hours=32.0, used_fraction=0.41, usd=83.2, idle_usd=49.1, words="16 GPU × 2.0 h = 32.00 GPU-h"
        )
        return super()._view().model_copy(update={"estimate": ESTIMATE, "cost": cost})


def test_the_estimate_is_shown_before_it_runs_and_beside_the_cost_after(shell, capsys):
    assert run(shell, CostingClient(), "--gpus 16 --time 120").success
    out = capsys.readouterr().out
    assert f"[cellscale] cs-000000000001: {ESTIMATE.words}" in out
    assert "cost 16 GPU × 2.0 h = 32.00 GPU-h; estimated ≈16 GPU × 2.0 h ≈ $84, 6% of desk-a's weekly budget" in out


def test_a_dry_run_says_what_it_would_cost(shell, capsys):
    assert run(shell, CostingClient(), "--gpus 16 --dry-run").success
    assert f"[cellscale] would cost {ESTIMATE.words}" in capsys.readouterr().out


class EmptyClient(RecordingClient):
    def list(self, scope="mine"):
        return JobPage(items=[])


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("%cluster list", "no jobs yet; run a cell with %%cluster (e.g. %%cluster --gpus 1)\n"),
        ("%cluster list tenant", "no jobs on your desk yet\n"),
    ],
)
def test_an_empty_list_says_so(shell, capsys, line, words):
    shell.register_magics(ClusterMagics(shell, client=EmptyClient()))
    assert shell.run_cell(line).success
    assert capsys.readouterr().out == words
