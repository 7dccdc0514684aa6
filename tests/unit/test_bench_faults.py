"""The fault benchmark's bookkeeping (bench/faults.py): how answers are judged and how gaps are measured."""

from __future__ import annotations

import pytest

from bench.faults import Ledger, Read, first_correct_after, longest_dark_key, longest_gap, median_max, summarize


def _read(key: str, started: float, ended: float, correct: bool, *, status: int = 200, reader: int = 0) -> Read:
    return Read(reader, key, started, ended, status, correct)


def test_the_longest_gap_runs_between_correct_answers_and_to_both_ends_of_the_window() -> None:
    assert longest_gap([1.0, 1.5, 4.0, 4.1], opened=0.0, closed=5.0) == pytest.approx(2.5)
    assert longest_gap([0.1, 0.2], opened=0.0, closed=3.0) == pytest.approx(2.8)  # dark until the end
    assert longest_gap([], opened=2.0, closed=3.0) == pytest.approx(1.0)  # never answered
    assert longest_gap([3.0, 1.0], opened=0.0, closed=3.0) == pytest.approx(2.0)  # order of arrival does not matter


def test_a_slow_correct_answer_is_a_gap_even_without_a_503() -> None:
    reads = [_read("a", 0.0, 0.1, True), _read("a", 0.1, 2.1, True), _read("a", 2.1, 2.2, True)]
    figures = summarize(reads, opened=0.0, closed=2.2)
    assert figures["longest_gap_s"] == pytest.approx(2.0)
    assert figures["slowest_s"] == pytest.approx(2.0)
    assert figures["503"] == 0
    assert figures["answered_pct"] == pytest.approx(100.0)


def test_the_longest_gap_is_per_reader_not_across_readers() -> None:
    reads = [
        _read("a", 0.0, 0.1, True, reader=0),
        _read("a", 0.1, 3.0, False, status=503, reader=0),
        _read("a", 3.0, 3.1, True, reader=0),
        *[_read("b", t / 10, t / 10 + 0.05, True, reader=1) for t in range(31)],
    ]
    figures = summarize(reads, opened=0.0, closed=3.1)
    assert figures["longest_gap_s"] == pytest.approx(3.0)  # reader 0 waited 3 s although reader 1 was answered
    assert figures["requests"] == 34
    assert figures["503"] == 1
    assert figures["answered_pct"] == pytest.approx(100 * 33 / 34)


def test_a_key_is_dark_from_its_first_unanswered_request_to_its_next_correct_answer() -> None:
    reads = [
        _read("a", 1.0, 1.1, False, status=503),
        _read("b", 1.2, 1.3, True),
        _read("a", 1.5, 1.6, False, status=503),
        _read("a", 2.0, 2.4, True),
        _read("c", 3.0, 3.1, False, status=503),
    ]
    assert longest_dark_key(reads, closed=3.5) == pytest.approx(1.4)  # a: 1.0 .. 2.4; c only 0.5 to the end
    assert longest_dark_key(reads, closed=9.0) == pytest.approx(6.0)  # c still dark at the end


def test_the_first_correct_answer_for_a_lost_key_counts_only_requests_sent_after_the_loss() -> None:
    reads = [
        _read("lost", 0.5, 1.2, True),  # sent before the loss
        _read("kept", 1.1, 1.2, True),
        _read("lost", 1.3, 1.4, False, status=503),
        _read("lost", 1.5, 1.8, True),
    ]
    assert first_correct_after(reads, 1.0, {"lost"}) == pytest.approx(0.8)
    assert first_correct_after(reads, 1.0, {"other"}) is None


