"""``AuthConfig`` from the environment, its refusals of unsafe settings, and the pure auth functions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from runtime.auth import ANONYMOUS, AuthConfig, Principal, authenticate, authorize, generate_secret, mint_token, visible
from runtime.errors import Forbidden, Unauthorized

SECRET = generate_secret()


def _ec_pem(curve: ec.EllipticCurve | None = None) -> str:
    key = ec.generate_private_key(curve or ec.SECP256R1())
    pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem.decode("ascii")


def test_auth_is_off_when_nothing_is_configured() -> None:
    assert AuthConfig.from_env({}).enabled is False


def test_a_configured_secret_turns_auth_on_unless_explicitly_off() -> None:
    assert AuthConfig.from_env({"RIQR_JWT_SECRET": SECRET}).enabled is True
    assert AuthConfig.from_env({"RIQR_JWT_SECRET": SECRET, "RIQR_AUTH": "off"}).enabled is False


def test_auth_on_without_a_key_is_refused_at_startup() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        AuthConfig.from_env({"RIQR_AUTH": "on"})
    with pytest.raises(ValueError, match="'on' or 'off'"):
        AuthConfig.from_env({"RIQR_AUTH": "yes", "RIQR_JWT_SECRET": SECRET})


def test_a_deployments_auth_follows_riqr_auth_and_on_without_a_key_is_its_own_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``riqr up``/``riqr demo``: secure by default with a generated secret; ``RIQR_AUTH=off`` turns auth off
    as ``--no-auth`` does; ``on`` with no key of the operator's is the generated secret, not a refusal."""
    from types import SimpleNamespace

    from riqr.access import rest_auth
    from verticles import deploy

    generated = generate_secret()
    monkeypatch.setattr(deploy, "deployment_secrets", lambda namespace: SimpleNamespace(jwt_secret=generated))
    for environ in ({}, {"RIQR_AUTH": "on"}, {"RIQR_AUTH": " ON "}):
        auth = rest_auth("ns", disabled=False, environ=environ)
        assert auth.enabled and auth.secret == generated, environ
    assert not rest_auth("ns", disabled=False, environ={"RIQR_AUTH": "off"}).enabled
    assert not rest_auth("ns", disabled=False, environ={"RIQR_AUTH": "off", "RIQR_JWT_SECRET": SECRET}).enabled
    assert not rest_auth("ns", disabled=True, environ={"RIQR_AUTH": "on"}).enabled
    own = rest_auth("ns", disabled=False, environ={"RIQR_AUTH": "on", "RIQR_JWT_SECRET": SECRET})
    assert own.enabled and own.secret == SECRET  # the operator's key wins over the generated one
    with pytest.raises(ValueError, match="'on' or 'off'"):
        rest_auth("ns", disabled=False, environ={"RIQR_AUTH": "maybe"})


def test_the_fingerprint_tells_auth_settings_apart_and_never_shows_a_key() -> None:
    on = AuthConfig(enabled=True, secret=SECRET)
    assert AuthConfig().fingerprint() == AuthConfig(secret=SECRET).fingerprint() == "off"
    assert on.fingerprint() == AuthConfig(enabled=True, secret=SECRET).fingerprint()
    assert on.fingerprint().startswith("on:") and SECRET not in on.fingerprint()
    others = [
        AuthConfig(enabled=True, secret=generate_secret()),
        AuthConfig(enabled=True, public_key=_ec_pem()),
        AuthConfig(enabled=True, secret=SECRET, issuer="idp"),
        AuthConfig(enabled=True, secret=SECRET, audience=None),
        AuthConfig(enabled=True, secret=SECRET, leeway_seconds=0),
        AuthConfig(enabled=True, secret=SECRET, stores_claim="scope"),
        AuthConfig(enabled=True, secret=SECRET, acl={"orders": frozenset({"ops"})}),
    ]
    prints = [on.fingerprint()] + [other.fingerprint() for other in others]
    assert len(set(prints)) == len(prints)


