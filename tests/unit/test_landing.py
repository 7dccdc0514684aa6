import json
import logging
import os
from pathlib import Path

import pytest

from runtime.errors import BadRequest
from runtime.landing import CLOCK_FILE, Record, parse_console_bytes, parse_console_lines, topic_dir, write_records


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
    names = [p.name for p in path.parent.iterdir() if p.name != CLOCK_FILE]
    assert names == [path.name]  # no temporary file left behind
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["key"], r["value"]) for r in lines] == [("1", "a"), ("", "b")]
    assert lines[1]["seq"] == lines[0]["seq"] + 1 and lines[0]["ts"] == lines[1]["ts"]
    assert write_records(tmp_path, "order", []) is None


def test_files_written_in_one_millisecond_still_order_their_records(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``seq`` started at 0 in every file: two writes in the same millisecond gave equal ``(ts, seq)``, and
    "latest value per key" kept either value."""
    order = []
    for n in range(200):
        path = write_records(tmp_path, "customer", [Record("1", f"v{n}")])
        assert path is not None
        line = json.loads(path.read_text())
        order.append((line["ts"], line["seq"]))
    assert order == sorted(order) and len(set(order)) == len(order)  # each later write orders after


@pytest.mark.parametrize("topic", ["", "..", "a/b", "sp ace", "order\n"])  # "$" matched before a last newline
def test_bad_topic_names(tmp_path, topic: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(BadRequest):
        topic_dir(tmp_path, topic)


def test_console_bytes_parse_like_lines_including_crlf_utf8_and_a_bom() -> None:
    data = "\ufeff1--j\u00f6rg\r\n2--\u6771\u4eac\n\n3--a\\n4--b\n".encode()
    assert parse_console_bytes(data) == [
        Record("1", "j\u00f6rg"),
        Record("2", "\u6771\u4eac"),
        Record("3", "a"),
        Record("4", "b"),
    ]
    assert parse_console_bytes(b"1::x", "::") == [Record("1", "x")]
    assert parse_console_bytes(b"") == []
    two_files = "\ufeff1--a\n".encode() + "\ufeff2--b\n".encode()  # `cat a.txt b.txt | riqr produce`
    assert parse_console_bytes(two_files) == [Record("1", "a"), Record("2", "b")]  # not key "\ufeff2"


def test_invalid_utf8_names_the_line_and_byte_offset() -> None:
    data = b"1--ok\n2--fine\n3--bad\xff\xfe\n4--never"
    with pytest.raises(BadRequest) as refused:
        parse_console_bytes(data)
    assert refused.value.details == {"line": 3, "offset": data.index(b"\xff")}
    assert "line 3" in refused.value.message and "byte offset 20" in refused.value.message
    with pytest.raises(BadRequest, match="line 1"):
        parse_console_bytes(b"\xc3")  # a sequence cut short at the end of the input


def test_a_separator_error_in_bytes_still_names_its_line() -> None:
    with pytest.raises(BadRequest, match="line 2"):
        parse_console_bytes(b"1--a\r\noops\r\n")


def _files(directory: Path) -> list[str]:
    """The topic's files, but for its hidden clock (``CLOCK_FILE``), which holds no records."""
    return sorted(p.name for p in directory.iterdir() if p.name != CLOCK_FILE) if directory.exists() else []


@pytest.mark.parametrize("failure", [OSError("disk full"), KeyboardInterrupt()])
def test_a_failed_write_leaves_no_temporary_file(tmp_path, monkeypatch, failure) -> None:  # type: ignore[no-untyped-def]
    def fail(_fd: int) -> None:
        raise failure

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(type(failure)):
        write_records(tmp_path, "order", [Record("1", "a")])
    assert _files(topic_dir(tmp_path, "order")) == []


def test_an_unencodable_record_is_a_bad_request_and_writes_nothing(tmp_path) -> None:  # type: ignore[no-untyped-def]
    lone_surrogate = b"caf\xe9".decode("utf-8", errors="surrogateescape")
    with pytest.raises(BadRequest, match="record 2"):
        write_records(tmp_path, "order", [Record("1", "a"), Record("2", lone_surrogate)])
    assert _files(topic_dir(tmp_path, "order")) == []


def _seqs(path: Path) -> list[tuple[int, int]]:
    return [(json.loads(line)["ts"], json.loads(line)["seq"]) for line in path.read_text().splitlines()]


def test_a_clock_stepped_back_cannot_make_a_later_write_lose(tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """Latest per key is by (ts, seq), both from the wall clock: a clock stepped back (NTP, a VM resumed)
    made the next write of a key order before the one it replaced, and the store kept the old value."""
    now = [1_700_000_000_000_000_000]
    monkeypatch.setattr("runtime.landing.time.time_ns", lambda: now[0])
    first = write_records(tmp_path, "order", [Record("k", "old"), Record("j", "x")])
    now[0] -= 5_000_000_000  # five seconds back
    with caplog.at_level(logging.WARNING, logger="runtime.landing"):
        second = write_records(tmp_path, "order", [Record("k", "new")])
    assert "topic order: its clock is 5.0 s ahead of this machine's" in caplog.text  # said, not silent
    assert first is not None and second is not None
    assert max(_seqs(first)) < min(_seqs(second))  # (ts, seq) of the later write is the larger
    assert first.name[:15] <= second.name[:15]  # its file's time is not before the first's either
    (tmp_path / "data" / "order" / ".riqr-clock").write_bytes(b"")  # lost (a crash while it was written)
    third = write_records(tmp_path, "order", [Record("k", "newer")])
    assert third is not None and max(_seqs(second)) < min(_seqs(third))  # bounded by the files' names
    now[0] += 3_600_000_000_000  # the clock well ahead again: its own time, not the bound's
    fourth = write_records(tmp_path, "order", [Record("k", "newest")])
    assert fourth is not None and _seqs(fourth)[0] == (now[0] // 1_000_000, now[0])


def test_writers_at_the_same_instant_take_turns_on_the_topics_clock(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import threading

    monkeypatch.setattr("runtime.landing.time.time_ns", lambda: 1_700_000_000_000_000_000)  # a clock that never moves
    files: list[Path] = []

    def write() -> None:
        for _ in range(5):
            written = write_records(tmp_path, "order", [Record(str(i), "v") for i in range(3)])
            assert written is not None
            files.append(written)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seqs = [seq for f in files for _, seq in _seqs(f)]
    assert len(seqs) == 60 and len(set(seqs)) == 60
    assert [p.name for p in topic_dir(tmp_path, "order").iterdir() if p.name.startswith(".")] == [".riqr-clock"]


def test_a_failed_directory_sync_says_the_records_are_written_already(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The file is in the topic once renamed: an error that read as "nothing written" would have the
    caller write the records again, twice in the topic."""

    def fail(_path: Path) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("runtime.landing.fsync_directory", fail)
    with pytest.raises(OSError, match="do not write them again") as raised:
        write_records(tmp_path, "order", [Record("1", "a")])
    assert raised.value.errno == 5
    assert len(_files(topic_dir(tmp_path, "order"))) == 1


T0 = 1_700_000_000_000_000_000


def test_the_topics_clock_is_bounded_by_its_files_after_a_failed_sync_or_a_power_loss(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A review of the change: the clock moved only after the directory sync, so a file renamed into place
    whose sync failed was not bounded by it; and a clock file a power loss set back (it is not synced) was
    trusted over the files' names."""
    now = [T0]
    monkeypatch.setattr("runtime.landing.time.time_ns", lambda: now[0])
    write_records(tmp_path, "t", [Record("k", "a")])
    stale = (topic_dir(tmp_path, "t") / CLOCK_FILE).read_bytes()
    now[0] += 10_000_000_000

    def fail(_path: Path) -> None:
        raise OSError(5, "Input/output error")

    with monkeypatch.context() as m:
        m.setattr("runtime.landing.fsync_directory", fail)
        with pytest.raises(OSError):
            write_records(tmp_path, "t", [Record("k", "b")])  # in the topic all the same
    [second] = [p for p in topic_dir(tmp_path, "t").glob("*.json") if json.loads(p.read_text())["value"] == "b"]
    now[0] -= 5_000_000_000  # stepped back
    third = write_records(tmp_path, "t", [Record("k", "c")])
    assert third is not None and min(_seqs(third)) > max(_seqs(second))
    (topic_dir(tmp_path, "t") / CLOCK_FILE).write_bytes(stale)  # what a power loss may leave
    fourth = write_records(tmp_path, "t", [Record("k", "d")])
    assert fourth is not None and min(_seqs(fourth)) > max(_seqs(third))


def test_a_file_system_without_locks_still_takes_records(tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    def no_locks(_fd: int, _op: int) -> None:
        raise OSError(37, "No locks available")

    monkeypatch.setattr("runtime.landing.fcntl.flock", no_locks)
    first = write_records(tmp_path, "t", [Record("k", "a")])
    with caplog.at_level(logging.WARNING, logger="runtime.landing"):
        second = write_records(tmp_path, "t", [Record("k", "b")])
    assert first is not None and second is not None and min(_seqs(second)) > max(_seqs(first))
    assert "cannot lock its clock" in caplog.text


def test_a_clock_that_cannot_be_recorded_does_not_fail_a_written_file(tmp_path, monkeypatch, caplog) -> None:  # type: ignore[no-untyped-def]
    """The clock is recorded after the file is in the topic: an error there (a full disk) reported as a
    failed write would have the caller write the records again."""

    def full(_fd: int, _data: bytes, _offset: int) -> int:
        raise OSError(28, "No space left on device")

    first = write_records(tmp_path, "t", [Record("k", "a")])
    monkeypatch.setattr("runtime.landing.os.pwrite", full)
    with caplog.at_level(logging.WARNING, logger="runtime.landing"):
        second = write_records(tmp_path, "t", [Record("k", "b")])
    assert first is not None and second is not None and "could not record its clock" in caplog.text
    monkeypatch.undo()
    third = write_records(tmp_path, "t", [Record("k", "c")])
    assert third is not None and min(_seqs(third)) > max(_seqs(second)) > max(_seqs(first))
