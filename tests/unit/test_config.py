"""Settings read from the environment (runtime/config.py)."""

from __future__ import annotations

import logging

import pytest

from runtime.config import ROCKSDB_CACHE_ENV, rocksdb_cache_bytes


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, 256 << 20),
        ("", 256 << 20),
        ("64", 64 << 20),
        (" 0.5 ", 1 << 19),  # fractions of a MiB, spaces around
        ("1e-9", 1),  # never a zero-byte cache
    ],
)
def test_the_rocksdb_cache_is_read_in_mebibytes(raw: str | None, expected: int) -> None:
    environ = {} if raw is None else {ROCKSDB_CACHE_ENV: raw}
    assert rocksdb_cache_bytes(environ) == expected


@pytest.mark.parametrize("raw", ["abc", "-5", "0", "nan", "inf", "256MB"])
def test_a_cache_size_that_is_not_a_positive_number_is_said_and_the_default_used(
    raw: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="runtime.config"):
        assert rocksdb_cache_bytes({ROCKSDB_CACHE_ENV: raw}) == 256 << 20
    assert f"{ROCKSDB_CACHE_ENV}={raw!r} is not a positive number of MiB; using 256" in caplog.text
