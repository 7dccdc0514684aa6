import pickle

import pytest

from runtime import errors as E

ALL = [getattr(E, name) for name in E.__all__]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_error_round_trips_through_pickle_with_its_details(cls: type[E.RiqrError]) -> None:
    err = cls("something went wrong", store="s", partition=3)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls
    assert back.message == "something went wrong"
    assert back.details == {"store": "s", "partition": 3}
    assert back.status == cls.status
    assert back == err


def test_statuses_follow_the_contract() -> None:
    assert E.MalformedKey("x").status == 400
    assert E.MalformedRange("x").status == 400
    assert E.StoreNotFound("x").status == 404
    assert E.KeyNotFound("x").status == 404
    assert E.PartitionUnavailable("x").status == 503
    assert E.OwnerUnavailable("x").status == 503
    assert E.DeadlineExceeded("x").status == 504
    assert E.StoreConflict("x").status == 409


def test_unavailable_errors_ask_for_retry_after() -> None:
    assert E.PartitionUnavailable("x").headers() == {"Retry-After": "1"}
    assert E.OwnerUnavailable("x", retry_after=5).headers() == {"Retry-After": "5"}
    assert E.KeyNotFound("x").headers() == {}


def test_json_body_names_the_code_and_details() -> None:
    body = E.KeyNotFound("key '9' is not in store 'o'", store="o", key="9").to_json()
    assert body == {
        "error": {"code": "key-not-found", "message": "key '9' is not in store 'o'", "store": "o", "key": "9"}
    }


def test_auth_errors_are_401_with_a_bearer_challenge_and_403() -> None:
    assert E.Unauthorized("missing bearer token").status == 401
    assert E.Unauthorized("x").headers() == {"WWW-Authenticate": 'Bearer realm="riqr"'}
    refused = E.TokenRefused("token expired")  # a token was sent (RFC 6750, 3.1)
    assert refused.headers() == {"WWW-Authenticate": 'Bearer realm="riqr", error="invalid_token"'}
    assert isinstance(refused, E.Unauthorized) and (refused.status, refused.code) == (401, "unauthorized")
    assert E.Unauthorized("x").to_json() == {"error": {"code": "unauthorized", "message": "x"}}
    assert E.Forbidden("x").status == 403
    assert E.Forbidden("x").code == "forbidden"
