"""Structured logs: key=value and JSON lines with the store/partition/batch they are about."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from runtime import logs


@pytest.fixture
def captured() -> Iterator[tuple[io.StringIO, logging.Logger]]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    stream = io.StringIO()
    yield stream, logging.getLogger("riqr.test")
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("py4j").setLevel(logging.NOTSET)


def test_key_value_lines_carry_the_context_fields_and_quote_what_needs_it(captured) -> None:  # type: ignore[no-untyped-def]
    stream, log = captured
    logs.configure("info", "kv", stream=stream)
    log.warning('batch %d of "%s" failed', 7, "x y", extra={"store": "orders", "batch": 7, "partition": 3})
    line = stream.getvalue().strip()
    assert line.startswith("ts=") and line.count("\n") == 0
    assert ' level=warning logger=riqr.test msg="batch 7 of \\"x y\\" failed" store=orders partition=3 batch=7' in line


def test_json_lines_parse_and_include_exceptions(captured) -> None:  # type: ignore[no-untyped-def]
    stream, log = captured
    logs.configure("debug", "json", stream=stream)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("apply failed", extra={"store": "s", "partition": 0})
    record = json.loads(stream.getvalue())
    assert (record["level"], record["msg"], record["store"], record["partition"]) == ("error", "apply failed", "s", 0)
    assert "RuntimeError: boom" in record["exc"]


def test_bind_puts_fields_on_every_line_and_a_call_adds_its_own(captured) -> None:  # type: ignore[no-untyped-def]
    stream, log = captured
    logs.configure("info", "json", stream=stream)
    bound = logs.bind(log, store="s", actor="a1")
    bound.info("one")
    bound.info("two", extra={"partition": 2})
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["store"] == second["store"] == "s" and second["partition"] == 2 and "partition" not in first
    with pytest.raises(ValueError, match="unknown log fields"):
        logs.bind(log, customer="x")


def test_level_filters_and_configuring_again_replaces_the_handler(captured) -> None:  # type: ignore[no-untyped-def]
    stream, log = captured
    logs.configure("warning", "kv", stream=stream)
    logs.configure("warning", "kv", stream=stream)
    log.info("hidden")
    log.warning("shown")
    assert stream.getvalue().count("shown") == 1 and "hidden" not in stream.getvalue()


def test_settings_come_from_the_environment_and_bad_ones_fail_or_fall_back(
    captured, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    assert logs.settings_from_env({}) == ("info", "kv")
    assert logs.settings_from_env({"RIQR_LOG_LEVEL": "debug", "RIQR_LOG_FORMAT": "json"}) == ("debug", "json")
    with pytest.raises(ValueError, match="log format 'xml'"):
        logs.configure("info", "xml")
    monkeypatch.setenv("RIQR_LOG_FORMAT", "xml")
    logs.configure_from_env()  # an actor must still start: defaults, and a warning
    handler = next(h for h in logging.getLogger().handlers if isinstance(h.formatter, logs.KeyValueFormatter))
    assert logging.getLogger().level == logging.INFO and handler is not None


def test_py4j_traces_each_call_from_the_jvm_at_info_and_only_its_warnings_are_kept(captured) -> None:  # type: ignore[no-untyped-def]
    stream, _ = captured
    py4j = logging.getLogger("py4j.clientserver")
    logs.configure("info", "kv", stream=stream)
    py4j.info("Received command c on object id p2")  # each foreachBatch call, several a second
    py4j.error("There was an exception while executing the Python Proxy on the Python Side.")
    assert "Received command" not in stream.getvalue() and "Python Proxy" in stream.getvalue()
    logs.configure("debug", "kv", stream=stream)
    py4j.info("Received command c on object id p3")
    assert "object id p3" in stream.getvalue()
    logs.configure("error", "kv", stream=stream)
    py4j.warning("a py4j warning")  # below the level asked for
    assert "a py4j warning" not in stream.getvalue()


def test_throttled_lines_are_logged_at_most_so_often_and_the_rest_counted(caplog: pytest.LogCaptureFixture) -> None:
    """A client sending bad tokens wrote two lines a request into the HTTP verticle's log (a soak run's
    1.6 bad requests a second made most of it): such lines are throttled, and what was left out is said."""
    import logging

    from runtime.logs import Throttled

    now = [0.0]
    logger = logging.getLogger("riqr-test-throttled")
    throttled = Throttled(logger, most=3, per=60.0, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="riqr-test-throttled"):
        for n in range(10):
            throttled.info("refused %d", n)
        now[0] += 60.0
        throttled.info("refused %d", 10)
    assert [r.getMessage() for r in caplog.records] == [
        "refused 0",
        "refused 1",
        "refused 2",
        "7 more such lines were not logged (at most 3 a 60s)",
        "refused 10",
    ]
