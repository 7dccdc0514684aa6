"""riqr's Kafka source: keys and values that are not UTF-8 become dead letters, not altered records."""

from typing import Any

import pytest

from topologies.kafka_source import _decode, _problem


def test_utf8_is_text_and_anything_else_is_flagged_with_its_bytes_escaped() -> None:
    assert _decode(None) == (None, True)
    assert _decode("café".encode()) == ("café", True)
    # U+FFFD for both would have made these two keys one
    assert _decode(b"\xff\xfe") == ("\\xff\\xfe", False)
    assert _decode(b"\xff\xfd") == ("\\xff\\xfd", False)


def test_the_problem_names_what_is_not_utf8() -> None:
    assert _problem(True, True) is None
    assert "key is not UTF-8" in (_problem(False, True) or "")
    assert "value is not UTF-8" in (_problem(True, False) or "")
    assert "key and value are not UTF-8" in (_problem(False, False) or "")


def test_a_batch_end_never_drops_a_partition_nor_goes_below_its_start() -> None:
    """A topic one metadata read left out (a leader election) was missing from the batch's end, and the
    next batch began it again at offset 0: its records counted twice."""
    from topologies.kafka_source import later_offsets

    start = {"order/0": 500, "order/1": 20}
    assert later_offsets(start, {}) == start
    assert later_offsets(start, {"order/0": 600}) == {"order/0": 600, "order/1": 20}
    assert later_offsets(start, {"order/0": 400, "order/1": 30, "customer/0": 7}) == {
        "order/0": 500,  # a high watermark below where the query stands never takes it back
        "order/1": 30,
        "customer/0": 7,  # a new topic
    }


def test_an_end_below_where_the_query_stands_is_data_loss_not_a_silent_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic made again (or truncated) ends below the checkpoint's offsets: keeping the old end read
    nothing, then skipped the new topic's first records once it grew past it, without a word."""
    from topologies import kafka_source
    from topologies.kafka_source import KafkaStreamReader

    monkeypatch.setattr(kafka_source, "_END_RETRY", 0.0)
    reads: list[int] = []

    def reader(*ends: dict[str, int], **options: str) -> KafkaStreamReader:
        made = KafkaStreamReader({"kafka.bootstrap.servers": "b:9092", "subscribe": "t", **options})

        def watermarks(*, low: bool, strict: bool = False) -> dict[str, int]:
            reads.append(1)
            return ends[min(len(reads), len(ends)) - 1]

        monkeypatch.setattr(made.kafka, "watermarks", watermarks)
        reads.clear()
        return made

    gone = {"t/0": 2, "t/1": 50}
    with pytest.raises(RuntimeError, match="t/0 ends at 2, below the 100 this query has read"):
        reader(gone).latestOffset({"t/0": 100, "t/1": 40})
    assert len(reads) == 3  # read again before calling it a loss
    assert reader(gone, failOnDataLoss="false").latestOffset({"t/0": 100, "t/1": 40}) == gone
    # A new leader's end lagging for a moment: the next read has it right, nothing is said.
    assert reader(gone, {"t/0": 101, "t/1": 50}).latestOffset({"t/0": 100, "t/1": 40}) == {"t/0": 101, "t/1": 50}


