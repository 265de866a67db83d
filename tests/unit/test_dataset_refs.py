"""`--data`: how a dataset is named on the %%cluster line, stored in the spec and resolved
against the tenancy's registered datasets."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cellscale.magicargs import MagicUsageError, parse_line
from cellscale.spec import DatasetRef, JobSpec
from cellscale_hub.routing import UnknownName, _resolved
from cellscale_hub.tenancy import Tenancy


@pytest.mark.parametrize(
    ("text", "name", "url", "version"),
    [
        ("bars", "bars", None, None),
        ("bars=s3://md/bars/2024@v42", "bars", "s3://md/bars/2024", "v42"),
        ("bars=s3://md/bars/2024", "bars", "s3://md/bars/2024", None),
        ("t=sftp://me@host/data/ticks", "t", "sftp://me@host/data/ticks", None),  # an @ before the last slash
        ("t=sftp://me@host/data/ticks@sha256:ab12", "t", "sftp://me@host/data/ticks", "sha256:ab12"),
        ("local=/scratch/md/bars@2026-12-01", "local", "/scratch/md/bars", "2026-12-01"),
    ],
)
def test_a_dataset_is_parsed_as_the_magic_spells_it(text, name, url, version):
    ref = DatasetRef.parse(text)
    assert (ref.name, ref.url, ref.version) == (name, url, version)
    assert DatasetRef.parse(ref.words()) == ref


@pytest.mark.parametrize(
    "text",
    ["bars=relative/path@v1", "bars=s3://md/ba rs@v1", "bars=s3://md/bars@v 1", "ba/rs=s3://md/bars", "bars=s3://x@"],
)
def test_a_bad_dataset_is_refused(text):
    with pytest.raises(ValidationError):
        JobSpec(source="pass", datasets=[text])


def test_a_dataset_named_twice_is_refused():
    with pytest.raises(ValidationError, match="'bars' is named twice"):
        JobSpec(source="pass", datasets=["bars", "bars=s3://md/bars@v1"])


def test_the_code_key_changes_with_the_version_it_reads():
    v1 = JobSpec(source="pass", datasets=["bars=s3://md/bars@v1"])
    v2 = JobSpec(source="pass", datasets=["bars=s3://md/bars@v2"])
    assert v1.code_key() != v2.code_key()
    assert v1.code_key() == JobSpec(source="pass", datasets=["bars=s3://md/bars@v1"]).code_key()


def test_the_magic_takes_datasets_comma_separated_or_repeated():
    args = parse_line("--gpus 2 --data bars=s3://md/bars/2024@v42,ticks --data book=s3://md/book --data-mode stream")
    spec = args.to_spec("pass")
    assert [d.words() for d in spec.datasets] == ["bars=s3://md/bars/2024@v42", "ticks", "book=s3://md/book"]
    assert spec.data_mode == "stream"


def test_the_magic_refuses_a_bad_data_mode():
    with pytest.raises(MagicUsageError, match="--data-mode"):
        parse_line("--data bars --data-mode cache")


TENANCY = Tenancy.model_validate(
    {
        "sites": {"dca": {}},
        "datasets": {
            "bars": {
                "site": "dca",
                "size_gb": 2,
                "url": "s3://md/bars/2024",
                "version": "v41",
                "storage_options": {"endpoint_url": "http://s3.dca.internal"},
            },
            "hint": {"site": "dca"},
        },
        "flavors": {"local": {"backend": "local"}},
        "cohorts": {"firm": {}},
        "cluster_queues": {"desk-a": {"cohort": "firm", "quotas": {"local": {"nominal": 2}}}},
        "tenants": {"desk-a": {"queues": {"default": {"cluster_queue": "desk-a"}}}},
    }
)


def test_a_registered_dataset_is_stored_with_its_url_version_and_options():
    spec = _resolved(TENANCY, JobSpec(source="pass", datasets=["bars", "hint"]))
    bars, hint = spec.datasets
    assert (bars.url, bars.version, bars.storage_options) == (
        "s3://md/bars/2024",
        "v41",
        {"endpoint_url": "http://s3.dca.internal"},
    )
    assert hint.url is None  # a placement hint only: nothing to stage


def test_a_job_may_name_another_version_of_a_registered_dataset():
    spec = _resolved(TENANCY, JobSpec(source="pass", datasets=[DatasetRef(name="bars", version="v42")]))
    assert (spec.datasets[0].url, spec.datasets[0].version) == ("s3://md/bars/2024", "v42")


def test_an_unknown_dataset_is_refused_with_what_to_type():
    with pytest.raises(UnknownName, match=r"unknown dataset 'ticks'; registered datasets: bars, hint; or give its URL"):
        _resolved(TENANCY, JobSpec(source="pass", datasets=["ticks"]))


def test_a_dataset_given_by_url_needs_no_registration():
    spec = _resolved(TENANCY, JobSpec(source="pass", datasets=["ticks=s3://md/ticks@v3"]))
    assert spec.datasets[0].words() == "ticks=s3://md/ticks@v3"
