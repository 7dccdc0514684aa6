"""High-water marks: what a facade admits after what it served (runtime/monotonic.py)."""

from runtime.monotonic import Marks, SpansSeen, position_header, span_text


def test_an_answer_older_than_what_was_served_is_refused_and_a_newer_one_raises_the_mark() -> None:
    marks = Marks()
    assert marks.admit("s", 0, ("q", 5, 5), active=False)  # a standby, fed first, is at batch 5
    assert not marks.admit("s", 0, ("q", 4, 4), active=True)  # the active is still at 4: going back
    assert marks.admit("s", 0, ("q", 5, 5), active=True)
    assert marks.admit("s", 0, ("q", 7, 7), active=True)
    assert not marks.admit("s", 0, ("q", 6, 6), active=False)
    assert marks.get("s", 0) is not None and marks.get("s", 0).batch == 7  # type: ignore[union-attr]
    assert marks.admit("s", 1, ("q", 0, 0), active=True)  # partitions are independent


def test_a_read_that_overlapped_an_apply_raises_the_mark_to_its_top() -> None:
    marks = Marks()
    assert marks.admit("s", 0, ("q", 3, 4), active=True)  # some rows may be batch 4's
    assert not marks.admit("s", 0, ("q", 3, 3), active=False)
    assert marks.admit("s", 0, ("q", 4, 4), active=False)
    assert span_text(("q", 3, 4)) == "q@3-4" and span_text(("q", 4, 4)) == "q@4"


def test_a_new_source_is_taken_and_the_one_the_active_left_never_comes_back() -> None:
    marks = Marks()
    assert marks.admit("s", 0, ("old", 57, 57), active=True)
    assert marks.admit("s", 0, ("new", 0, 0), active=False)  # the rebuild's batch 0 reached the standby first
    assert not marks.admit("s", 0, ("old", 57, 57), active=True)  # the active has not got it yet
    assert not marks.admit("s", 0, ("old", 58, 58), active=True)  # whatever the batch: sources do not compare
    assert marks.admit("s", 0, ("new", 0, 0), active=True)
    assert marks.admit("s", 0, ("newer", 0, 0), active=True)  # another rebuild
    assert not marks.admit("s", 0, ("new", 3, 3), active=False)


def test_a_first_answer_from_a_standby_at_a_new_source_can_be_followed_once_by_the_active_at_the_old() -> None:
    # The case the facade cannot tell (docs/design.md): it never saw the active at "old", so "new" might be
    # the older one. It takes the active's word once and never retires a source only a standby showed,
    # so nothing is refused for ever.
    marks = Marks()
    assert marks.admit("s", 0, ("new", 0, 0), active=False)
    assert marks.admit("s", 0, ("old", 57, 57), active=True)
    assert marks.admit("s", 0, ("new", 0, 0), active=False)
    assert not marks.admit("s", 0, ("old", 57, 57), active=True)  # from then on, monotonic
    assert marks.admit("s", 0, ("new", 1, 1), active=True)


def test_a_source_the_marks_left_is_refused_for_a_bounded_time_only() -> None:
    """A restarted active answering from where it stopped (the old source) before the sink's retry
    brought it the new one moved the mark back and retired the new source: once every copy had it, every
    answer was refused, for good (found in review)."""
    now = [0.0]
    marks = Marks(clock=lambda: now[0], retire_for=300.0)
    assert marks.admit("s", 0, ("old", 50, 50), active=False)  # a read replica's answers: never settled
    assert marks.admit("s", 0, ("new", 0, 0), active=True)  # a promoted standby, at the rebuild's batch 0
    assert marks.admit("s", 0, ("old", 50, 50), active=True)  # the restarted active, given back: "new" retired
    now[0] = 299.0
    assert not marks.admit("s", 0, ("new", 1, 1), active=True)  # every copy has "new" now
    now[0] = 301.0
    assert marks.admit("s", 0, ("new", 1, 1), active=True)  # the bound passed: it serves again
    assert not marks.admit("s", 0, ("old", 50, 50), active=True)  # and "old" is the retired one now


def test_admit_all_moves_no_mark_when_one_partition_is_refused() -> None:
    marks = Marks()
    assert marks.admit_all("s", {0: ("q", 3, 3), 1: ("q", 3, 3)}, {0, 1}) == []
    assert marks.admit_all("s", {0: ("q", 9, 9), 1: ("q", 2, 2), 2: ("q", 1, 1)}, set()) == [1]
    assert marks.get("s", 0).batch == 3  # type: ignore[union-attr]
    assert marks.get("s", 2) is None
    assert marks.admit_all("s", {0: ("q", 4, 4), 1: ("q", 3, 3)}, frozenset()) == []


def test_forget_drops_one_store() -> None:
    marks = Marks()
    marks.admit("a", 0, ("q", 9, 9), active=True)
    marks.admit("b", 0, ("q", 9, 9), active=True)
    marks.forget("a")
    assert marks.stores() == {"b"}
    assert marks.admit("a", 0, ("q", 0, 0), active=True)


def test_the_position_header_spells_a_span_the_same_whatever_its_sequence_type() -> None:
    for span, batch in ((("q", 3, 3), "3"), (("q", 3, 4), "3-4"), ((None, 0, 0), "0")):
        want = f"partition=2; source={span[0] or ''}; batch={batch}"
        assert position_header(2, span) == want
        assert position_header(2, list(span)) == want  # type: ignore[arg-type]  # unhashable: not a cache key


def test_an_answer_of_several_calls_says_every_batch_it_may_reflect_per_partition() -> None:
    seen = SpansSeen()
    assert seen.header() == ""
    seen.add({1: ("q", 5, 5), 0: ("q", 4, 4)})
    seen.add({1: ("q", 6, 7)})  # a later page of partition 1, a batch or two on
    seen.add({0: ("q", 3, 4)})  # and one of partition 0 that read a span starting earlier
    assert seen.header() == "partition=0; source=q; batch=3-4, partition=1; source=q; batch=5-7"
    seen.add({1: ("r", 0, 0)})  # a rebuild's new source, which the marks admitted: it replaces
    assert seen.header().endswith("partition=1; source=r; batch=0")


def test_a_position_list_too_long_for_a_proxys_headers_is_left_out() -> None:
    from runtime.monotonic import MAX_POSITION_CHARS

    source = "0fc3ad25-98e1-4ac4-9e77-088980bf36cc"  # a Spark query id, as real sources are
    seen = SpansSeen()
    seen.add({p: (source, 41, 41) for p in range(40)})
    assert 0 < len(seen.header()) <= MAX_POSITION_CHARS
    seen.add({p: (source, 41, 41) for p in range(40, 200)})
    assert seen.header() == ""  # 200 partitions: about 14 KB, over what nginx or aiohttp take
