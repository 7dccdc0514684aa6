import json

import pytest

from runtime.errors import BadRequest
from runtime.landing import Record, parse_console_lines, topic_dir, write_records


def test_seed_lines_parse_including_the_empty_key() -> None:
    assert parse_console_lines(["1--spagety", "2--pizza", "--pasta"]) == [
        Record("1", "spagety"),
        Record("2", "pizza"),
        Record("", "pasta"),
    ]


def test_bash_echo_without_escapes_still_gives_one_record_per_line() -> None:
    assert parse_console_lines([r"1--john\n2--adam"]) == [Record("1", "john"), Record("2", "adam")]
    assert parse_console_lines([r"1--a\nb"], split_escaped_newlines=False) == [Record("1", r"a\nb")]


def test_the_value_may_contain_the_separator() -> None:
    assert parse_console_lines(["k--a--b"]) == [Record("k", "a--b")]


def test_a_line_without_separator_rejects_the_whole_input() -> None:
    with pytest.raises(BadRequest, match="line 2"):
        parse_console_lines(["1--a", "oops", "3--c"])


def test_write_records_is_one_atomic_json_lines_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = write_records(tmp_path, "order", [Record("1", "a"), Record("", "b")])
    assert path is not None and path.parent == topic_dir(tmp_path, "order")
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left behind
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["key"], r["value"], r["seq"]) for r in lines] == [("1", "a", 0), ("", "b", 1)]
    assert lines[0]["ts"] == lines[1]["ts"]
    assert write_records(tmp_path, "order", []) is None


@pytest.mark.parametrize("topic", ["", "..", "a/b", "sp ace"])
def test_bad_topic_names(tmp_path, topic: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadRequest):
        topic_dir(tmp_path, topic)
