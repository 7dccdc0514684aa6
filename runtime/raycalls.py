"""The one way errors cross Ray: every Ray call riqr makes goes through ``call`` (async) or ``get`` (sync).

A query actor, the registry or a facade verticle raises riqr's own errors (``runtime.errors``); Ray wraps
them in ``RayTaskError``, and Ray itself fails calls with its own exceptions. ``translate`` turns all of
them into riqr's errors, so a caller of any verticle (the facade, the Python client, the sink, the CLI)
catches ``RiqrError`` and nothing else:

==========================================  ==================================================
Ray says                                    riqr raises
==========================================  ==================================================
``RayTaskError`` caused by a ``RiqrError``  that error, as itself
``RayTaskError`` caused by anything else    ``InternalError`` (500: a bug, logged by its actor)
``ActorUnavailableError``                   ``OwnerUnavailable`` (restarting; retried first)
``ActorDiedError`` / ``RayActorError``      ``OwnerUnavailable`` (dead; Retry-After 5)
``ActorUnschedulableError``                 ``OwnerUnavailable`` (its pinned node is gone; Retry-After 1)
``GetTimeoutError``                         ``DeadlineExceeded`` (504)
==========================================  ==================================================

A restarting actor (``ActorUnavailableError``) is retried with backoff while the deadline allows, so a
restart shorter than the deadline costs latency, not an error. Ray is imported only when an exception
needs translating, so the pure core imports without Ray.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from runtime.deadline import Deadline, within
from runtime.errors import DeadlineExceeded, InternalError, OwnerUnavailable, RiqrError

__all__ = [
    "translate",
    "call",
    "call_within",
    "call_sync",
    "get",
    "wait_looking",
    "is_restarting",
    "is_dead",
    "refused_arguments",
    "no_auto_connect",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Backoff between retries of a restarting actor: short first (a restart often takes well under a second).
_FIRST_BACKOFF = 0.02
_MAX_BACKOFF = 0.5


def no_auto_connect() -> None:
    """Turn off Ray's auto-connect for this process and what it starts; call before Ray is imported.

    Ray makes ``ray.get``, ``ray.get_actor`` and a few others call ``ray.init()`` when Ray is not
    initialized: a call from a background thread (the sink's looks at the copies, a feeder's heartbeat)
    that comes after ``ray.shutdown()`` would start a new local Ray cluster as the process exits (seen
    once at the end of ``riqr demo``: Ray's "SIGTERM handler is not set" warning from such a thread).
    riqr's commands always start or join a cluster explicitly, so such a call should fail instead.
    ``RAY_ENABLE_AUTO_CONNECT`` is read when Ray is imported; one set by the user is kept."""
    import os

    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")


def is_restarting(exc: BaseException) -> bool:
    """Whether ``exc`` is Ray saying the actor is temporarily unreachable (restarting), not dead."""
    from ray.exceptions import ActorUnavailableError

    return isinstance(exc, ActorUnavailableError)


def is_dead(exc: BaseException) -> bool:
    """Whether ``exc`` is Ray saying the actor is dead for good (killed, out of restarts), not restarting."""
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(exc, RayActorError) and not isinstance(exc, ActorUnavailableError)


def refused_arguments(exc: BaseException) -> bool:
    """Whether ``exc`` is a call's arguments refused for its method's signature: an actor of an older riqr
    binding an argument added since (a ``TypeError`` inside it, as ``translate`` says it), or this process's
    older class. Callers that added one ask again without it (during an upgrade, old and new actors meet)."""
    return isinstance(exc, TypeError) or (isinstance(exc, InternalError) and "TypeError" in exc.message)


def unwrapped(exc: RiqrError) -> RiqrError:
    """The riqr error itself for one raised inside an actor: Ray hands it to the caller wrapped, as a
    ``RayTaskError`` subclass of the error's class whose text is the actor's whole traceback."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, RiqrError) else exc


def translate(exc: BaseException, what: str, *, actor: str | None = None) -> RiqrError:
    """The riqr error for an exception raised by a Ray call about ``what`` (to ``actor``, if one)."""
    if isinstance(exc, RiqrError):
        return unwrapped(exc)
    from ray.exceptions import (
        ActorUnavailableError,
        ActorUnschedulableError,
        GetTimeoutError,
        RayActorError,
        RayTaskError,
    )

    details: dict[str, Any] = {} if actor is None else {"actor": actor}
    if isinstance(exc, RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, RiqrError):
            return cause
        log.warning("%s failed inside its actor: %s", what, exc)
        return InternalError(f"{what} failed inside the actor: {type(cause or exc).__name__}", **details)
    if isinstance(exc, ActorUnavailableError):
        return OwnerUnavailable(f"{what}: the actor is restarting or unreachable", retry_after=1, **details)
    if isinstance(exc, RayActorError):
        raised = _constructor_raised(exc)
        if raised is not None:  # the cause is in the worker's log; said here too, or the caller sees only this
            died = f"{what}: the actor died: its constructor raised {raised}"
            return OwnerUnavailable(died, retry_after=5, **details)
        return OwnerUnavailable(f"{what}: the actor died", retry_after=5, **details)
    if isinstance(exc, ActorUnschedulableError):
        # A query actor pinned to a node that died: the registry re-creates it elsewhere within seconds.
        return OwnerUnavailable(f"{what}: the actor's node is gone", retry_after=1, **details)
    if isinstance(exc, GetTimeoutError):
        return DeadlineExceeded(f"{what} did not answer in time", **details)
    raise exc


def _constructor_raised(exc: BaseException, limit: int = 300) -> str | None:
    """For an actor that died because its constructor raised, the exception's last line (``OSError: ...``:
    Ray's text is the whole remote traceback); None for any other death."""
    if not getattr(exc, "actor_init_failed", False):
        return None
    lines = [line.strip() for line in str(getattr(exc, "error_msg", "") or "").splitlines() if line.strip()]
    if not lines:
        return None
    last = lines[-1]
    return last if len(last) <= limit else last[:limit] + "..."


async def call(
    submit: Callable[[], Awaitable[T]],
    what: str,
    *,
    deadline: Deadline | None = None,
    actor: str | None = None,
    on_restarting: Callable[[], None] | None = None,
) -> T:
    """Await the Ray call that ``submit()`` makes, translating failures; a restarting actor is called again
    (``submit()`` once more) with backoff until ``deadline``, then it is ``OwnerUnavailable``.
    ``on_restarting`` is called when the actor is first found restarting (a facade tells the registry)."""
    backoff = _FIRST_BACKOFF
    while True:
        try:
            return await submit()
        except RiqrError as exc:
            raise unwrapped(exc) from None
        except Exception as exc:
            restarting = is_restarting(exc)
            if restarting and on_restarting is not None and backoff == _FIRST_BACKOFF:
                on_restarting()
            if deadline is None or not restarting or deadline.remaining() <= backoff:
                raise translate(exc, what, actor=actor) from None
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, _MAX_BACKOFF)


