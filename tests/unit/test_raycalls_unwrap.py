"""A riqr error raised inside an actor reaches the caller as itself (runtime/raycalls.py)."""

from __future__ import annotations

import asyncio

import pytest

from runtime import raycalls
from runtime.deadline import Deadline
from runtime.errors import InvalidParameter, MalformedCursor


def _as_ray_hands_it_over(err: Exception) -> Exception:
    from ray.exceptions import RayTaskError  # the class only: nothing here starts or joins Ray

    wrapped: Exception = RayTaskError("FacadeVerticle.page()", "Traceback (most recent call last):\n ...", err)
    return wrapped.as_instanceof_cause()  # type: ignore[attr-defined,no-any-return]


def test_a_riqr_error_raised_in_an_actor_reaches_the_caller_as_itself_not_rays_wrapper() -> None:
    from ray.exceptions import RayTaskError

    err = InvalidParameter("limit must be at least 1, got 0", parameter="limit")
    wrapped = _as_ray_hands_it_over(err)
    assert isinstance(wrapped, InvalidParameter) and isinstance(wrapped, RayTaskError)  # what Ray raises

    def submit() -> None:
        raise wrapped

    with pytest.raises(InvalidParameter) as sync:
        raycalls.call_sync(submit, "page", deadline=Deadline.after(1))
    assert type(sync.value) is InvalidParameter and str(sync.value) == "limit must be at least 1, got 0"

    cursor = _as_ray_hands_it_over(MalformedCursor("the cursor is not one riqr made"))

    async def submit_async() -> None:
        raise cursor

    with pytest.raises(MalformedCursor) as in_async:
        asyncio.run(raycalls.call(submit_async, "page"))
    assert type(in_async.value) is MalformedCursor and "Traceback" not in str(in_async.value)
    assert raycalls.translate(wrapped, "page") is err
    plain = InvalidParameter("as raised here")
    assert raycalls.unwrapped(plain) is plain
