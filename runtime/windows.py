"""Window and session stores: how their entries look to callers, and how their queries become scans.

Inside, a windowed store is a composite-key store: the user's key columns, then the window start; the
value is stored as ``[window end, value]``. Queries mirror Kafka Streams' ``ReadOnlyWindowStore`` and
``ReadOnlySessionStore``:

* windows of a key with start in [from, to]: Kafka's ``fetch(key, timeFrom, timeTo)``, and with
  ``reverse`` its ``backwardFetch``;
* windows of a key range (either end optional) with start in [from, to]: ``fetch(keyFrom, keyTo,
  timeFrom, timeTo)``, and with no key bounds ``fetchAll(timeFrom, timeTo)``;
* sessions of a key or a key range: ``fetch(key)``, ``fetch(keyFrom, keyTo)``;
* sessions of a key ending at or after T1 and starting at or before T2: ``findSessions(key,
  earliestSessionEndTime, latestSessionStartTime)``.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, NamedTuple

from runtime.catalog import StoreSpec
from runtime.codec import decode_value
from runtime.errors import InvalidParameter, KeyTooLong, MalformedKey, MalformedRange, RiqrError
from runtime.keys import TIMESTAMP, TOP, InstantOutOfRange, TooPrecise, micros_to_datetime
from runtime.scan import Bound, Scan, TimeFilter

__all__ = ["Windowed", "present", "window_scan", "session_scan", "time_bound", "require_kind"]


class Windowed(NamedTuple):
    """An entry of a window or session store."""

    key: Any
    start: _dt.datetime
    end: _dt.datetime
    value: Any

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "window": {"start": self.start, "end": self.end}, "value": self.value}


def present(spec: StoreSpec, key: Any, raw: bytes) -> Any:
    """An entry as callers see it: ``(key, value)``, or ``Windowed`` for window and session stores."""
    value = decode_value(raw)
    external = spec.key.external(key)
    if not spec.windowed:
        return external, value
    end, inner = value
    user = external[0] if spec.user_key_columns == 1 else tuple(external[:-1])
    return Windowed(user, external[-1], micros_to_datetime(end), inner)


def require_kind(spec: StoreSpec, *kinds: str) -> None:
    """``InvalidParameter`` unless ``spec`` is of one of ``kinds`` (a window query on a kv store...)."""
    if spec.kind not in kinds:
        wanted = " or ".join(kinds)
        raise InvalidParameter(
            f"store {spec.name!r} is a {spec.kind} store; this query needs a {wanted} store",
            store=spec.name,
            kind=spec.kind,
        )


def time_bound(value: Any, name: str) -> int | None:
    """A time bound (ISO-8601 text or a ``datetime``) as epoch micros; ``MalformedRange`` if it is not one."""
    if value is None:
        return None
    try:
        return int(TIMESTAMP.coerce(value))
    except (TooPrecise, InstantOutOfRange) as err:
        raise MalformedRange(f"{name}: {err.message}", parameter=name) from None
    except RiqrError:
        raise MalformedRange(
            f"{name} must be an ISO-8601 timestamp such as 2026-01-31T10:00:00Z, got {value!r}", parameter=name
        ) from None


def _user_parts(spec: StoreSpec, key: Any, *, bound: str | None = None) -> list[Any]:
    """The user's key as typed components (without the window start): ``MalformedKey`` if it is not one,
    ``MalformedRange`` if it is the ``bound`` (its parameter's name) of a key range (``keyFrom``, ``keyTo``),
    as for ``range``. A bound of a key of several columns may give only the leading ones, as ``range``'s may."""
    parts = list(key) if isinstance(key, (tuple, list)) else [key]
    n = spec.user_key_columns
    try:
        if len(parts) > n or (len(parts) < n and bound is None) or not parts:
            need = f"1 to {n}" if bound is not None and n > 1 else str(n)
            raise MalformedKey(f"the key of store {spec.name!r} has {n} column(s): give {need}, got {len(parts)}")
        columns = spec.key.columns[:n]
        return [t.coerce(p) for p, (_, t) in zip(parts, columns)]
    except KeyTooLong:
        raise
    except RiqrError as err:
        if bound is not None:
            raise MalformedRange(err.message, parameter=bound, store=spec.name) from None
        raise


def _key_range(spec: StoreSpec, key_from: Any, key_to: Any) -> tuple[Bound | None, Bound | None]:
    """The bounds of a key range (``keyFrom``, ``keyTo``; either may be None), the upper one padded with
    ``TOP`` so that it takes in every window or session of its last key."""
    lo = None if key_from is None else Bound(tuple(_user_parts(spec, key_from, bound="keyFrom")))
    hi = None if key_to is None else Bound(tuple(_user_parts(spec, key_to, bound="keyTo")) + (TOP,))
    return lo, hi


def _one_or_range(spec: StoreSpec, key: Any, key_from: Any, key_to: Any) -> None:
    """A key, or a key range, not both: a range given beside a key was ignored (REST refuses ``keyFrom``
    on the one-key route; the Python API now does the same)."""
    if key is not None and (key_from is not None or key_to is not None):
        raise InvalidParameter("give a key, or a key range (key_from, key_to), not both", store=spec.name)


def window_scan(
    spec: StoreSpec,
    *,
    key: Any = None,
    key_from: Any = None,
    key_to: Any = None,
    time_from: Any = None,
    time_to: Any = None,
    reverse: bool = False,
) -> Scan:
    """The scan of windows of one key (``key``) or a key range, whose start lies in [from, to]."""
    _one_or_range(spec, key, key_from, key_to)
    start_from, start_to = time_bound(time_from, "from"), time_bound(time_to, "to")
    times = TimeFilter(start_from, start_to)
    if key is not None:
        user = _user_parts(spec, key)
        lo = tuple(user) + ((start_from,) if start_from is not None else ())
        hi = tuple(user) + ((start_to,) if start_to is not None else (TOP,))
        return Scan(Bound(lo), Bound(hi), reverse, times)
    return Scan(*_key_range(spec, key_from, key_to), reverse, times)


def session_scan(
    spec: StoreSpec,
    *,
    key: Any = None,
    key_from: Any = None,
    key_to: Any = None,
    earliest_end: Any = None,
    latest_start: Any = None,
    reverse: bool = False,
) -> Scan:
    """Sessions of one key or a key range; with bounds, those ending at or after ``earliest_end`` and
    starting at or before ``latest_start`` (Kafka's ``findSessions``); ``reverse``: newest first, keys
    descending (Kafka's ``backwardFetch``, ``backwardFindSessions``)."""
    _one_or_range(spec, key, key_from, key_to)
    end_from, start_to = time_bound(earliest_end, "earliestEnd"), time_bound(latest_start, "latestStart")
    times = None if end_from is None and start_to is None else TimeFilter(None, start_to, end_from)
    if key is not None:
        user = tuple(_user_parts(spec, key))
        hi = user + ((start_to,) if start_to is not None else (TOP,))
        return Scan(Bound(user), Bound(hi), reverse, times)
    return Scan(*_key_range(spec, key_from, key_to), reverse, times)
