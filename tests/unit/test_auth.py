"""Bearer-token auth over real HTTP: a small app behind ``auth_middleware``, tokens good and hostile."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
from typing import Any

import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from runtime.auth import ANONYMOUS, PRINCIPAL, AuthConfig, TokenCache, auth_middleware, generate_secret, mint_token
from runtime.errors import Unauthorized

SECRET = generate_secret()
CHALLENGE = 'Bearer realm="riqr"'


def _pem(private_key: Any) -> str:
    public = private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return public.decode("ascii")


@pytest.fixture(scope="module")
def rsa_key() -> Any:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def ec_key() -> Any:
    return ec.generate_private_key(ec.SECP256R1())


def _claims(**overrides: Any) -> dict[str, Any]:
    now = int(time.time())
    claims: dict[str, Any] = {"sub": "alice", "aud": "riqr", "iat": now, "exp": now + 600, "stores": ["orders"]}
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def _hs256(**overrides: Any) -> str:
    return jwt.encode(_claims(**overrides), SECRET, algorithm="HS256")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _hand_made(header: dict[str, Any], claims: dict[str, Any], key: bytes | None) -> str:
    """A token built by hand, for what pyjwt refuses to produce (alg none, HMAC keyed with a public key)."""
    signing_input = _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    signature = b"" if key is None else hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + _b64(signature)


def _app(config: AuthConfig) -> web.Application:
    async def whoami(request: web.Request) -> web.Response:
        principal = request[PRINCIPAL]
        return web.json_response({"subject": principal.subject, "store": request.match_info.get("store")})

    async def health(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(middlewares=[auth_middleware(config)])
    app.router.add_get("/health", health)
    app.router.add_get("/ready", health)
    app.router.add_get("/stores", whoami)
    app.router.add_get("/stores/{store}/get/{key:.*}", whoami)
    app.router.add_get("/metadata/stores/{store}", whoami)
    return app


HS = AuthConfig(enabled=True, secret=SECRET, issuer="https://issuer.example", acl={"payments": {"finance"}})


@pytest.fixture
async def client(aiohttp_client: Any) -> Any:
    return await aiohttp_client(_app(HS))


NO_BEARER = "missing bearer token: send 'Authorization: Bearer <token>'"


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def _refused(resp: Any, status: int, message: str) -> None:
    body = await resp.json()
    assert resp.status == status, body
    assert body["error"]["code"] == ("unauthorized" if status == 401 else "forbidden")
    assert body["error"]["message"] == message
    if status == 401:  # RFC 6750, 3.1: a token sent and refused says invalid_token; none sent, the bare challenge
        refused = message in ("invalid token", "token expired", "token not yet valid")
        assert resp.headers["WWW-Authenticate"] == (CHALLENGE + ', error="invalid_token"' if refused else CHALLENGE)


async def test_a_valid_hs256_token_reads_the_stores_it_names(client: Any) -> None:
    resp = await client.get("/stores/orders/get/1", headers=_bearer(_hs256(iss="https://issuer.example")))
    assert resp.status == 200
    assert await resp.json() == {"subject": "alice", "store": "orders"}


async def test_no_token_is_401_with_a_bearer_challenge(client: Any) -> None:
    await _refused(await client.get("/stores/orders/get/1"), 401, NO_BEARER)


@pytest.mark.parametrize("header", ["Basic dXNlcjpwdw==", "Bearer", "Bearer ", "Bearer a b", "token", "Bearer\tx"])
async def test_a_malformed_authorization_header_is_401(client: Any, header: str) -> None:
    resp = await client.get("/stores/orders/get/1", headers={"Authorization": header})
    assert resp.status == 401 and resp.headers["WWW-Authenticate"] == CHALLENGE
    assert (await resp.json())["error"]["message"] == NO_BEARER  # one wording, whatever was sent


async def test_garbage_in_place_of_a_token_is_401(client: Any) -> None:
    for token in ("not-a-jwt", "a.b.c", "\u00e9t\u00e9.x.y", "x" * 4000):
        await _refused(await client.get("/stores/orders/get/1", headers=_bearer(token)), 401, "invalid token")


async def test_an_expired_token_is_401_token_expired(client: Any) -> None:
    token = _hs256(iss="https://issuer.example", exp=int(time.time()) - 3600)
    await _refused(await client.get("/stores/orders/get/1", headers=_bearer(token)), 401, "token expired")


async def test_a_token_not_yet_valid_is_401(client: Any) -> None:
    token = _hs256(iss="https://issuer.example", nbf=int(time.time()) + 3600)
    await _refused(await client.get("/stores/orders/get/1", headers=_bearer(token)), 401, "token not yet valid")
    token = _hs256(iss="https://issuer.example", iat=int(time.time()) + 3600)  # issued in the future
    await _refused(await client.get("/stores/orders/get/1", headers=_bearer(token)), 401, "token not yet valid")


def test_the_leeway_stretches_both_ends_of_a_tokens_window() -> None:
    """The times are checked by riqr (pyjwt's checks are off, its rule kept): within the leeway of its
    expiry or of its start a token still verifies, past it not."""
    from runtime.auth import AuthConfig, authenticate

    config = AuthConfig(enabled=True, secret=SECRET, leeway_seconds=30)
    now = int(time.time())
    assert authenticate(config, f"Bearer {_hs256(exp=now - 10)}").subject == "alice"
    assert authenticate(config, f"Bearer {_hs256(nbf=now + 10)}").subject == "alice"
    with pytest.raises(Unauthorized, match="token expired"):
        authenticate(config, f"Bearer {_hs256(exp=now - 60)}")
    with pytest.raises(Unauthorized, match="token not yet valid"):
        authenticate(config, f"Bearer {_hs256(nbf=now + 60)}")


@pytest.mark.parametrize(
    "overrides",
    [
        {"aud": "someone-else"},
        {"aud": None},
        {"iss": "https://evil.example"},
        {"iss": None},
        {"exp": None},
        {"iss": "https://issuer.example", "stores": {"orders": True}},
        {"exp": str(int(time.time()) + 3600)},  # pyjwt reads a NumericDate written as text with int()
        {"iat": str(int(time.time()))},
        {"nbf": "0"},
        {"exp": True},  # read by pyjwt as 1, and the token called expired: not a NumericDate at all
        {"iat": True},
        {"exp": float("nan")},  # JSON's NaN, which Python's json reads: never expired by a comparison
        {"exp": float("inf")},
    ],
    ids=[
        "wrong-audience",
        "no-audience",
        "wrong-issuer",
        "no-issuer",
        "no-expiry",
        "stores-not-a-list",
        "expiry-as-text",
        "issued-at-as-text",
        "not-before-as-text",
        "expiry-true",
        "issued-at-true",
        "expiry-nan",
        "expiry-infinite",
    ],  # fmt: skip
)
async def test_tokens_failing_a_claim_check_are_401_invalid_token(client: Any, overrides: dict[str, Any]) -> None:
    token = _hs256(**{"iss": "https://issuer.example", **overrides})
    await _refused(await client.get("/stores/orders/get/1", headers=_bearer(token)), 401, "invalid token")


async def test_two_authorization_headers_are_401_whichever_is_good(client: Any) -> None:
    from multidict import CIMultiDict

    good = f"Bearer {_hs256(iss='https://issuer.example')}"
    for pair in ((good, "Bearer junk"), ("Bearer junk", good), (good, good)):
        headers = CIMultiDict([("Authorization", pair[0]), ("Authorization", pair[1])])
        await _refused(
            await client.get("/stores/orders/get/1", headers=headers), 401, "more than one Authorization header"
        )
    resp = await client.get("/stores/orders/get/1", headers={"Authorization": good})
    assert resp.status != 401


async def test_a_token_signed_with_another_secret_is_401(client: Any) -> None:
    token = jwt.encode(_claims(iss="https://issuer.example"), generate_secret(), algorithm="HS256")
    await _refused(await client.get("/stores/orders/get/1", headers=_bearer(token)), 401, "invalid token")


async def test_an_unsigned_alg_none_token_is_401(client: Any) -> None:
    token = _hand_made({"alg": "none", "typ": "JWT"}, _claims(iss="https://issuer.example"), None)
    await _refused(await client.get("/stores/orders/get/1", headers=_bearer(token)), 401, "invalid token")


async def test_a_store_outside_the_tokens_stores_is_403(client: Any) -> None:
    token = _hs256(iss="https://issuer.example")
    for path in ("/stores/customers/get/1", "/metadata/stores/customers"):
        resp = await client.get(path, headers=_bearer(token))
        await _refused(resp, 403, "not allowed to read store 'customers'")
    # A store that does not exist gets the same answer: a 403 reveals nothing about which stores exist.
    await _refused(
        await client.get("/stores/nope/get/1", headers=_bearer(token)), 403, "not allowed to read store 'nope'"
    )


async def test_the_acl_asks_for_roles_on_top_of_the_stores_claim(client: Any) -> None:
    without = _hs256(iss="https://issuer.example", stores=["*"], roles=["support"])
    await _refused(
        await client.get("/stores/payments/get/1", headers=_bearer(without)),
        403,
        "not allowed to read store 'payments'",
    )
    with_role = _hs256(iss="https://issuer.example", stores=["*"], roles=["support", "finance"])
    assert (await client.get("/stores/payments/get/1", headers=_bearer(with_role))).status == 200
    assert (await client.get("/stores/orders/get/1", headers=_bearer(without))).status == 200


async def test_public_paths_need_no_token_and_listings_need_one(client: Any) -> None:
    assert (await client.get("/health")).status == 200
    assert (await client.get("/ready")).status == 200
    await _refused(await client.get("/stores"), 401, NO_BEARER)
    assert (await client.get("/stores", headers=_bearer(_hs256(iss="https://issuer.example")))).status == 200
    # Unknown paths need a token too, so routes are not discoverable by strangers.
    await _refused(await client.get("/secret/admin"), 401, NO_BEARER)


@pytest.mark.parametrize("family", ["RS256", "ES256"])
async def test_asymmetric_tokens_verify_with_the_public_key(
    aiohttp_client: Any, rsa_key: Any, ec_key: Any, family: str
) -> None:
    private = rsa_key if family == "RS256" else ec_key
    config = AuthConfig(enabled=True, public_key=_pem(private))
    assert config.algorithms == (family,)
    client = await aiohttp_client(_app(config))
    token = jwt.encode(_claims(), private, algorithm=family)
    resp = await client.get("/stores/orders/get/1", headers=_bearer(token))
    assert resp.status == 200 and (await resp.json())["subject"] == "alice"
    other = rsa.generate_private_key(65537, 2048) if family == "RS256" else ec.generate_private_key(ec.SECP256R1())
    forged = jwt.encode(_claims(), other, algorithm=family)
    await _refused(await client.get("/stores/orders/get/1", headers=_bearer(forged)), 401, "invalid token")


async def test_an_hmac_token_keyed_with_the_public_key_is_refused(aiohttp_client: Any, rsa_key: Any) -> None:
    # Algorithm confusion: a verifier that accepted HS256 would check this with the (public!) PEM as secret.
    pem = _pem(rsa_key)
    client = await aiohttp_client(_app(AuthConfig(enabled=True, public_key=pem)))
    token = _hand_made({"alg": "HS256", "typ": "JWT"}, _claims(), pem.encode())
    await _refused(await client.get("/stores/orders/get/1", headers=_bearer(token)), 401, "invalid token")


async def test_with_auth_off_everyone_is_anonymous_and_may_read(aiohttp_client: Any) -> None:
    client = await aiohttp_client(_app(AuthConfig(enabled=False)))
    resp = await client.get("/stores/payments/get/1")
    assert resp.status == 200 and (await resp.json())["subject"] == "anonymous"


async def test_secrets_and_tokens_never_reach_repr_or_logs(client: Any, caplog: pytest.LogCaptureFixture) -> None:
    assert SECRET not in repr(HS) and SECRET not in str(HS) and "<hidden>" in repr(HS)
    caplog.set_level(logging.DEBUG)
    good = _hs256(iss="https://issuer.example")
    tokens = [
        good,
        _hs256(iss="https://issuer.example", exp=int(time.time()) - 3600),
        _hs256(aud="x"),
        good[:-4] + "AAAA",
        mint_token(SECRET, stores=["x"], issuer="https://issuer.example"),
    ]
    for token in tokens:
        await client.get("/stores/payments/get/1", headers=_bearer(token))
    assert caplog.records, "refusals are logged (without the token)"
    for token in tokens:
        assert token not in caplog.text and token.split(".")[2] not in caplog.text
    assert SECRET not in caplog.text


# -- the cache of verified tokens -----------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def _hs_with_issuer(**overrides: Any) -> str:
    return _hs256(iss="https://issuer.example", **overrides)


def test_a_cached_token_answers_without_verifying_again(monkeypatch: pytest.MonkeyPatch) -> None:
    cache = TokenCache(HS)
    token = _hs_with_issuer()
    first = cache.authenticate(f"Bearer {token}")
    calls = []
    monkeypatch.setattr(jwt, "decode", lambda *a, **k: calls.append(1))  # would fail if it ran
    assert cache.authenticate(f"Bearer {token}") == first
    assert first.subject == "alice" and calls == []


def _counting_decode(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = jwt.decode

    def decode(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode", decode)
    return calls


def test_a_cached_token_is_verified_again_once_past_its_expiry(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    now = int(clock.now)
    cache = TokenCache(HS, clock=clock)
    token = _hs_with_issuer(iat=now, exp=now + 60)
    calls = _counting_decode(monkeypatch)
    cache.authenticate(f"Bearer {token}")
    clock.now = now + 60 + HS.leeway_seconds - 1  # within the leeway: pyjwt would still accept it
    assert cache.authenticate(f"Bearer {token}").subject == "alice"
    assert len(calls) == 1
    clock.now = now + 60 + HS.leeway_seconds  # past the window: pyjwt (on the real clock here) decides again
    cache.authenticate(f"Bearer {token}")
    assert len(calls) == 2


def test_an_expired_token_is_refused_and_not_cached() -> None:
    cache = TokenCache(HS)
    now = int(time.time())
    with pytest.raises(Unauthorized, match="token expired"):
        cache.authenticate(f"Bearer {_hs_with_issuer(iat=now - 600, exp=now - 300)}")
    assert len(cache) == 0


def test_a_token_not_yet_valid_is_not_served_early_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    now = int(clock.now)
    token = _hs_with_issuer(nbf=now + 10)
    cache = TokenCache(HS, clock=clock)
    calls = _counting_decode(monkeypatch)
    cache.authenticate(f"Bearer {token}")  # valid now: nbf is within the 30 s leeway
    clock.now = now - 30  # before nbf - leeway: the cached verdict does not hold there
    cache.authenticate(f"Bearer {token}")
    assert len(calls) == 2


def test_refused_tokens_are_not_cached_and_the_cache_is_bounded() -> None:
    cache = TokenCache(HS, size=2)
    for _ in range(2):
        with pytest.raises(Unauthorized):
            cache.authenticate("Bearer not-a-token")
    assert len(cache) == 0
    tokens = [_hs_with_issuer(sub=f"user{i}") for i in range(3)]
    for token in tokens:
        cache.authenticate(f"Bearer {token}")
    assert len(cache) == 2
    assert cache.authenticate(f"Bearer {tokens[0]}").subject == "user0"  # dropped, verified again
    with pytest.raises(Unauthorized, match="missing bearer token"):
        cache.authenticate(None)


def test_the_cache_with_auth_off_is_anonymous() -> None:
    assert TokenCache(AuthConfig()).authenticate(None) == ANONYMOUS
