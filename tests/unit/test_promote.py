"""`%cluster promote`: a succeeded job's cell as a Dagster asset module. The module is checked by
running it (its SPEC is the job's spec, its SOURCE the cell exactly), by ruff, and through the
magic and the command line with a fake client."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import types
from datetime import UTC, datetime

import dagster
import pytest
from IPython.core.interactiveshell import InteractiveShell

from cellscale import cli
from cellscale.client import ApiError
from cellscale.magicargs import MagicUsageError
from cellscale.magics import ClusterMagics
from cellscale.promote import module_text, promote
from cellscale.spec import JobSpec, JobView, Origin, Phase, Sweep

CREATED = datetime(2024, 5, 17, 22, 30, tzinfo=UTC)  # a Friday
BUNDLE = b"\x80\x05pickled inputs"
SHA = hashlib.sha256(BUNDLE).hexdigest()
CELL = 'import torch\nprint(f"rank {RANK}")\nloss = 0.5\n'


def _job(phase=Phase.SUCCEEDED, **spec) -> JobView:
    values = {
        "name": "train",
        "launcher": "plain",
        "source": CELL,
        "input_names": ["df", "lr"],
        "inputs_sha256": SHA,
        "outputs": ["loss"],
        "env": {"MODE": 'say "hi"'},
        "resources": {"gpus_per_node": 2, "memory_mb_per_node": 4096},
        "origin": Origin(tool="dagster", run_id="r-1", asset="bars"),
    }
    return JobView(
        id="cs-0123abcd4567",
        name="train",
        owner="alice",
        tenant="desk-a",
        queue="default",
        backend="local",
        phase=phase,
        spec=JobSpec.model_validate(values | spec),
        created_at=CREATED,
        updated_at=CREATED,
        started_at=CREATED,
        finished_at=CREATED,
        cancel_requested=False,
        result_available=True,
        attempts=[],
    )


class FakeClient:
    def __init__(self, job: JobView, bundle: bytes = BUNDLE):
        self.job, self.bundle, self.calls = job, bundle, []

    def get(self, job_id):
        self.calls.append(("get", job_id))
        return self.job

    def download_inputs(self, sha256):
        self.calls.append(("download", sha256))
        if self.bundle is None:
            raise ApiError(404, f"you have no input bundle {sha256}")
        return self.bundle


@pytest.fixture
def spec_asset(monkeypatch):
    """A stand-in cellscale.dagster whose spec_asset records what the module asks for."""
    made = []
    fake = types.ModuleType("cellscale.dagster")
    fake.spec_asset = lambda name, spec, **options: made.append((name, spec, options)) or name
    monkeypatch.setitem(sys.modules, "cellscale.dagster", fake)
    return made


def _run(text: str, path="/assets/model.py") -> dict:
    namespace = {"__file__": path, "__name__": "model"}
    exec(compile(text, path, "exec"), namespace)
    return namespace


@pytest.mark.parametrize("partitions", ["hourly", "daily", "weekly", "monthly"])
def test_the_module_asks_for_the_jobs_spec_cell_and_inputs(spec_asset, partitions):
    job = _job()
    text = module_text(job, "model", partitions, None, ["features", "raw/bars"], "model.inputs")
    namespace = _run(text)
    ((name, spec, options),) = spec_asset
    assert name == "model" and namespace["model"] == "model"
    assert spec is namespace["SPEC"] and spec["source"] is namespace["SOURCE"] == CELL
    assert JobSpec.model_validate(spec) == job.spec.model_copy(update={"origin": None})
    assert "origin" not in spec and "name" in spec and "retries" not in spec  # defaults are left out
    assert str(options["inputs_file"]) == "/assets/model.inputs" and options["deps"] == ["features", "raw/bars"]
    first = options["partitions_def"].get_first_partition_key()
    assert f'partition_key="{first}",' in text  # the docstring's example is a real partition
    assert options["partitions_def"].start.date() == CREATED.date()  # --start defaults to the job's date
    assert "cs-0123abcd4567" in text and "alice's" in text and "2024-05-17" in text and '"train"' in text
    assert "dagster.materialize(\n        [model],\n        partition_key=" in namespace["__doc__"]


def test_start_and_no_inputs(spec_asset):
    job = _job(input_names=[], inputs_sha256=None)
    text = module_text(job, "model", "daily", "2024-01-02", [], None)
    _run(text)
    ((_, _, options),) = spec_asset
    assert set(options) == {"partitions_def"} and options["partitions_def"].get_first_partition_key() == "2024-01-02"
    assert "pathlib" not in text and ".inputs" not in text


SOURCES = {
    "plain": ("x = 1\nprint('a', \"b\")\n", 'SOURCE = """\\\nx = 1'),
    "backslashes": ('print("a\\nb")\npattern = r"\\d+"\npath = "C:\\\\tmp"\n', 'SOURCE = r"""print("a\\nb")'),
    "triple quotes": ("doc = \"\"\"x\"\"\"\nother = '''y'''\n", 'SOURCE = "doc = \\"\\"\\"x'),
    "ends with a quote": ('s = "x"', "SOURCE = 's = "),
    "ends with a backslash": ("x = 1 + \\", 'SOURCE = "x = 1 + \\\\"'),
    "triple quotes and backslashes": ('s = """a\\"""\n', None),
    "carriage returns": ("x = 1\r\ny = 2\r\n", 'SOURCE = "x = 1\\r\\ny = 2\\r\\n"'),
    "form feed and NUL": ("x = 1\x0c\ny = '\x00'\n", None),
    "unicode": ("π = 3.14  # ≈ π, 😀\n", 'SOURCE = """\\\nπ = 3.14'),
    "line separator": ("s = '\u2028'\n", None),
    "tabs, trailing and long lines": ("if x:\n\ty = 1   \n   \n" + "z = " + " + ".join(["1"] * 60) + "\n", "# noqa"),
    "no final newline": ("x = 1", 'SOURCE = """\\\nx = 1"""'),
}


