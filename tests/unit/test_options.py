"""Topology options: an interval flag is checked as Spark's processing-time trigger would take it, before
the topology starts anything (the forms below were each tried on Spark 4's ``Trigger.ProcessingTime``)."""

from __future__ import annotations

import argparse

import pytest

from topologies.options import TopologyOptions, check_interval
from topologies.runner import run_topology

SPARK_TAKES = [
    "250 milliseconds",
    "2 seconds",
    "1 second",
    "1 minute",
    "1.5 seconds",
    "interval 2 seconds",
    "1 minute 30 seconds",
    "0 seconds",
    "2 SECONDS",
    " 2 seconds ",
    "1 hour",
    "1 day",
    "1 week",
]
SPARK_REFUSES = ["10s", "500ms", "1 min", "2seconds", "1 month", "-1 seconds", "2 secs", "5 mins", "1h", "soon", ""]


@pytest.mark.parametrize("value", SPARK_TAKES)
def test_an_interval_spark_takes_is_taken(value: str) -> None:
    assert check_interval(value) == value
    assert TopologyOptions(trigger=value, dead_letter_trigger=value).dead_letter_trigger == value


@pytest.mark.parametrize("value", SPARK_REFUSES)
def test_an_interval_spark_refuses_is_refused_with_the_forms_it_takes(value: str) -> None:
    with pytest.raises(ValueError, match="'2 seconds'"):
        check_interval(value)
    with pytest.raises(ValueError):
        TopologyOptions(trigger=value)
    with pytest.raises(ValueError):
        TopologyOptions(dead_letter_trigger=value)


@pytest.mark.parametrize("flag", ["--trigger", "--dead-letter-trigger"])
def test_a_topology_refuses_a_bad_interval_before_it_starts_anything(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    started: list[object] = []
    with pytest.raises(SystemExit) as exit_info:
        run_topology(
            argparse.ArgumentParser(prog="topology"), [flag, "5 mins"], lambda *a, **k: started.append(a) or []
        )
    assert exit_info.value.code == 2
    assert started == []
    err = capsys.readouterr().err
    assert f"argument {flag}" in err and "'5 mins' is not an interval Spark takes" in err


class _Untouchable:
    """A DataFrame stand-in that fails the test if ``materialize`` looks at it."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"materialize used the DataFrame ({name}) before checking its arguments")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"trigger": "5 mins"}, "'5 mins' is not an interval Spark takes"),
        ({"trigger": "10s"}, "'10s' is not an interval Spark takes"),
        ({"delivery_timeout": 0}, "delivery_timeout must be a positive number of seconds, got 0"),
        ({"delivery_timeout": -5.0}, "delivery_timeout must be a positive number of seconds"),
        ({"delivery_timeout": float("nan")}, "delivery_timeout must be a positive number of seconds"),
        ({"output_mode": "upsert"}, "output_mode must be one of append, update, complete, got 'upsert'"),
        # Complete mode writes a merged session under its new start and never the old row again: the store
        # kept both, overlapping, their counts summed (a review's fake batches showed it).
        ({"kind": "session", "output_mode": "complete"}, "a session store takes append mode only"),
        ({"kind": "session", "output_mode": "update"}, "a session store takes append mode only"),
        ({"kind": "session", "output_mode": "Complete"}, "a session store takes append mode only"),
    ],
)
def test_materialize_refuses_bad_arguments_before_it_creates_anything(
    arguments: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from topologies import sink

    def no_registry(namespace: str) -> object:
        raise AssertionError("materialize reached the registry before checking its arguments")

    monkeypatch.setattr(sink, "registry", no_registry)
    monkeypatch.setattr(sink, "create_stores", lambda *a: no_registry(""))
    options = {"store": "s", "key": "key", "checkpoint": "/nonexistent/cp", **arguments}
    with pytest.raises(ValueError, match=message):
        sink.materialize(_Untouchable(), **options)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        sink.materialize_all([(_Untouchable(), options)])


def test_materialize_all_checks_every_pair_before_it_creates_any_store(monkeypatch: pytest.MonkeyPatch) -> None:
    from topologies import sink

    created: list[object] = []
    monkeypatch.setattr(sink, "_declare", lambda *a: (None, [], object()))
    monkeypatch.setattr(sink, "create_stores", lambda *a: created.append(a))
    good = {"store": "a", "key": "key", "checkpoint": "/nonexistent/a"}
    bad = {"store": "b", "key": "key", "checkpoint": "/nonexistent/b", "trigger": "10s"}
    with pytest.raises(ValueError, match="'10s' is not an interval Spark takes"):
        sink.materialize_all([(_Untouchable(), good), (_Untouchable(), bad)])
    assert created == []
