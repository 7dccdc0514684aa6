"""One logging setup for every riqr process: verticles, topologies and benchmarks.

Level and format come from arguments, else ``RIQR_LOG_LEVEL`` (``debug``, ``info``, ``warning``...;
default ``info``) and ``RIQR_LOG_FORMAT`` (``kv``, the default, or ``json``). Every line carries the
time, level, logger and message, and the fields ``store``, ``partition``, ``batch``, ``actor``,
``query`` and ``topic`` when the call has them: given with ``extra={"store": ...}``, or bound once
with ``bind(log, store=...)`` for every line of a logger.

    ts=2026-05-01T12:00:00.123Z level=warning logger=topologies.delivery msg="..." store=orders batch=7

``configure`` installs one handler on the root logger and replaces the one it installed before, so
calling it again (Ray re-running an actor's constructor, tests) never doubles lines; other handlers are
left alone.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping
from typing import IO, Any

__all__ = [
    "configure",
    "configure_from_env",
    "bind",
    "settings_from_env",
    "KeyValueFormatter",
    "JsonFormatter",
    "FIELDS",
    "FORMATS",
    "LEVEL_ENV",
    "FORMAT_ENV",
    "Throttled",
]

LEVEL_ENV = "RIQR_LOG_LEVEL"
FORMAT_ENV = "RIQR_LOG_FORMAT"
FORMATS = ("kv", "json")
# Context fields a line may carry, in the order they are written.
FIELDS = ("store", "partition", "batch", "actor", "query", "topic")
_LEVELS = ("debug", "info", "warning", "error", "critical")


def _timestamp(record: logging.LogRecord) -> str:
    moment = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _fields(record: logging.LogRecord) -> list[tuple[str, Any]]:
    return [(name, getattr(record, name)) for name in FIELDS if getattr(record, name, None) is not None]


def _kv_value(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\\\n\r\t'):
        return text
    return json.dumps(text, ensure_ascii=False)  # quoted, with quotes and newlines escaped


class KeyValueFormatter(logging.Formatter):
    """``key=value`` lines (logfmt): readable by people, parsed by Loki, Vector, Splunk and friends."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            ("ts", _timestamp(record)),
            ("level", record.levelname.lower()),
            ("logger", record.name),
            ("msg", record.getMessage()),
            *_fields(record),
        ]
        if record.exc_info:
            parts.append(("exc", self.formatException(record.exc_info)))
        return " ".join(f"{k}={_kv_value(v)}" for k, v in parts)


class JsonFormatter(logging.Formatter):
    """One JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_fields(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def settings_from_env(env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(level, format)`` from ``RIQR_LOG_LEVEL`` and ``RIQR_LOG_FORMAT`` (defaults ``info``, ``kv``)."""
    env = os.environ if env is None else env
    return env.get(LEVEL_ENV, "") or "info", env.get(FORMAT_ENV, "") or "kv"


class _RiqrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler ``configure`` installs (recognised, and replaced, when it is called again)."""


def configure(level: str | None = None, fmt: str | None = None, *, stream: IO[str] | None = None) -> logging.Handler:
    """Log riqr's way: ``level`` and ``fmt`` (``kv`` or ``json``), else from the environment.

    ``ValueError`` for an unknown level or format, so a typo in an option fails at start.
    """
    env_level, env_fmt = settings_from_env()
    level = (level or env_level).lower()
    fmt = (fmt or env_fmt).lower()
    if level not in _LEVELS:
        raise ValueError(f"log level {level!r} is not one of {', '.join(_LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _RiqrHandler)]:
        root.removeHandler(old)
    handler = _RiqrHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    # py4j logs each call from Spark's JVM into Python (every foreachBatch, every listener event) at info:
    # its own tracing, several lines a second under a topology's trigger. Its warnings and errors stay.
    logging.getLogger("py4j").setLevel(logging.DEBUG if level == "debug" else max(logging.WARNING, root.level))
    return handler


def configure_from_env() -> None:
    """``configure`` from the environment, for actors: a bad setting falls back to the defaults with a
    warning instead of failing (an actor whose constructor fails is restarted by Ray, forever)."""
    try:
        configure()
    except ValueError as err:
        configure("info", "kv")
        logging.getLogger(__name__).warning("%s; logging at info level as key=value lines", err)


class _Bound(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger whose lines carry fixed fields; a call's own ``extra`` adds to them (and wins)."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def bind(logger: logging.Logger, **fields: Any) -> logging.LoggerAdapter:  # type: ignore[type-arg]
    """``logger`` with ``fields`` (``store=``, ``actor=``...) on every line it writes."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"unknown log fields {sorted(unknown)}; known: {', '.join(FIELDS)}")
    return _Bound(logger, fields)


class Throttled:
    """Lines that anyone can cause (a refused request: no token, a bad one) logged at most ``most`` times a
    ``per`` seconds; the rest are counted, and the count is logged with the next line let through. Without
    it, a client sending bad tokens wrote two lines a request into the HTTP verticle's log."""

    def __init__(
        self,
        logger: logging.Logger,
        *,
        most: int = 20,
        per: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._most = most
        self._per = per
        self._clock = clock
        self._lock = threading.Lock()
        self._window = -per
        self._logged = 0
        self._dropped = 0

    def info(self, msg: str, *args: Any) -> None:
        with self._lock:
            now = self._clock()
            if now - self._window >= self._per:
                self._window, self._logged = now, 0
            if self._logged >= self._most:
                self._dropped += 1
                return
            self._logged += 1
            dropped, self._dropped = self._dropped, 0
        if dropped:
            self._log.info("%d more such lines were not logged (at most %d a %gs)", dropped, self._most, self._per)
        self._log.info(msg, *args)