def test_the_ledger_judges_counts_against_what_was_produced_and_what_the_same_reader_saw() -> None:
    ledger = Ledger()
    ledger.produced.update(["7", "7"])
    assert ledger.record("7", 200, {"response": 2}, started=0.0, ended=0.1)
    assert not ledger.record("7", 200, {"response": 3}, started=0.1, ended=0.2)  # more than produced
    assert not ledger.record("7", 200, {"response": 1}, started=0.2, ended=0.3)  # went back for this reader
    assert ledger.record("7", 200, {"response": 1}, started=0.2, ended=0.3, reader=1)  # another reader: older is fine
    assert not ledger.record("7", 404, None, started=0.3, ended=0.4)  # seen before
    assert ledger.record("8", 404, None, started=0.3, ended=0.4)  # not produced yet: a 404 is right
    assert not ledger.record("", 404, None, started=0.3, ended=0.4)  # a seed key
    assert not ledger.record("8", 503, {"error": {}}, started=0.4, ended=0.5)  # honest, not correct
    assert len(ledger.wrong) == 4
    assert [r.correct for r in ledger.reads] == [True, False, False, True, False, True, False, False]
    assert summarize(ledger.reads, 0.0, 0.5)["503"] == 1
    assert ledger.answers == {200: 4, 404: 3, 503: 1}
    assert ledger.longest_gap == pytest.approx(0.2)  # key "7": unanswered from 0.1 to its next correct answer at 0.3


def test_median_and_max_say_what_never_happened() -> None:
    assert median_max([]) == "-"
    assert median_max([1.0, 2.0, 4.0]) == "2.00 / 4.00"
    assert median_max([1.0, None]) == "1.00 / 1.00 (1 never)"
    assert median_max([None]) == "never"


def test_a_moves_phase_counts_only_its_own_reads_with_their_rate_and_latency() -> None:
    from bench.moves import phase

    reads = [Read(0, "s/1", 0.5, 0.502, 200, True), Read(0, "s/2", 1.0, 1.010, 200, True)]
    reads += [Read(1, "s/3", 1.5 + i / 100, 1.5 + i / 100 + 0.001, 503, False) for i in range(10)]
    reads.append(Read(0, "s/4", 3.0, 3.001, 200, True))  # after the phase
    p = phase(reads, 1.0, 3.0)
    assert (p["requests"], p["correct"], p["not_200"], p["503"]) == (11, 1, 10, 10)
    assert p["rate"] == 5.5 and p["seconds"] == 2.0
    assert p["p50_ms"] == pytest.approx(1.0) and p["p99_ms"] == pytest.approx(10.0)


def test_a_score_read_is_right_only_when_written_and_never_older_than_the_last_seen() -> None:
    from bench.faults import judge_score, user_scores
    from runtime.ingest import PARTITION_COLUMN

    known = {10, 20, 30}
    assert judge_score(200, {"response": 20}, known, None) == (20, None)
    assert judge_score(200, {"response": 20}, known, 20) == (20, None)
    assert judge_score(200, {"response": 20}, known, 30) == (None, "20 after 30")  # back in time
    assert judge_score(200, {"response": 25}, known, None) == (None, "25 after None")  # never written
    assert judge_score(503, {"error": {}}, known, 30) == (None, None)  # honest
    assert judge_score(404, {"error": {"code": "key-not-found"}}, known, None) == (
        None,
        "status 404 {'error': {'code': 'key-not-found'}}",
    )  # a key that exists answered absent: wrong

    class ByThree:  # the one thing of a table the batch asks: each key's partition
        def partition_of(self, key: int) -> int:
            return key % 3

    batch = user_scores(ByThree(), {7: 70, 8: 80, 9: 90})
    assert batch.column("user").to_pylist() == [7, 8, 9] and batch.column("score").to_pylist() == [70, 80, 90]
    assert batch.column(PARTITION_COLUMN).to_pylist() == [1, 2, 0]


def test_the_freeze_bench_judges_only_gets_in_sequence_for_going_back_in_time() -> None:
    from bench.freeze import Get, judged

    history = {1: {10, 20, 30}}
    gets = [
        Get("s", 1, 0.0, 1.0, 200, 30, None),
        Get("s", 1, 0.5, 1.5, 200, 20, None),  # overlapped the first: may be older
        Get("s", 1, 2.0, 2.1, 503, None, {"error": {"code": "owner-unavailable"}}),  # honest
    ]
    assert judged(gets, history) == []
    late = Get("s", 1, 1.2, 1.3, 200, 20, None)  # started after the first ended: must not go back
    never = Get("s", 1, 3.0, 3.1, 200, 40, None)  # a score never written
    assert judged([*gets, late, never], history) == ["s user 1: 20 after 30", "s user 1: 40 after 30"]
