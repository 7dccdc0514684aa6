"""Which format an answer takes from the Accept header (runtime/rest/render.py ``negotiate``)."""

from __future__ import annotations

import pytest

from runtime.rest.render import JSON, MSGPACK, NDJSON, negotiate

ANSWER = (JSON, MSGPACK)
SCAN = (JSON, NDJSON, MSGPACK)


@pytest.mark.parametrize(
    ("accept", "answer", "scan"),
    [
        ("", JSON, JSON),
        ("*/*", JSON, JSON),
        (MSGPACK, MSGPACK, MSGPACK),
        (NDJSON, JSON, NDJSON),  # a lookup has no stream form: JSON
        ("application/json, application/msgpack", JSON, JSON),  # equal weights: the one listed first
        ("application/msgpack, application/json", MSGPACK, MSGPACK),
        ("application/msgpack, application/x-ndjson", MSGPACK, MSGPACK),
        ("application/x-ndjson, application/msgpack", MSGPACK, NDJSON),
        ("application/json, application/x-ndjson;q=0", JSON, JSON),  # q=0: not acceptable
        ("application/x-ndjson;q=0.5, application/json", JSON, JSON),  # the higher weight wins
        ("application/msgpack;q=0", JSON, JSON),
        ("*/*;q=0, application/x-ndjson", JSON, NDJSON),
        ("application/*;q=0.2, application/msgpack;q=0.1", JSON, JSON),  # the most specific range decides
        ("APPLICATION/MSGPACK", MSGPACK, MSGPACK),
        ("application/msgpack;q=oops, application/json;q=0.1", JSON, JSON),  # an unreadable weight counts 0
        ("text/xml", JSON, JSON),  # none acceptable: JSON rather than 406
        ("text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", JSON, JSON),  # a browser
        ("application/json;q=0", JSON, JSON),
        (" application/msgpack ; q=0.9 , application/json ; q=0.8", MSGPACK, MSGPACK),
        ("application/json;q=0.5, */*", JSON, JSON),  # a wildcard stands for JSON: no stream unless named
        ("application/*", JSON, JSON),
        ("text/plain, " * 40 + "application/msgpack", JSON, JSON),  # past the first 32 ranges: not read
    ],
)
def test_the_accept_header_picks_the_format_by_weight_then_by_the_clients_order(
    accept: str, answer: str, scan: str
) -> None:
    assert (negotiate(accept, ANSWER), negotiate(accept, SCAN)) == (answer, scan)


@pytest.mark.parametrize(
    ("lines", "answer", "scan"),
    [
        ([], JSON, JSON),
        (["application/json"], JSON, JSON),
        (["application/json;q=0.5", "application/x-ndjson"], JSON, NDJSON),  # the second line is read too
        (["application/x-ndjson;q=0", "application/msgpack"], MSGPACK, MSGPACK),
    ],
)
def test_an_accept_header_sent_on_several_lines_is_one_list(lines: list[str], answer: str, scan: str) -> None:
    from aiohttp.test_utils import make_mocked_request
    from multidict import CIMultiDict

    from runtime.rest.render import wants_msgpack, wants_ndjson

    request = make_mocked_request("GET", "/store/s/all", headers=CIMultiDict(("Accept", line) for line in lines))
    assert (wants_msgpack(request), wants_ndjson(request)) == (answer == MSGPACK, scan == NDJSON)