async def call_within(
    submit: Callable[[], Awaitable[T]], what: str, *, deadline: Deadline, actor: str | None = None
) -> T:
    """``call``, and no waiting past ``deadline`` either (``DeadlineExceeded``): ``call`` asks a restarting
    actor again until the deadline but awaits each answer for as long as it takes. Off the hot path (the
    registry's calls, a client's calls to its facade verticle), where a timer per call costs nothing that
    matters; a query actor's calls are bounded by the request around them."""
    return await within(deadline, call(submit, what, deadline=deadline, actor=actor), what)


def get(ref: Any, what: str, *, timeout: float | None = None, actor: str | None = None) -> Any:
    """``ray.get`` of an object ref (or a list of them), with failures translated to riqr's errors."""
    import ray

    try:
        return ray.get(ref, timeout=timeout)
    except Exception as exc:
        raise translate(exc, what, actor=actor) from None


def wait_looking(refs: Sequence[Any], until: Deadline, every: float, look: Callable[[], None]) -> list[Any]:
    """Wait until every ref of ``refs`` is ready or ``until`` passes, in slices of ``every`` seconds, calling
    ``look()`` between slices while some are still waiting (it raises to stop waiting: a stop that gives
    up, say). Returns the refs still not ready. Refs that are ready at once cost one ``ray.wait``."""
    import ray

    waiting = list(refs)
    while waiting and until.remaining() > 0:
        _, waiting = ray.wait(waiting, num_returns=len(waiting), timeout=min(until.remaining(), every))
        if waiting:
            look()
    return waiting


def call_sync(submit: Callable[[], Any], what: str, *, deadline: Deadline, actor: str | None = None) -> Any:
    """The blocking form of ``call``: ``ray.get`` of the ref ``submit()`` returns, until ``deadline``,
    calling again while the actor is restarting."""
    import ray

    backoff = _FIRST_BACKOFF
    while True:
        try:
            return ray.get(submit(), timeout=max(deadline.remaining(), 0.001))
        except RiqrError as exc:
            raise unwrapped(exc) from None
        except Exception as exc:
            if not is_restarting(exc) or deadline.remaining() <= backoff:
                raise translate(exc, what, actor=actor) from None
        time.sleep(backoff)
        backoff = min(backoff * 2, _MAX_BACKOFF)