def test_a_start_from_the_earliest_offsets_that_kafka_has_moved_on_says_so(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A rebuild (or a new topology) from the earliest offsets of a topic whose first records retention
    removed built counts of what was left, with no word of it anywhere."""
    import logging

    from topologies.kafka_source import KafkaStreamReader

    made = KafkaStreamReader({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})
    monkeypatch.setattr(made.kafka, "watermarks", lambda *, low, strict=False: {"t/0": 0, "t/1": 1200} if low else {})
    with caplog.at_level(logging.WARNING, logger="topologies.kafka_source"):
        assert made.initialOffset() == {"t/0": 0, "t/1": 1200}
    assert [r.getMessage() for r in caplog.records if "no longer has" in r.getMessage()] == [
        "reading from the earliest offsets, but Kafka no longer has the first records of t/1 (offsets 0-1199): "
        "state built from here (a rebuild, a count, a sum) covers only the records still there"
    ]
    caplog.clear()
    whole = KafkaStreamReader({"kafka.bootstrap.servers": "b:9092", "subscribe": "t"})
    monkeypatch.setattr(whole.kafka, "watermarks", lambda *, low, strict=False: {"t/0": 0, "t/1": 0})
    latest = KafkaStreamReader({"kafka.bootstrap.servers": "b:9092", "subscribe": "t", "startingOffsets": "latest"})
    monkeypatch.setattr(latest.kafka, "watermarks", lambda *, low, strict=False: {"t/0": 500})
    with caplog.at_level(logging.WARNING, logger="topologies.kafka_source"):
        whole.initialOffset()
        latest.initialOffset()  # asked to skip what is there: nothing lost to say
    assert not caplog.records


class _Part:
    def __init__(self, error: object = None, leader: int = 1) -> None:
        self.error, self.leader = error, leader


class _Meta:
    def __init__(self, error: object = None, partitions: tuple[int, ...] = (0,), part_error: object = None) -> None:
        self.error, self.partitions = error, {p: _Part(part_error) for p in partitions}


class _Consumer:
    """What ``watermarks`` asks of a consumer: each metadata read in turn, then offsets (low 5, high 9)."""

    def __init__(self, reads: list[dict[str, _Meta]]) -> None:
        self.reads = reads
        self.listed = 0

    def list_topics(self, timeout: float) -> object:
        topics = self.reads[min(self.listed, len(self.reads) - 1)]
        self.listed += 1
        return type("Metadata", (), {"topics": topics})()

    def get_watermark_offsets(self, part: object, timeout: float) -> tuple[int, int]:
        return 5, 9

    def close(self) -> None:
        pass


def test_a_topic_whose_metadata_says_a_passing_error_is_read_again_not_taken_for_absent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A leader election made a topic's metadata say LEADER_NOT_AVAILABLE, and the topic was skipped as
    not created: missing from the query's start offsets, it was read from offset 0 (an ingest review)."""
    from confluent_kafka import KafkaError

    from topologies import kafka_source
    from topologies.kafka_source import KafkaStreamReader

    monkeypatch.setattr(kafka_source, "_METADATA_RETRY", 0.0)
    electing = _Meta(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
    absent = _Meta(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), partitions=())
    reader = KafkaStreamReader({"kafka.bootstrap.servers": "b:9092", "subscribe": "t,u", "startingOffsets": "latest"})
    consumer = _Consumer([{"t": electing, "u": absent}, {"t": _Meta(), "u": absent}])
    monkeypatch.setattr(reader.kafka, "consumer", lambda: consumer)
    assert reader.initialOffset() == {"t/0": 9}  # read again; "u" is not created yet: nothing of it
    assert consumer.listed == 2
    stuck = _Consumer([{"t": electing}])
    monkeypatch.setattr(reader.kafka, "consumer", lambda: stuck)
    with pytest.raises(RuntimeError, match="topic t says .*LEADER_NOT_AVAILABLE.* after 10 reads"):
        reader.initialOffset()
    # An election on an existing topic is said per partition: read again too, where its offsets waited 30 s.
    leaderless = _Meta(partitions=(0, 1), part_error=KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
    consumer = _Consumer([{"t": leaderless}, {"t": _Meta(partitions=(0, 1))}])
    monkeypatch.setattr(reader.kafka, "consumer", lambda: consumer)
    assert reader.initialOffset() == {"t/0": 9, "t/1": 9} and consumer.listed == 2
    # A follower's broker down (the leader serves): its offsets read at once, not a start refused.
    follower_down = _Meta(partitions=(0, 1), part_error=KafkaError(KafkaError.REPLICA_NOT_AVAILABLE))
    consumer = _Consumer([{"t": follower_down}])
    monkeypatch.setattr(reader.kafka, "consumer", lambda: consumer)
    assert reader.initialOffset() == {"t/0": 9, "t/1": 9} and consumer.listed == 1
    # A running query's end offsets are read once: a topic left out keeps the offsets known (later_offsets).
    running = _Consumer([{"t": electing}])
    monkeypatch.setattr(reader.kafka, "consumer", lambda: running)
    assert reader.kafka.watermarks(low=False) == {} and running.listed == 1
    # So does a partition without a leader, whose offsets would wait out the 30 s timeout: not asked.
    election = _Meta(partitions=(0, 1))
    election.partitions[1].leader = -1

    class NoLeaderFor1(_Consumer):
        def get_watermark_offsets(self, part: Any, timeout: float) -> tuple[int, int]:
            assert part.partition != 1, "a leaderless partition's offsets were asked for"
            return super().get_watermark_offsets(part, timeout)

    running = NoLeaderFor1([{"t": election}])
    monkeypatch.setattr(reader.kafka, "consumer", lambda: running)
    assert reader.kafka.watermarks(low=False) == {"t/0": 9}
    assert reader.latestOffset({"t/0": 3, "t/1": 4}) == {"t/0": 9, "t/1": 4}
