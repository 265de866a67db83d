"""Job titles: one line of printable text, validated by the wire contract and made safe by the
kernel before sending; the name a title makes is a slug."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from cellscale.spec import MAX_TITLE_CHARS, JobSpec, Origin
from cellscale.titles import origin_title, printable, slug


@pytest.mark.parametrize(
    "title", ["a\nb", "tab\there", "bell\x07", "rtl \u202eoverride", "line\u2028sep", "x" * (MAX_TITLE_CHARS + 1), ""]
)
def test_the_contract_refuses_a_title_that_is_not_one_printable_line(title):
    with pytest.raises(ValidationError):
        JobSpec(source="x = 1", title=title)


def test_the_kernel_makes_any_text_a_title_the_contract_takes():
    text = "  train\n\tthe \u202emodel\x00 " + "é" * 200
    title = printable(text)
    assert title.startswith("train the model é") and title.endswith("…") and len(title) == MAX_TITLE_CHARS
    assert JobSpec(source="x = 1", title=title).title == title


def test_names_made_from_titles_are_slugs():
    assert slug("train.ipynb [12]") == "train.ipynb-12"
    assert slug("[[ ]]") is None and slug(None) is None
    assert JobSpec(source="x = 1", name=slug("ü" + "x" * 100)).name == "x" * 63


def test_a_workflow_job_is_titled_by_its_asset_and_partitions():
    run = {"tool": "dagster", "run_id": "3f2a9c1e-5b7d"}
    assert origin_title(Origin(**run, asset="model", partitions=["2026-11-30"], partition_count=1)) == (
        "model [2026-11-30]"
    )
    many = Origin(**run, asset="daily_check", partitions=["2026-08-01"], partition_count=100)
    assert origin_title(many) == "daily_check [100 partitions from 2026-08-01]"
    assert origin_title(Origin(**run, step="train_step")) == "train_step"