@pytest.mark.parametrize("case", SOURCES)
def test_the_cell_round_trips_exactly(spec_asset, case):
    source, shown = SOURCES[case]
    text = module_text(_job(source=source), "model", None, None, [], "model.inputs")
    assert _run(text)["SOURCE"] == source
    assert shown is None or shown in text


@pytest.mark.parametrize("line_length", [88, 120])
def test_the_module_is_ruff_clean(tmp_path, line_length):
    long_name = "a_rather_long_asset_name_for_the_daily_momentum_model"
    modules = {
        "daily.py": module_text(_job(), "daily", "daily", None, ["features"], "daily.inputs"),
        "bare.py": module_text(_job(input_names=[], inputs_sha256=None), "bare", None, None, [], None),
        f"{long_name}.py": module_text(
            _job(env={"LONG": "v" * 70}), long_name, "hourly", "2024-01-01", ["a" * 30, "b" * 30], f"{long_name}.inputs"
        ),
        "messy.py": module_text(_job(source=SOURCES["tabs, trailing and long lines"][0]), "messy", None, None, [], "x"),
        "escaped.py": module_text(_job(source=SOURCES["form feed and NUL"][0]), "escaped", None, None, [], "x"),
        "raw.py": module_text(_job(source=SOURCES["backslashes"][0]), "raw", "monthly", None, [], "x"),
    }
    for name, text in modules.items():
        (tmp_path / name).write_text(text)
    # --isolated: as in a user's project, where cellscale is a third-party package
    rules = ["--select", "E,W,F,I,B,UP", "--line-length", str(line_length)]
    check = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", *rules, "."], cwd=tmp_path)
    formatted = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--isolated", "--line-length", str(line_length), "--check", "."],
        cwd=tmp_path,
    )
    assert check.returncode == 0 and formatted.returncode == 0


def test_the_real_spec_asset_builds_the_asset():
    text = module_text(_job(), "model", "daily", None, ["features"], "model.inputs")
    asset = _run(text)["model"]
    assert isinstance(asset, dagster.AssetsDefinition)
    assert asset.key == dagster.AssetKey("model") and asset.partitions_def.get_first_partition_key() == "2024-05-17"
    assert dagster.AssetKey("features") in asset.dependency_keys


# -- promote: the files and the refusals ---------------------------------------------------------
def test_promote_writes_the_module_and_the_bundle(tmp_path, spec_asset):
    client = FakeClient(_job())
    line = promote(client, "cs-0123abcd4567", "model", partitions="daily", deps=["features"], directory=tmp_path / "a")
    assert (tmp_path / "a" / "model.inputs").read_bytes() == BUNDLE
    assert _run((tmp_path / "a" / "model.py").read_text(), str(tmp_path / "a" / "model.py"))["SOURCE"] == CELL
    assert client.calls == [("get", "cs-0123abcd4567"), ("download", SHA)]
    assert line.startswith(f"wrote {tmp_path / 'a' / 'model.py'} and model.inputs")