def test_riqr_up_names_the_settings_a_running_verticle_kept() -> None:
    """``riqr up`` against verticles that run already: what they kept, said against what was asked."""
    from verticles.deploy import kept_settings

    on = AuthConfig(enabled=True, secret=SECRET).fingerprint()
    asked = {"host": "127.0.0.1", "port": 7400, "advertise_host": None, "auth": on}
    assert kept_settings(dict(asked), asked) == ()
    assert kept_settings({**asked, "auth": "off"}, asked) == ("REST auth off (asked: on)",)
    assert kept_settings(asked, {**asked, "auth": "off"}) == ("REST auth on (asked: off)",)
    other = AuthConfig(enabled=True, secret=generate_secret()).fingerprint()
    assert kept_settings({**asked, "auth": other}, asked) == ("REST auth with other keys or token settings than asked",)
    assert kept_settings({}, asked) == ("settings it cannot report (a verticle of an earlier riqr)",)
    moved = {**asked, "host": "0.0.0.0", "port": 0, "advertise_host": "10.0.0.5"}
    assert kept_settings(moved, asked) == (
        "listening on 0.0.0.0 (asked: 127.0.0.1)",
        "port any free one (asked: 7400)",
        "advertising 10.0.0.5 (asked: its bound address)",
    )


def test_every_variable_is_read(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "acl.json").write_text(json.dumps({"payments": ["finance", "audit"]}))
    config = AuthConfig.from_env(
        {
            "RIQR_JWT_SECRET_FILE": str(tmp_path / "secret"),
            "RIQR_JWT_ALGORITHMS": "HS256, HS512",
            "RIQR_JWT_ISSUER": "https://issuer.example",
            "RIQR_JWT_AUDIENCE": "riqr-prod",
            "RIQR_AUTH_ACL_FILE": str(tmp_path / "acl.json"),
        }
    )
    assert config.enabled and config.secret == SECRET  # the file's trailing newline is not part of it
    assert config.algorithms == ("HS256", "HS512")
    assert (config.issuer, config.audience) == ("https://issuer.example", "riqr-prod")
    assert config.acl == {"payments": frozenset({"finance", "audit"})}
    assert SECRET not in repr(config)


def test_a_public_key_file_selects_its_algorithm(tmp_path: Path) -> None:
    (tmp_path / "key.pem").write_text(_ec_pem())
    config = AuthConfig.from_env({"RIQR_JWT_PUBLIC_KEY_FILE": str(tmp_path / "key.pem")})
    assert config.enabled and config.algorithms == ("ES256",)


@pytest.mark.parametrize(
    ("curve", "algorithm"), [(ec.SECP256R1(), "ES256"), (ec.SECP384R1(), "ES384"), (ec.SECP521R1(), "ES512")]
)
def test_an_ec_key_takes_the_one_algorithm_of_its_curve(curve: ec.EllipticCurve, algorithm: str) -> None:
    """A P-384 key with ES256 (the default for any EC key before) started, and no token could ever pass:
    ES256 tokens cannot be made with it, and ES384 ones were not allowed. Refused at startup instead."""
    pem = _ec_pem(curve)
    assert AuthConfig(enabled=True, public_key=pem).algorithms == (algorithm,)
    for other in {"ES256", "ES384", "ES512"} - {algorithm}:
        with pytest.raises(ValueError, match=f"do not fit the configured key .*use {algorithm}"):
            AuthConfig(enabled=True, public_key=pem, algorithms=(other,))
    with pytest.raises(ValueError, match="unsupported EC curve secp256k1"):
        AuthConfig(enabled=True, public_key=_ec_pem(ec.SECP256K1()))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"secret": "short"}, "at least 32 bytes"),
        ({"secret": SECRET, "algorithms": ("RS256",)}, "do not fit"),
        ({"secret": SECRET, "algorithms": ("none",)}, "do not fit"),
        ({"public_key": "-----BEGIN PUBLIC KEY-----\nnope\n-----END PUBLIC KEY-----\n"}, "not a PEM public key"),
        ({"secret": SECRET, "public_key": "pem"}, "exactly one"),
    ],
    ids=["short-secret", "hs-secret-with-rs", "alg-none", "bad-pem", "both-keys"],
)
def test_unsafe_or_inconsistent_settings_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        AuthConfig(enabled=True, **kwargs)


