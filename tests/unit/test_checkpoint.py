"""cellscale.checkpoint on CPU torch: local paths and memory://, one process and two gloo ranks."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import fsspec
import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.api import CheckpointException

from cellscale import checkpoint_storage
from cellscale.checkpoint import MANIFEST, Checkpointer, CheckpointError, FileEntry, Manifest

# DCP says so on every save and load without a process group; single-process use is intended here
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@dataclass
class Point:  # a plain Python object for `extra`
    x: int
    y: int


def quiet(_checkpoint) -> None:
    """A notifier for tests that do not look at notifications."""


def model_state(seed: int) -> dict:
    torch.manual_seed(seed)
    return {"model": torch.nn.Linear(4, 3), "w": torch.randn(64), "step_tensor": torch.tensor(seed)}


def blank_state() -> dict:
    return {"model": torch.nn.Linear(4, 3), "w": torch.zeros(64), "step_tensor": torch.tensor(0)}


def assert_same(loaded: dict, saved: dict) -> None:
    assert torch.equal(loaded["w"], saved["w"]) and torch.equal(loaded["step_tensor"], saved["step_tensor"])
    for name, value in saved["model"].state_dict().items():
        assert torch.equal(loaded["model"].state_dict()[name], value)


@pytest.fixture
def memory_url():
    url = f"memory://cellscale-test-{uuid.uuid4().hex}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


@pytest.fixture(params=["local", "memory"])
def url(request, tmp_path, memory_url):
    return str(tmp_path / "ckpt") if request.param == "local" else memory_url


def put(fs, path: str, data: bytes) -> None:
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, data)


def shard(ckpt: Checkpointer, step: int) -> str:
    return f"{ckpt.root}/step-{step}/dcp/__0_0.distcp"


def test_round_trip_with_a_manifest_of_every_file(url):
    ckpt = Checkpointer(url, notifier=quiet)
    assert ckpt.load(blank_state()).step is None  # nothing to resume from yet
    saved = model_state(1)
    committed = ckpt.save(7, saved, async_=False).result()

    template = blank_state()
    resume = ckpt.load(template)
    assert resume.step == 7 and resume.skipped == [] and resume.checkpoint.verified
    assert_same(template, saved)
    manifest = Manifest.model_validate_json(ckpt.fs.cat_file(f"{ckpt.root}/step-7/{MANIFEST}"))
    assert manifest.step == 7 and manifest.world_size == 1 and manifest.versions["torch"] == torch.__version__
    assert sorted(manifest.files) == ["dcp/.metadata", "dcp/__0_0.distcp"]
    assert committed.size_bytes == sum(entry.size for entry in manifest.files.values())
    assert committed.url.endswith("/step-7") and committed.write_s >= 0
    assert [c.step for c in ckpt.list(verify=True)] == [7] and ckpt.list()[0].verified is None


def test_async_save_returns_before_the_commit_and_matches_a_sync_save(tmp_path):
    gate = threading.Event()
    asynchronous = Checkpointer(str(tmp_path / "async"), notifier=lambda _: gate.wait(10))
    synchronous = Checkpointer(str(tmp_path / "sync"), notifier=quiet)
    saved = model_state(2)
    expected = {"w": saved["w"].clone(), "step_tensor": saved["step_tensor"].clone(), "model": saved["model"]}
    synchronous.save(3, saved, async_=False)

    future = asynchronous.save(3, saved)
    assert not future.done()  # held at the notifier, after the commit: save() did not wait for it
    saved["w"].add_(1.0)  # training goes on; the checkpoint keeps the values save() was given
    gate.set()
    committed = asynchronous.wait()
    assert future.result() == committed and committed.step == 3

    from_async, from_sync = blank_state(), blank_state()
    asynchronous.load(from_async)
    synchronous.load(from_sync)
    assert_same(from_async, expected)
    assert_same(from_sync, expected)


def test_a_crashed_write_is_invisible_and_removed_by_the_next_commit(url):
    ckpt = Checkpointer(url, notifier=quiet)
    ckpt.save(4, model_state(4), async_=False)
    fs = ckpt.fs
    put(fs, f"{ckpt.root}/.tmp-step-5-dead/dcp/__0_0.distcp", b"half a shard")  # killed mid-write
    put(fs, f"{ckpt.root}/step-6/dcp/__0_0.distcp", b"moved, but no manifest")  # killed before commit

    assert [c.step for c in ckpt.list()] == [4]
    found = ckpt.latest_verified()
    assert found.step == 4 and found.skipped == []

    saved = model_state(6)
    ckpt.save(6, saved, async_=False)
    template = blank_state()
    assert ckpt.load(template).step == 6
    assert_same(template, saved)
    assert not fs.exists(f"{ckpt.root}/.tmp-step-5-dead")
    assert sorted(fs.find(f"{ckpt.root}/step-6")) == sorted(
        f"{ckpt.root}/step-6/{name}" for name in (MANIFEST, "dcp/.metadata", "dcp/__0_0.distcp")
    )


def test_files_are_hashed_as_they_are_written_with_no_read_back(url, monkeypatch):
    monkeypatch.setattr(checkpoint_storage, "SPLIT_BYTES", 64)  # a small state, still written as 4 files
    reads = []
    sha256 = Checkpointer._sha256
    monkeypatch.setattr(Checkpointer, "_sha256", lambda self, path: reads.append(path) or sha256(self, path))
    ckpt = Checkpointer(url, notifier=quiet)
    saved = model_state(1)
    ckpt.save(1, saved, extra={"note": "x"}).result()
    assert reads == []  # nothing read back to hash it

    manifest = Manifest.model_validate_json(ckpt.fs.cat_file(f"{ckpt.root}/step-1/{MANIFEST}"))
    shards = [f"dcp/__0_{n}.distcp" for n in range(checkpoint_storage.FILES_PER_RANK)]
    assert sorted(manifest.files) == sorted(["dcp/.metadata", "extra-0.pkl", *shards])
    for name, entry in manifest.files.items():
        data = ckpt.fs.cat_file(f"{ckpt.root}/step-1/{name}")
        assert entry == FileEntry(size=len(data), sha256=hashlib.sha256(data).hexdigest()), name
    template = blank_state()
    assert ckpt.load(template).extra == {"note": "x"}
    assert_same(template, saved)
    assert len(reads) == len(manifest.files)  # verified before loading


def disk_full(_fd, _data) -> None:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_a_write_that_fails_midway_commits_nothing(tmp_path, monkeypatch, async_):
    ckpt = Checkpointer(str(tmp_path / "ckpt"), notifier=quiet)
    ckpt.save(1, model_state(1), async_=False)
    monkeypatch.setattr(checkpoint_storage, "_write_all", disk_full)
    with pytest.raises(CheckpointException) as failed:  # DCP's, raised as it is
        ckpt.save(2, model_state(2), async_=async_).result()
    assert "No space left on device" in str(failed.value)
    monkeypatch.undo()

    assert [c.step for c in ckpt.list()] == [1] and ckpt.latest_verified().step == 1
    [leftover] = [name for name in os.listdir(ckpt.root) if name != "step-1"]
    assert leftover.startswith(".tmp-step-2-")
    ckpt.save(3, model_state(3), async_=async_).result()
    assert sorted(os.listdir(ckpt.root)) == ["step-1", "step-3"]


def test_a_file_the_manifest_would_not_name_stops_the_commit(url, monkeypatch):
    written = Checkpointer._written

    def and_a_stray_file(self, writer, tmp, blob):
        put(self.fs, f"{tmp}/dcp/stray.bin", b"written past the hashing writer")
        return written(self, writer, tmp, blob)

    monkeypatch.setattr(Checkpointer, "_written", and_a_stray_file)
    ckpt = Checkpointer(url, notifier=quiet)
    with pytest.raises(CheckpointError, match=r"unhashed \['dcp/stray.bin'\], missing \[\]"):
        ckpt.save(1, model_state(1), async_=False)
    assert ckpt.list() == []


def test_async_saves_follow_an_optimizer_whose_state_appears_at_its_first_step(tmp_path):
    def trained(steps: int) -> dict:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(steps):
            model(torch.randn(8, 4)).sum().backward()
            optim.step()
            optim.zero_grad()
        return {"model": model, "optim": optim}

    ckpt = Checkpointer(str(tmp_path / "ckpt"), notifier=quiet)
    state = trained(0)
    ckpt.save(0, state).result()  # no momentum buffers yet: the host copy has none
    for step in (1, 2):
        model, optim = state["model"], state["optim"]
        model(torch.randn(8, 4)).sum().backward()
        optim.step()
        optim.zero_grad()
        ckpt.save(step, state).result()

    template = trained(1)  # a step taken, so the template has momentum buffers to load into
    assert ckpt.load(template).step == 2
    for loaded, saved in zip(template["model"].parameters(), state["model"].parameters(), strict=True):
        assert torch.equal(loaded, saved)
        momentum = template["optim"].state[loaded]["momentum_buffer"]
        assert torch.equal(momentum, state["optim"].state[saved]["momentum_buffer"])


def flip_a_byte(fs, path: str) -> None:
    data = bytearray(fs.cat_file(path))
    data[len(data) // 2] ^= 0xFF
    fs.pipe_file(path, bytes(data))


def truncate(fs, path: str) -> None:
    fs.pipe_file(path, fs.cat_file(path)[:100])


@pytest.mark.parametrize("damage, reason", [(flip_a_byte, "does not match its sha256"), (truncate, "bytes")])
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_and_says_why(url, damage, reason):
    ckpt = Checkpointer(url, notifier=quiet)
    good = model_state(1)
    ckpt.save(1, good, async_=False)
    ckpt.save(2, model_state(2), async_=False)
    damage(ckpt.fs, shard(ckpt, 2))

    template = blank_state()
    resume = ckpt.load(template)
    assert resume.step == 1
    assert_same(template, good)
    [skipped] = resume.skipped
    assert skipped.step == 2 and skipped.url.endswith("/step-2")
    assert "dcp/__0_0.distcp" in skipped.reason and reason in skipped.reason
    assert [(c.step, c.verified) for c in ckpt.list(verify=True)] == [(1, True), (2, False)]


def test_a_missing_or_broken_manifest_entry_is_reported(url):
    ckpt = Checkpointer(url, notifier=quiet)
    ckpt.save(1, model_state(1), async_=False)
    ckpt.save(2, model_state(2), async_=False)
    ckpt.save(3, model_state(3), async_=False)
    ckpt.fs.rm(shard(ckpt, 3))
    ckpt.fs.pipe_file(f"{ckpt.root}/step-2/{MANIFEST}", b'{"step": 2, "files": ')

    resume = ckpt.latest_verified()
    assert resume.step == 1
    assert [(s.step, s.reason) for s in resume.skipped] == [
        (3, "dcp/__0_0.distcp is missing"),
        (2, "unreadable manifest (ValidationError)"),
    ]


def test_retention_keeps_the_last_k(url):
    ckpt = Checkpointer(url, keep=2, notifier=quiet)
    for step in (10, 20, 30, 40):
        ckpt.save(step, model_state(step), async_=False)
    assert [c.step for c in ckpt.list()] == [30, 40]
    assert sorted(name.rsplit("/", 1)[-1] for name in ckpt.fs.ls(ckpt.root, detail=False)) == ["step-30", "step-40"]


def test_each_commit_is_one_json_line_in_the_attempts_checkpoints_log(tmp_path, monkeypatch):
    monkeypatch.setenv("CELLSCALE_JOB_DIR", str(tmp_path / "job"))
    monkeypatch.setenv("CELLSCALE_ATTEMPT", "2")
    ckpt = Checkpointer(str(tmp_path / "ckpt"))
    first = ckpt.save(5, model_state(5), async_=False).result()
    ckpt.save(6, model_state(6)).result()

    lines = (tmp_path / "job" / "attempts" / "2" / "checkpoints.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [5, 6]
    assert json.loads(lines[0]) == first.model_dump(exclude={"verified"})
    assert json.loads(lines[1]).keys() == {"step", "url", "size_bytes", "wall_time", "write_s"}


def test_a_custom_notifier_gets_each_commit_and_its_failure_does_not_fail_the_save(tmp_path):
    seen = []
    Checkpointer(str(tmp_path / "a"), notifier=seen.append).save(1, model_state(1)).result()
    assert [(c.step, c.url) for c in seen] == [(1, str(tmp_path / "a" / "step-1"))]

    def broken(_checkpoint):
        raise OSError("the notifier's disk is gone")

    assert Checkpointer(str(tmp_path / "b"), notifier=broken).save(1, model_state(1)).result().step == 1


def test_extra_state_numpy_and_python_objects(url):
    ckpt = Checkpointer(url, notifier=quiet)
    rng = np.random.default_rng(7)
    extra = {
        "array": np.arange(6.0).reshape(2, 3),
        "rng": rng.bit_generator.state,
        "point": Point(1, 2),
        "history": [0.5, 0.25],
    }
    ckpt.save(1, model_state(1), extra=extra).result()
    extra["history"].append(0.125)  # pickled at save(): later changes are not in the checkpoint

    restored = ckpt.load(blank_state()).extra
    np.testing.assert_array_equal(restored["array"], np.arange(6.0).reshape(2, 3))
    assert restored["point"] == Point(1, 2) and restored["history"] == [0.5, 0.25]
    resumed = np.random.default_rng()
    resumed.bit_generator.state = restored["rng"]
    assert resumed.random() == rng.random()


def two_ranks(rank: int, store: str, root: str) -> None:
    """One rank of the gloo test: a tensor sharded by rows across the two ranks."""
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    try:
        mesh = init_device_mesh("cpu", (2,))
        full = torch.arange(16.0).reshape(8, 2)
        ckpt = Checkpointer(root, keep=2, notifier=quiet)
        ckpt.save(1, {"w": distribute_tensor(full, mesh, [Shard(0)])}, extra={"rank": rank}, async_=False)
        committed = ckpt.save(2, {"w": distribute_tensor(full * 2, mesh, [Shard(0)])}, extra={"rank": rank}).result()
        assert committed.step == 2  # every rank learns of rank 0's commit

        template = {"w": distribute_tensor(torch.zeros(8, 2), mesh, [Shard(0)])}
        resume = ckpt.load(template)
        assert resume.step == 2 and resume.extra == {"rank": rank}
        assert template["w"].to_local().shape == (4, 2)
        assert torch.equal(template["w"].full_tensor(), full * 2)
        if rank == 0:
            manifest = Manifest.model_validate_json(Path(root, "step-2", MANIFEST).read_text())
            assert manifest.world_size == 2
            assert {"dcp/__0_0.distcp", "dcp/__1_0.distcp", "extra-0.pkl", "extra-1.pkl"} <= set(manifest.files)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_two_gloo_ranks_save_and_load_sharded_state(tmp_path):
    # fork, not spawn: the children reuse this process's imported torch (a spawn re-imports it: ~10 s here)
    mp.start_processes(two_ranks, args=(str(tmp_path / "store"), str(tmp_path / "ckpt")), nprocs=2, start_method="fork")


def steps_during_an_async_save(rank: int, store: str, root: str) -> None:
    """One rank of a training loop that keeps stepping (maybe_save agrees every step) while rank
    0's commit of an async save is slow, so the two threads' collectives overlap."""
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=20)
    )
    try:
        ckpt = Checkpointer(root, keep=2, notifier=lambda _checkpoint: time.sleep(1.0))  # rank 0 commits slowly
        state = {"w": torch.zeros(4)}
        for step in range(1, 13):
            state["w"] += step
            ckpt.maybe_save(step, state, every=5)
        assert ckpt.wait().step == 10
        assert ckpt.load({"w": torch.zeros(4)}).step == 10
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_steps_go_on_while_an_async_save_commits(tmp_path):
    # found on Slurm with a 160 MB state: the per-step agreement and the background commit shared
    # one gloo group and their messages crossed (a hang, or "Received data size doesn't match")
    mp.start_processes(
        steps_during_an_async_save,
        args=(str(tmp_path / "store"), str(tmp_path / "ckpt")),
        nprocs=2,
        start_method="fork",
    )
