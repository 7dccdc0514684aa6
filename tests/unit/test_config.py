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


@pytest.mark.parametrize(
    ("field", "value"),
    [("http_port", 65536), ("http_port", -1), ("request_timeout", 0.0), ("request_timeout", float("nan")),
     ("request_timeout", float("inf"))],
)  # fmt: skip
def test_a_runtime_config_no_verticle_can_serve_is_refused_where_it_is_made(field: str, value: float) -> None:
    from runtime.config import RuntimeConfig

    with pytest.raises(ValueError, match=field):
        RuntimeConfig(**{field: value})
    assert RuntimeConfig(http_port=0).http_port == 0 and RuntimeConfig(http_port=65535).http_port == 65535


def test_an_ipv6_endpoint_is_written_in_brackets() -> None:
    """``http://::1:7400`` was printed by riqr up and riqr status: no client reads it."""
    from riqr.status import endpoint_rows
    from runtime.config import http_url

    assert http_url("::1", 7400) == "http://[::1]:7400" and http_url("[::1]", 80) == "http://[::1]:80"
    assert http_url("10.0.0.9", 7400) == "http://10.0.0.9:7400"
    assert endpoint_rows({"node-a": ("fe80::1", 7400)})[0][1] == "http://[fe80::1]:7400/"
