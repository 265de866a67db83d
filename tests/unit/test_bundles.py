"""Input bundles: per owner, bounded, shared explicitly, swept when no job uses them."""

import os
import time

import pytest

from cellscale_hub.bundles import BundleRefused, BundleStore


def test_bundles_are_per_owner_and_shared_explicitly(tmp_path):
    store = BundleStore(tmp_path, quota_bytes=100, grace_s=60)
    stored = store.put("alice", b"inputs")
    assert store.path("alice", stored.sha256).read_bytes() == b"inputs"
    assert store.path("bob", stored.sha256) is None
    store.share("alice", stored.sha256, "bob")
    assert store.path("bob", stored.sha256).read_bytes() == b"inputs"
    with pytest.raises(BundleRefused, match="no input bundle"):
        store.share("carol", stored.sha256, "bob")
    assert store.path("alice", "../../etc/passwd") is None  # only hashes name bundles
    assert (tmp_path / "alice").stat().st_mode & 0o777 == 0o700


def test_each_user_has_a_bound(tmp_path):
    store = BundleStore(tmp_path, quota_bytes=10, grace_s=60)
    store.put("alice", b"12345678")
    store.put("alice", b"12345678")  # the same bundle again costs nothing
    with pytest.raises(BundleRefused, match="more than the 0 MiB each user may keep"):
        store.put("alice", b"abcdefgh")
    store.put("bob", b"abcdefgh")


def test_sweep_keeps_what_jobs_use_and_what_is_young(tmp_path):
    store = BundleStore(tmp_path, quota_bytes=1000, grace_s=60)
    used, unused, young = (store.put("alice", data).sha256 for data in (b"used", b"unused", b"young"))
    for sha in (used, unused):
        os.utime(store.path("alice", sha), (time.time() - 120, time.time() - 120))
    assert store.sweep({"alice": {used}}) == 1
    assert store.path("alice", used) and store.path("alice", young) and store.path("alice", unused) is None


def test_odd_user_names_get_a_safe_folder(tmp_path):
    store = BundleStore(tmp_path, quota_bytes=100, grace_s=60)
    sha = store.put("../Weird User", b"x").sha256
    assert store.path("../Weird User", sha) is not None
    assert all(p.parent.parent == tmp_path for p in tmp_path.rglob(sha))
