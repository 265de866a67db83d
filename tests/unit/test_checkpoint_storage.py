"""cellscale.checkpoint_storage: files hashed as they are written, aligned direct writes, the
split of a rank's items into files, and the host copy async saves reuse."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest
import torch

from cellscale import checkpoint_storage
from cellscale.checkpoint_storage import ALIGN, CHUNK, PIECE, DiskFile, Staging, _open_for_writing

SIZES = {
    "nothing": [],
    "one byte": [1],
    "under a block": [ALIGN - 1],
    "one block": [ALIGN],
    "a chunk": [CHUNK],
    "past a chunk": [CHUNK + 1],
    "mixed": [PIECE - 1, 3, 0, 2 * CHUNK + 5, 17],
    "many small": [7] * 1000,
}


def refuse_direct_io(monkeypatch) -> None:
    """Make opening with O_DIRECT fail as it does on filesystems without it."""
    real_open = os.open

    def open_(path, flags, mode=0o777):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", open_)


@pytest.mark.parametrize("direct", [True, False], ids=["O_DIRECT", "buffered"])
@pytest.mark.parametrize("sizes", SIZES.values(), ids=SIZES.keys())
def test_a_disk_file_holds_exactly_what_was_written_and_knows_its_sha256(tmp_path, monkeypatch, sizes, direct):
    if not direct:
        refuse_direct_io(monkeypatch)
    chunks = [os.urandom(size) for size in sizes]
    path = tmp_path / "file"
    with DiskFile(str(path)) as file:
        if not direct:
            assert not file._direct
        for chunk in chunks:
            assert file.write(memoryview(chunk)) == len(chunk)
        assert file.tell() == sum(sizes)
    data = b"".join(chunks)
    assert path.read_bytes() == data
    assert file.digest() == (len(data), hashlib.sha256(data).hexdigest())


def test_o_direct_refused_falls_back_to_buffered_writes(tmp_path, monkeypatch):
    refuse_direct_io(monkeypatch)
    fd, direct = _open_for_writing(str(tmp_path / "file"))
    os.close(fd)
    assert not direct


def test_a_failed_write_closes_the_file_and_returns_its_buffer(tmp_path, monkeypatch):
    def full(_fd, _data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint_storage, "_write_all", full)
    free = len(checkpoint_storage._BUFFERS._free)
    with pytest.raises(OSError, match="No space"), DiskFile(str(tmp_path / "file")) as file:
        file.write(b"x" * CHUNK)
    assert len(checkpoint_storage._BUFFERS._free) == max(free, 1)  # taken from the pool (or new), given back


def test_a_ranks_items_are_split_into_files_of_about_equal_bytes(monkeypatch):
    from torch.distributed.checkpoint.default_planner import create_default_local_save_plan

    monkeypatch.setattr(checkpoint_storage, "SPLIT_BYTES", 1000)
    state = {f"t{i}": torch.zeros(n) for i, n in enumerate([1000, 500, 400, 300, 200, 100])}  # 10 KB of float32
    items = create_default_local_save_plan(state, is_coordinator=True).items
    files = checkpoint_storage._split(items)
    assert len(files) == checkpoint_storage.FILES_PER_RANK
    assert sorted(item.index.fqn for file in files for item in file) == sorted(state)
    loads = [sum(map(checkpoint_storage._item_bytes, file)) for file in files]
    assert sorted(loads) == [2000, 2000, 2000, 4000]  # the largest tensor alone; the rest spread evenly

    monkeypatch.setattr(checkpoint_storage, "SPLIT_BYTES", 64 * 2**20)
    assert len(checkpoint_storage._split(items)) == 1  # a small state stays in one file
    assert checkpoint_storage._split([]) == [[]]  # a rank with nothing to write still writes its file


def test_staging_reuses_its_host_copy_and_takes_plain_values_as_they_are():
    staging = Staging()
    model = torch.nn.Linear(3, 2)
    state = {"model": model, "w": torch.arange(4.0), "lr": 0.1}
    first = staging.stage(state)
    assert set(first["model"]) == {"weight", "bias"}  # a module is staged as its state dict
    copy = first["w"]
    assert torch.equal(copy, state["w"]) and copy.data_ptr() != state["w"].data_ptr()

    state["w"].add_(1)
    state["lr"] = 0.2
    second = staging.stage(state)
    assert second["w"] is copy and torch.equal(copy, torch.arange(4.0) + 1)  # the same memory, new values
    assert second["lr"] == 0.2
    assert torch.equal(second["model"]["weight"], model.weight.detach())


def test_staging_makes_a_new_copy_when_the_layout_changes():
    staging = Staging()
    first = staging.stage({"w": torch.zeros(4)})["w"]
    reshaped = staging.stage({"w": torch.ones(2, 2)})["w"]  # the old copy would take this by broadcasting
    assert reshaped is not first and reshaped.shape == (2, 2) and torch.equal(reshaped, torch.ones(2, 2))
    grown = staging.stage({"w": torch.ones(2, 2), "momentum": torch.full((3,), 5.0)})
    assert torch.equal(grown["momentum"], torch.full((3,), 5.0))
    assert staging.stage({"w": torch.ones(2, 2).double(), "momentum": torch.zeros(3)})["w"].dtype == torch.float64