def test_a_job_without_inputs_writes_only_the_module(tmp_path):
    client = FakeClient(_job(input_names=[], inputs_sha256=None))
    promote(client, "cs-0123abcd4567", "model", directory=tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["model.py"] and ("download", None) not in client.calls


def test_existing_files_are_kept_unless_forced(tmp_path):
    (tmp_path / "model.inputs").write_bytes(b"older")
    with pytest.raises(MagicUsageError, match="model.inputs exists: pick another --asset, or add --force"):
        promote(FakeClient(_job()), "cs-0123abcd4567", "model", directory=tmp_path)
    assert not (tmp_path / "model.py").exists()
    promote(FakeClient(_job()), "cs-0123abcd4567", "model", directory=tmp_path, force=True)
    assert (tmp_path / "model.inputs").read_bytes() == BUNDLE


@pytest.mark.parametrize(
    ("phase", "message"),
    [
        (Phase.RUNNING, "is RUNNING: promote takes a job that SUCCEEDED; wait for it to end (%cluster attach"),
        (Phase.PENDING, "is PENDING: promote takes a job that SUCCEEDED; wait"),
        (Phase.FAILED, "is FAILED: promote takes a job that SUCCEEDED; fix the cell, run it again"),
        (Phase.CANCELLED, "is CANCELLED"),
    ],
)
def test_only_a_succeeded_job_is_promoted(tmp_path, phase, message):
    with pytest.raises(MagicUsageError, match=message.replace("(", r"\(")):
        promote(FakeClient(_job(phase)), "cs-0123abcd4567", "model", directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_is_refused(tmp_path):
    sweep = Sweep(points=3, points_sha256="c" * 64)
    with pytest.raises(MagicUsageError, match="promote works on single jobs; a sweep"):
        promote(FakeClient(_job(sweep=sweep)), "cs-0123abcd4567", "model", directory=tmp_path)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"asset": "daily-model"}, "--asset 'daily-model' cannot name an asset.*e.g. --asset daily_model"),
        ({"asset": "2nd model"}, "e.g. --asset asset_2nd_model"),
        ({"asset": "class"}, "e.g. --asset class_asset"),
        ({"asset": "modèle"}, "e.g. --asset mod_le"),
        ({"asset": "SPEC"}, "--asset SPEC is a name the module itself uses: e.g. --asset SPEC_asset"),
        ({"asset": "model\n"}, r"--asset 'model\\n' cannot name an asset"),
        ({"start": "2024-05-01"}, "--start 2024-05-01 dates the first partition: add --partitions"),
        ({"partitions": "daily", "start": "May 1"}, "--start 'May 1' is not a date: write it YYYY-MM-DD"),
        ({"partitions": "yearly"}, "--partitions 'yearly': use hourly, daily, weekly, monthly"),
        ({"deps": ["features", "raw bars"]}, "--deps: 'raw bars' is not an asset key"),
        ({"deps": ["features\n"]}, r"--deps: 'features\\n' is not an asset key"),
    ],
)
def test_bad_options_are_refused_before_anything_is_asked(tmp_path, options, message):
    client = FakeClient(_job())
    options = {"asset": "model"} | options
    with pytest.raises(MagicUsageError, match=message):
        promote(client, "cs-0123abcd4567", options.pop("asset"), directory=tmp_path, **options)
    assert client.calls == [] and list(tmp_path.iterdir()) == []


def test_a_bundle_gone_or_not_yours_is_explained(tmp_path):
    with pytest.raises(MagicUsageError, match="cannot read job cs-0123abcd4567's inputs bundle: you have no input"):
        promote(FakeClient(_job(), bundle=None), "cs-0123abcd4567", "model", directory=tmp_path)
    with pytest.raises(MagicUsageError, match="came back with another sha256"):
        promote(FakeClient(_job(), bundle=b"other"), "cs-0123abcd4567", "model", directory=tmp_path)
    assert list(tmp_path.iterdir()) == []


# -- the magic and the command line ----------------------------------------------------------------
@pytest.fixture
def shell():
    sh = InteractiveShell()
    yield sh
    sh.clear_instance()


def test_the_magic_writes_and_says_where(shell, tmp_path, capsys):
    shell.register_magics(ClusterMagics(shell, client=FakeClient(_job())))
    folder = tmp_path / "my assets"
    result = shell.run_cell(f'%cluster promote cs-0123abcd4567 --asset model --partitions weekly --dir "{folder}"')
    assert result.success, result.error_in_exec
    assert (folder / "model.py").exists() and (folder / "model.inputs").read_bytes() == BUNDLE
    out = capsys.readouterr().out
    assert out.startswith(f"[cellscale] wrote {folder / 'model.py'} and model.inputs") and out.count("\n") == 1


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("promote cs-0123abcd4567", "%cluster promote: the following arguments are required: --asset"),
        ("promote --asset model", "the following arguments are required: ID"),
        ("promote cs-1 --asset model --partitions yearly", "invalid choice: 'yearly'"),
        ("promote cs-1 --asset model --part daily", "unrecognized arguments: --part daily"),
        ("promote cs-1 --asset model --dir 'unclosed", "cannot read the %cluster promote line"),
        ("promote cs-1 --asset my-model", "--asset 'my-model' cannot name an asset"),
    ],
)
def test_the_magic_names_what_was_typed(shell, line, message):
    client = FakeClient(_job())
    shell.register_magics(ClusterMagics(shell, client=client))
    result = shell.run_cell(f"%cluster {line}")
    assert not result.success and message in str(result.error_in_exec)
    assert client.calls == []


def test_the_command_line_verb(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli.Client, "from_env", classmethod(lambda cls: FakeClient(_job(Phase.FAILED))))
    assert cli.main(["promote", "cs-0123abcd4567", "--asset", "model", "--dir", str(tmp_path)]) == 2
    assert "cellscale: job cs-0123abcd4567 is FAILED" in capsys.readouterr().err
    monkeypatch.setattr(cli.Client, "from_env", classmethod(lambda cls: FakeClient(_job())))
    argv = ["promote", "cs-0123abcd4567", "--asset", "model", "--partitions", "daily", "--deps", "a,b"]
    assert cli.main([*argv, "--dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {tmp_path / 'model.py'}")
    assert 'deps=["a", "b"]' in (tmp_path / "model.py").read_text()
