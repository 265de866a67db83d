"""cellscale.wire: the one parser of the followed log's server-sent events, the one reader of
error answers, and the one JobSpec field → %%cluster flag map (shared by the magic and the
control plane's validation errors)."""

import json

import pytest
from pydantic import ValidationError

from cellscale.magicargs import PARSER
from cellscale.spec import JobSpec, LogChunk, Retries
from cellscale.wire import FLAGS, LogEvents, error_detail, explain, log_chunks, spec_field


def _event(chunk: LogChunk, event: str | None = None) -> list[str]:
    return [f"id: {chunk.next_offset}", *([f"event: {event}"] if event else []), f"data: {chunk.model_dump_json()}", ""]


def test_log_events_parse_as_the_control_plane_writes_them():
    first = LogChunk(offset=0, next_offset=9, text="[rank 0] a\n", complete=False)
    end = LogChunk(offset=9, next_offset=9, text="", complete=True)
    lines = [": keepalive", "", *_event(first), ": keepalive", "", *_event(end, "end")]
    assert list(log_chunks(lines)) == [first, end]


def test_a_chunk_split_over_data_lines_is_joined_with_newlines():
    text = json.dumps({"offset": 0, "next_offset": 4, "text": "héé\n", "complete": False}, indent=1)
    lines = [f"data:{line}" if i % 2 else f"data: {line}" for i, line in enumerate(text.splitlines())]
    assert list(log_chunks([*lines, ""])) == [LogChunk(offset=0, next_offset=4, text="héé\n", complete=False)]


def test_only_a_blank_line_ends_an_event():
    events = LogEvents()
    chunk = LogChunk(offset=3, next_offset=7, text="abc\n", complete=False)
    assert events.feed("id: 7") is None and events.feed(f"data: {chunk.model_dump_json()}") is None
    assert events.feed(": keepalive") is None  # a comment inside an event changes nothing
    assert events.feed("") == chunk
    assert events.feed("") is None  # nothing pending: a keepalive's blank line
    # a stream cut off mid-event yields nothing for it
    assert list(log_chunks([f"data: {chunk.model_dump_json()}"])) == []


def test_end_event_is_the_last_chunk_and_unknown_events_are_skipped():
    chunk = LogChunk(offset=0, next_offset=0, text="", complete=False)
    assert list(log_chunks(["event: end", f"data: {chunk.model_dump_json()}", ""]))[0].complete
    assert list(log_chunks(["event: progress", f"data: {chunk.model_dump_json()}", ""])) == []


@pytest.mark.parametrize(
    ("status", "body", "detail"),
    [
        (404, b'{"detail": "no job cs-000000000000 visible to you"}', "no job cs-000000000000 visible to you"),
        (
            422,
            '{"detail": "--gpus-per-node: Input should be less than or equal to 64"}',
            "--gpus-per-node: Input should be less than or equal to 64",
        ),
        (502, b"<html>\n  <body>Bad   Gateway</body>\n</html>", "HTTP 502: <html> <body>Bad Gateway</body> </html>"),
        (500, b"", "HTTP 500"),
        (
            422,
            b'{"detail": [{"loc": ["query"], "msg": "x"}]}',
            'HTTP 422: {"detail": [{"loc": ["query"], "msg": "x"}]}',
        ),
        (400, b'["not", "an", "object"]', 'HTTP 400: ["not", "an", "object"]'),
    ],
)
def test_error_detail_is_always_one_string(status, body, detail):
    assert error_detail(status, body) == detail


def test_every_flag_in_the_map_is_a_flag_of_the_magic():
    flags = {option for action in PARSER._actions for option in action.option_strings}
    assert set(FLAGS.values()) <= flags


@pytest.mark.parametrize(
    ("loc", "where"),
    [
        (("resources", "gpus_per_node"), "--gpus-per-node"),
        (("resources", "timeout_min"), "--time"),
        (("retries", "infrastructure"), "--retries"),
        (("env", "A"), "--env"),
        (("outputs", 0), "--outputs"),
        (("resources", "gpus"), "resources.gpus"),
        ((), ""),
    ],
)
def test_spec_fields_are_named_by_their_flag(loc, where):
    assert spec_field(loc) == where


def test_explain_names_the_flags_in_one_sentence():
    with pytest.raises(ValidationError) as refused:
        JobSpec.model_validate(
            {"source": "x", "resources": {"gpus_per_node": 999, "timeout_min": 0}, "env": {"CUDA_VISIBLE_DEVICES": "1"}}
        )
    sentence = explain(refused.value)
    assert sentence.startswith("--gpus-per-node: Input should be less than or equal to 64; --time: ")
    assert "--env: environment variable 'CUDA_VISIBLE_DEVICES' is set by cellscale itself" in sentence
    assert "Value error" not in sentence and "\n" not in sentence


def test_explain_places_a_part_of_the_spec_in_it():
    with pytest.raises(ValidationError) as refused:
        Retries(infrastructure=-1)
    assert explain(refused.value) == "--retries: Input should be greater than or equal to 0"