def test_a_public_key_config_refuses_hmac_algorithms() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        AuthConfig(enabled=True, public_key=_ec_pem(), algorithms=("HS256",))


def test_acl_files_must_map_stores_to_role_lists(tmp_path: Path) -> None:
    for bad in ("[1]", '{"s": "finance"}', "{not json"):
        (tmp_path / "acl.json").write_text(bad)
        with pytest.raises(ValueError):
            AuthConfig.from_env({"RIQR_JWT_SECRET": SECRET, "RIQR_AUTH_ACL_FILE": str(tmp_path / "acl.json")})


def test_a_minted_token_authenticates_to_its_stores_and_roles() -> None:
    config = AuthConfig(enabled=True, secret=SECRET)
    token = mint_token(SECRET, stores=["a", "b"], roles=["ops"], subject="bob")
    assert authenticate(config, f"Bearer {token}") == Principal("bob", frozenset({"a", "b"}), frozenset({"ops"}))
    assert authenticate(config, f"bearer {token}").subject == "bob"  # the scheme is case-insensitive
    with pytest.raises(ValueError):
        mint_token("short")
    with pytest.raises(ValueError):
        mint_token(SECRET, ttl_seconds=0)


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"RIQR_JWT_STORES_CLAIM": "scope"},
        {"RIQR_JWT_STORES_CLAIM": "scope", "RIQR_JWT_ROLES_CLAIM": "scope"},
        {"RIQR_JWT_ALGORITHMS": "HS512"},
        {"RIQR_JWT_ALGORITHMS": "HS384,HS256", "RIQR_JWT_ISSUER": "ops", "RIQR_JWT_AUDIENCE": ""},
        {"ACL": '{"payments": ["finance", "audit"], "orders": ["ops"]}'},
    ],
    ids=["defaults", "stores-claim", "one-claim", "hs512", "hs384-issuer-no-audience", "acl"],
)
def test_the_token_riqr_prints_reads_its_stores_under_every_setting_of_the_rest_api(
    settings: dict[str, str], tmp_path: Path
) -> None:
    from riqr.access import token_for

    env = {"RIQR_JWT_SECRET": generate_secret(), **settings}  # 64 bytes: long enough for HS512
    if "ACL" in env:
        (tmp_path / "acl.json").write_text(env.pop("ACL"))
        env["RIQR_AUTH_ACL_FILE"] = str(tmp_path / "acl.json")
    config = AuthConfig.from_env(env)
    # A token for every store reads every store, the ACL's among them (the Prometheus scrape token of
    # docs/operations.md needs that for /metrics); one for some stores reads those and only those.
    everything = authenticate(config, f"Bearer {token_for(config)}")
    assert all(visible(config, everything, s) for s in ("payments", "orders", "other"))
    some = authenticate(config, f"Bearer {token_for(config, ['payments'])}")
    assert visible(config, some, "payments") and not visible(config, some, "orders")


def test_a_secret_shorter_than_its_algorithms_hash_is_refused() -> None:
    short = "s" * 40  # enough for HS256 only
    assert AuthConfig(enabled=True, secret=short).algorithms == ("HS256",)
    for algorithm, need in (("HS384", 48), ("HS512", 64)):
        with pytest.raises(ValueError, match=f"at least {need} bytes for {algorithm}"):
            AuthConfig(enabled=True, secret=short, algorithms=("HS256", algorithm))
        with pytest.raises(ValueError, match=f"at least {need} bytes"):
            mint_token(short, algorithm=algorithm)
    assert len(generate_secret()) >= 64


def test_claims_may_be_space_separated_like_oauth_scope() -> None:
    config = AuthConfig(enabled=True, secret=SECRET, roles_claim="scope")
    token = mint_token(SECRET, stores=["a"])
    claims = jwt.decode(token, SECRET, algorithms=["HS256"], audience="riqr")
    scoped = jwt.encode({**claims, "stores": "a b", "scope": "read ops"}, SECRET, algorithm="HS256")
    assert authenticate(config, f"Bearer {scoped}") == Principal("riqr", frozenset("ab"), frozenset({"read", "ops"}))


def test_visible_and_authorize_agree() -> None:
    config = AuthConfig(enabled=True, secret=SECRET, acl={"payments": {"finance", "audit"}})
    reader = Principal("r", frozenset({"orders", "payments"}), frozenset({"finance"}))
    assert visible(config, reader, "orders") and not visible(config, reader, "payments")  # needs both roles
    assert not visible(config, reader, "customers")
    authorize(config, reader, "orders")
    with pytest.raises(Forbidden) as refused:
        authorize(config, reader, "payments")
    assert refused.value.status == 403 and refused.value.details == {"store": "payments"}
    every = Principal("e", frozenset({"*"}), frozenset({"finance", "audit"}))
    assert all(visible(config, every, s) for s in ("orders", "payments", "anything"))


def test_auth_off_lets_anyone_read() -> None:
    config = AuthConfig()
    assert authenticate(config, None) is ANONYMOUS
    assert visible(config, Principal("x"), "payments")


def test_unauthorized_never_chains_pyjwts_message() -> None:
    config = AuthConfig(enabled=True, secret=SECRET)
    with pytest.raises(Unauthorized) as refused:
        authenticate(config, "Bearer eyJhbGciOiJIUzI1NiJ9.e30.c2ln")
    assert refused.value.__cause__ is None and refused.value.__suppress_context__


@pytest.mark.parametrize("leeway", ["nan", "inf", "-1"])
def test_a_leeway_that_would_let_expired_tokens_in_is_refused(leeway: str) -> None:
    """``exp <= now - leeway`` is never true for nan or inf: every expired token would be accepted."""
    with pytest.raises(ValueError, match="finite number of seconds"):
        AuthConfig(enabled=True, secret=SECRET, leeway_seconds=float(leeway))


@pytest.mark.parametrize("variable", ["RIQR_JWT_SECRET_FILE", "RIQR_JWT_PUBLIC_KEY_FILE", "RIQR_AUTH_ACL_FILE"])
def test_a_file_setting_that_cannot_be_read_is_named(tmp_path: Path, variable: str) -> None:
    env = {variable: str(tmp_path / "absent")}
    if variable == "RIQR_AUTH_ACL_FILE":
        env["RIQR_JWT_SECRET"] = SECRET
    with pytest.raises(ValueError, match=f"^{variable} .*absent: cannot read it \\(No such file or directory\\)$"):
        AuthConfig.from_env(env)
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00key")
    with pytest.raises(ValueError, match=f"^{variable} .*binary: not UTF-8 text"):
        AuthConfig.from_env({**env, variable: str(tmp_path / "binary")})
    with pytest.raises(ValueError, match="^RIQR_JWT_LEEWAY_SECONDS must be a number of seconds, got 'soon'$"):
        AuthConfig.from_env({"RIQR_JWT_SECRET": SECRET, "RIQR_JWT_LEEWAY_SECONDS": "soon"})


def test_a_secret_file_others_can_read_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    secret.chmod(0o644)
    with caplog.at_level("WARNING", logger="runtime.auth"):
        assert AuthConfig.from_env({"RIQR_JWT_SECRET_FILE": str(secret)}).secret == SECRET
    assert "can be read by other users (mode 644): chmod 600 it" in caplog.text
    assert SECRET not in caplog.text
    caplog.clear()
    secret.chmod(0o600)
    with caplog.at_level("WARNING", logger="runtime.auth"):
        AuthConfig.from_env({"RIQR_JWT_SECRET_FILE": str(secret)})
    assert "chmod" not in caplog.text
