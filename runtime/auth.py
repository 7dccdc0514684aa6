"""Bearer-token authentication and per-store authorization for the REST API (pure: no Ray).

A REST caller sends ``Authorization: Bearer <JWT>``. The token is verified with either a shared secret
(HS256) or an issuer's PEM public key (RS256, ES256); never both in one configuration, so a public key
can never be mistaken for an HMAC secret (the classic algorithm-confusion attack), and ``none`` is
never accepted. Expiry is required; issuer and audience are checked when configured.

What a caller may read comes from the token: its ``stores`` claim lists store names (``"*"``: every
store). An operator can restrict a store further with an ACL: store name -> roles, all of which the
token's ``roles`` claim must hold. ``authenticate`` answers 401 (``Unauthorized``: who are you?),
``authorize`` 403 (``Forbidden``: you may not read this). A 403 does not depend on whether the store
exists, so a caller cannot probe for store names it may not read.

Secrets and tokens are never logged, never echoed in errors, and hidden in ``repr(AuthConfig)``.

Wiring: riqr's REST app runs ``Authenticator.check`` in its request pipeline (``runtime.rest.pipeline``);
another aiohttp app can use ``auth_middleware(config)``. A handler finds the caller as
``request[PRINCIPAL]`` and may filter listings with ``visible(config, principal, store)``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from aiohttp import hdrs, web
from aiohttp.typedefs import Handler, Middleware

from runtime import logs
from runtime.errors import Forbidden, TokenRefused, Unauthorized

__all__ = [
    "AuthConfig",
    "Principal",
    "ANONYMOUS",
    "PRINCIPAL",
    "PUBLIC_PATHS",
    "authenticate",
    "authorize",
    "TokenCache",
    "Verified",
    "visible",
    "Authenticator",
    "auth_middleware",
    "mint_token",
    "generate_secret",
    "DeploymentSecrets",
]

log = logging.getLogger(__name__)
# Refused tokens and requests: anyone can cause them, so their lines are throttled (``logs.Throttled``).
_REFUSALS = logs.Throttled(log)

DEFAULT_AUDIENCE = "riqr"
DEMO_TTL_SECONDS = 24 * 3600
PUBLIC_PATHS = frozenset({"/health", "/ready"})
# RFC 7518 3.2: an HMAC key must be at least as long as the hash output (32 bytes for HS256).
MIN_SECRET_BYTES = 32
_MIN_SECRET_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
_FAMILIES = {
    "HS": ("HS256", "HS384", "HS512"),
    "RSA": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"),
    # An EC key signs with the one algorithm of its curve (RFC 7518 3.4): a P-384 key cannot make an ES256
    # token, so a deployment allowing only ES256 with it would accept none.
    "EC P-256": ("ES256",),
    "EC P-384": ("ES384",),
    "EC P-521": ("ES512",),
}
_DEFAULT_ALGORITHM = {"HS": "HS256", "RSA": "RS256", "EC P-256": "ES256", "EC P-384": "ES384", "EC P-521": "ES512"}
_EC_CURVES = {"secp256r1": "EC P-256", "secp384r1": "EC P-384", "secp521r1": "EC P-521"}


@dataclass(frozen=True)
class Principal:
    """An authenticated caller: its ``subject`` (the token's ``sub``), the stores it may read, its roles."""

    subject: str
    stores: frozenset[str] = frozenset()
    roles: frozenset[str] = frozenset()

    def names_store(self, store: str) -> bool:
        """Whether the caller's token names ``store`` (or grants every store with ``*``)."""
        return "*" in self.stores or store in self.stores


ANONYMOUS = Principal("anonymous", frozenset({"*"}))
"""The caller when authentication is off: it may read everything, as riqr did before auth existed."""


@functools.lru_cache(maxsize=8)
def _public_key(pem: str) -> Any:
    """The key object of a PEM public key (parsed once, not on every request)."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        return load_pem_public_key(pem.encode("ascii"))
    except (ValueError, UnicodeEncodeError, TypeError) as exc:
        # The PEM is not secret, but a private key pasted here would be: say nothing about the content.
        raise ValueError("the JWT public key is not a PEM public key (a private key does not belong here)") from exc


def _key_family(public_key: str) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    key = _public_key(public_key)
    if isinstance(key, rsa.RSAPublicKey):
        return "RSA"
    if isinstance(key, ec.EllipticCurvePublicKey):
        family = _EC_CURVES.get(key.curve.name)
        if family is None:
            curves = "P-256 (ES256), P-384 (ES384) or P-521 (ES512)"
            raise ValueError(f"unsupported EC curve {key.curve.name}: use {curves}")
        return family
    raise ValueError(f"unsupported public key type {type(key).__name__}: use an RSA or EC key")


@dataclass(frozen=True, repr=False)
class AuthConfig:
    """How REST callers are authenticated and what they may read.

    ``secret`` (HS algorithms) or ``public_key`` (PEM; RS/PS or ES algorithms), exactly one of them when
    ``enabled``. ``algorithms`` default to HS256, RS256 or ES256 by the key. ``issuer`` and ``audience``
    are checked when not None. ``leeway_seconds`` allows for clock skew on ``exp``/``nbf``/``iat``.
    ``stores_claim`` names the claim listing readable stores; ``roles_claim`` the one with the roles that
    ``acl`` (store -> roles, all required) asks for. Both claims may be a list or a space-separated string.
    Treat ``acl`` as read-only (it is a copy of what was passed).
    """

    enabled: bool = False
    secret: str | None = None
    public_key: str | None = None
    algorithms: tuple[str, ...] = ()
    issuer: str | None = None
    audience: str | None = DEFAULT_AUDIENCE
    leeway_seconds: float = 30.0
    stores_claim: str = "stores"
    roles_claim: str = "roles"
    acl: Mapping[str, frozenset[str]] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        acl = {str(store): frozenset(roles) for store, roles in dict(self.acl).items()}
        object.__setattr__(self, "acl", acl)
        object.__setattr__(self, "algorithms", tuple(self.algorithms))
        if not math.isfinite(self.leeway_seconds) or self.leeway_seconds < 0:  # nan or inf: no token would expire
            raise ValueError(f"the JWT leeway must be a finite number of seconds, >= 0, got {self.leeway_seconds}")
        if not self.enabled:
            return
        if (self.secret is None) == (self.public_key is None):
            raise ValueError("auth needs exactly one of a JWT secret (HS256) or a PEM public key (RS256/ES256)")
        if self.secret is not None and len(self.secret.encode("utf-8")) < MIN_SECRET_BYTES:
            raise ValueError(f"the JWT secret must be at least {MIN_SECRET_BYTES} bytes; {_MAKE_ONE}")
        family = "HS" if self.secret is not None else _key_family(self.public_key or "")
        if not self.algorithms:
            object.__setattr__(self, "algorithms", (_DEFAULT_ALGORITHM[family],))
        wrong = [a for a in self.algorithms if a not in _FAMILIES[family]]
        if wrong:
            fits = ", ".join(_FAMILIES[family])
            raise ValueError(f"algorithms {', '.join(wrong)} do not fit the configured key ({family}); use {fits}")
        if self.secret is not None:
            _check_secret(self.secret, self.algorithms)

    def __repr__(self) -> str:
        # Hand-written so that no secret ever reaches a log line, a traceback or a debugger.
        return (
            f"AuthConfig(enabled={self.enabled}, secret={'<hidden>' if self.secret else None}, "
            f"public_key={'<PEM>' if self.public_key else None}, algorithms={self.algorithms}, "
            f"issuer={self.issuer!r}, audience={self.audience!r}, leeway_seconds={self.leeway_seconds}, "
            f"stores_claim={self.stores_claim!r}, roles_claim={self.roles_claim!r}, acl_stores={sorted(self.acl)})"
        )

    __str__ = __repr__

    def fingerprint(self) -> str:
        """``off``, or ``on:`` and a digest of every setting (keys included, hashed): two configurations
        verify and authorize alike exactly when their fingerprints match. ``riqr up`` compares what it
        asks for with what a running HTTP verticle serves. The digest is a one-way hash, but a short
        secret could be guessed from it offline: show it to operators, never to REST callers."""
        if not self.enabled:
            return "off"
        settings = [
            self.secret or "",
            self.public_key or "",
            list(self.algorithms),
            self.issuer,
            self.audience,
            self.leeway_seconds,
            self.stores_claim,
            self.roles_claim,
            sorted((store, sorted(roles)) for store, roles in self.acl.items()),
        ]
        digest = hashlib.sha256(b"riqr-auth-v1\0" + json.dumps(settings).encode("utf-8")).hexdigest()
        return "on:" + digest[:16]

    def roles_for(self, stores: Iterable[str]) -> frozenset[str]:
        """Every role the ACL asks of a reader of ``stores`` (``*``: of every store it lists)."""
        names = set(stores)
        return frozenset(role for store, roles in self.acl.items() if "*" in names or store in names for role in roles)

    @property
    def verification_key(self) -> Any:
        """What pyjwt verifies signatures with: the secret, or the parsed public key."""
        return self.secret if self.secret is not None else _public_key(self.public_key or "")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> AuthConfig:
        """The configuration in ``environ`` (default ``os.environ``); see docs/security.md.

        ``RIQR_AUTH`` is ``on`` or ``off``; unset, auth is on exactly when a secret or a public key is
        configured, so configuring a key is never silently ignored.
        """
        env = os.environ if environ is None else environ
        secret = _secret_from_env(env)
        key_file = env.get("RIQR_JWT_PUBLIC_KEY_FILE")
        public_key = _read_named("RIQR_JWT_PUBLIC_KEY_FILE", Path(key_file)) if key_file else None
        switch = env.get("RIQR_AUTH", "").strip().lower()
        if switch not in ("", "on", "off"):
            raise ValueError("RIQR_AUTH must be 'on' or 'off'")
        enabled = switch == "on" or (switch == "" and (secret is not None or public_key is not None))
        audience = env.get("RIQR_JWT_AUDIENCE", DEFAULT_AUDIENCE)
        acl_file = env.get("RIQR_AUTH_ACL_FILE")
        return cls(
            enabled=enabled,
            secret=secret,
            public_key=public_key,
            algorithms=tuple(a.strip() for a in env.get("RIQR_JWT_ALGORITHMS", "").split(",") if a.strip()),
            issuer=env.get("RIQR_JWT_ISSUER") or None,
            audience=audience or None,  # set but empty: do not check the audience
            leeway_seconds=_seconds_named("RIQR_JWT_LEEWAY_SECONDS", env.get("RIQR_JWT_LEEWAY_SECONDS", "30")),
            stores_claim=env.get("RIQR_JWT_STORES_CLAIM", "stores"),
            roles_claim=env.get("RIQR_JWT_ROLES_CLAIM", "roles"),
            acl=load_acl(Path(acl_file), "RIQR_AUTH_ACL_FILE") if acl_file else {},
        )


def _read_named(variable: str, path: Path) -> str:
    """The text of the file ``variable`` names, or ValueError naming both and why it cannot be read (a
    bare "No such file or directory" left the operator guessing which of the settings it was)."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{variable} {path}: cannot read it ({err.strerror or err})") from err
    except UnicodeDecodeError:
        raise ValueError(f"{variable} {path}: not UTF-8 text (a key file is PEM, a secret file text)") from None


def _seconds_named(variable: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{variable} must be a number of seconds, got {value!r}") from None


def _secret_from_env(env: Mapping[str, str]) -> str | None:
    secret, secret_file = env.get("RIQR_JWT_SECRET"), env.get("RIQR_JWT_SECRET_FILE")
    if secret and secret_file:
        raise ValueError("set RIQR_JWT_SECRET or RIQR_JWT_SECRET_FILE, not both")
    if secret_file:
        path = Path(secret_file)
        text = _read_named("RIQR_JWT_SECRET_FILE", path)
        mode = path.stat().st_mode
        if mode & 0o077:  # anyone else on the node who reads it mints tokens for every store
            log.warning("RIQR_JWT_SECRET_FILE %s can be read by other users (mode %o): chmod 600 it", path,
                        mode & 0o777)  # fmt: skip
        # A trailing newline from `echo > file` is not part of the secret.
        return text.rstrip("\r\n")
    return secret or None


def load_acl(path: Path, variable: str = "the ACL file") -> dict[str, frozenset[str]]:
    """An ACL file: a JSON object mapping each restricted store to the list of roles it requires."""
    try:
        raw = json.loads(_read_named(variable, path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from exc
    if not isinstance(raw, dict) or not all(
        isinstance(roles, list) and all(isinstance(r, str) for r in roles) for roles in raw.values()
    ):
        raise ValueError(f'{path}: expected {{"store": ["role", ...], ...}}')
    return {store: frozenset(roles) for store, roles in raw.items()}


def _names(claims: Mapping[str, Any], claim: str) -> frozenset[str]:
    """A claim holding names: a list of strings, or one space-separated string (as OAuth's ``scope``)."""
    value = claims.get(claim)
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset(value.split())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return frozenset(value)
    raise TokenRefused("invalid token")


# One wording for a request without a bearer token, whether it sent no Authorization header or another
# scheme's (Basic, a bare token), on every route.
_NO_BEARER = "missing bearer token: send 'Authorization: Bearer <token>'"


def _bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise Unauthorized(_NO_BEARER)
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or " " in token:
        raise Unauthorized(_NO_BEARER)
    return token


def authenticate(config: AuthConfig, authorization: str | None) -> Principal:
    """The caller behind an ``Authorization`` header value, or ``Unauthorized``.

    With auth disabled every caller is ``ANONYMOUS``. Failures say only "missing bearer token",
    "token expired", "token not yet valid" or "invalid token"; the reason is logged by exception type
    only, never with the token.
    """
    if not config.enabled:
        return ANONYMOUS
    return _verify(config, _bearer_token(authorization)).principal


@dataclass(frozen=True)
class Verified:
    """A token that verified: its caller, and the time window (epoch seconds, leeway included) in which
    verifying it again would succeed. Outside the window it must be verified again (and will fail)."""

    principal: Principal
    valid_from: float
    valid_until: float


def _verify(config: AuthConfig, token: str) -> Verified:
    # The times are checked here, after their types: pyjwt reads "exp": true as 1 and called the token
    # expired, where it is not a NumericDate at all (invalid).
    options: dict[str, Any] = {
        "require": ["exp"],
        "verify_aud": config.audience is not None,
        "verify_exp": False,
        "verify_nbf": False,
        "verify_iat": False,
    }
    try:
        claims = jwt.decode(
            token,
            config.verification_key,
            algorithms=list(config.algorithms),
            audience=config.audience,
            issuer=config.issuer,
            leeway=config.leeway_seconds,
            options=options,  # type: ignore[arg-type]
        )
    except (jwt.PyJWTError, ValueError, TypeError) as exc:
        # `from None`: pyjwt's message may quote parts of the token; it must not reach a traceback.
        _REFUSALS.info("rejected a bearer token: %s", type(exc).__name__)
        raise TokenRefused("invalid token") from None
    # RFC 7519 4.1.4-4.1.6: NumericDate is a JSON number; pyjwt reads "exp": "9999999999" with int(), so a
    # time written as text would pass its checks and not ours.
    for claim in ("exp", "nbf", "iat"):
        value = claims.get(claim)
        if claim in claims and (
            isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
        ):
            _REFUSALS.info("rejected a bearer token: its %s is not a number", claim)
            raise TokenRefused("invalid token")
    subject = claims.get("sub")
    principal = Principal(
        subject=subject if isinstance(subject, str) else "",
        stores=_names(claims, config.stores_claim),
        roles=_names(claims, config.roles_claim),
    )
    # Numbers, checked above (exp is required); nbf and iat must not be in the future.
    starts = [float(claims[c]) for c in ("nbf", "iat") if isinstance(claims.get(c), (int, float))]
    leeway = config.leeway_seconds
    verified = Verified(principal, max(starts, default=float("-inf")) - leeway, float(claims["exp"]) + leeway)
    now = time.time()  # pyjwt's rule, with its leeway: valid while exp + leeway is ahead, nbf and iat not
    if now >= verified.valid_until:
        raise TokenRefused("token expired")
    if now < verified.valid_from:
        raise TokenRefused("token not yet valid")
    return verified


class TokenCache:
    """Tokens that verified, so a client sending the same token again is not verified again on every
    request (an HS256 check and the JSON of the claims cost about a quarter of a key lookup's CPU in the
    HTTP verticle; docs/design.md, "Where a GET's time goes").

    Safe because verification is a pure function of the token, the configuration (fixed for the
    middleware's life) and the clock: a cached token is served only inside the window in which verifying
    it would succeed (``Verified``), and outside it is verified again, which raises. Failures are not
    cached. At most ``size`` tokens are kept; the oldest is dropped first. The cache holds tokens in the
    process's memory, as each request does anyway; it never logs them.
    """

    def __init__(self, config: AuthConfig, *, size: int = 4096, clock: Any = time.time) -> None:
        if size < 1:
            raise ValueError("the token cache needs room for at least one token")
        self._config = config
        self._size = size
        self._clock = clock
        self._tokens: dict[str, Verified] = {}

    def __len__(self) -> int:
        return len(self._tokens)

    def authenticate(self, authorization: str | None) -> Principal:
        """As ``authenticate(config, authorization)``, from the cache when the token verified before."""
        if not self._config.enabled:
            return ANONYMOUS
        if not authorization:
            raise Unauthorized(_NO_BEARER)  # as _bearer_token says it
        # Keyed by the header as sent, so a hit does not even parse it (the token in it is what verified).
        hit = self._tokens.get(authorization)
        if hit is not None:
            if hit.valid_from <= self._clock() < hit.valid_until:
                return hit.principal
            del self._tokens[authorization]
        verified = _verify(self._config, _bearer_token(authorization))
        if len(self._tokens) >= self._size:
            del self._tokens[next(iter(self._tokens))]
        self._tokens[authorization] = verified
        return verified.principal


def visible(config: AuthConfig, principal: Principal, store: str) -> bool:
    """Whether ``principal`` may read ``store``: named by its token and holding every role the ACL asks."""
    if not config.enabled:
        return True
    if not principal.names_store(store):
        return False
    return config.acl.get(store, frozenset()) <= principal.roles


def authorize(config: AuthConfig, principal: Principal, store: str) -> None:
    """Raise ``Forbidden`` unless ``principal`` may read ``store``."""
    if not visible(config, principal, store):
        raise Forbidden(f"not allowed to read store {store!r}", store=store)


PRINCIPAL: web.RequestKey[Principal] = web.RequestKey("principal", Principal)
"""The request key under which ``Authenticator`` leaves the authenticated caller."""


class Authenticator:
    """Who a request comes from, and whether it may read the store its route names: the check every REST
    request passes before its handler (``runtime.rest.pipeline``, or ``auth_middleware`` alone).

    Requests to ``public_paths`` (exact paths) need no token and get no principal. Unrouted paths still
    need one, so they reveal nothing to strangers. Verified tokens are cached (``TokenCache``).
    """

    def __init__(self, config: AuthConfig, *, public_paths: Iterable[str] = PUBLIC_PATHS) -> None:
        self.config = config
        self.public = frozenset(public_paths)
        self.tokens = TokenCache(config)

    def check(self, request: web.Request) -> None:
        """Return when the request may go on (its caller is then ``request[PRINCIPAL]``), else raise the
        ``Unauthorized`` (401) or ``Forbidden`` (403) to answer; riqr's pipeline renders it in the format
        the caller asked for, as any error."""
        if request.rel_url.raw_path in self.public:  # public paths are plain ASCII: raw is decoded
            return
        try:
            sent = request.headers.getall(hdrs.AUTHORIZATION, ())
            if len(sent) > 1:  # which one a proxy in front checked is anyone's guess: neither is taken
                raise Unauthorized("more than one Authorization header")
            principal = self.tokens.authenticate(sent[0] if sent else None)
            store = request.match_info.get("store")
            if store is not None:
                authorize(self.config, principal, store)
        except (Unauthorized, Forbidden) as err:
            _REFUSALS.info("%s %s -> %d %s", request.method, request.path, err.status, err.message)
            raise
        request[PRINCIPAL] = principal

    def refusal(self, request: web.Request) -> web.Response | None:
        """``check`` for a middleware: None when the request may go on, else the 401 or 403 to answer, as
        JSON in the app's error shape ``{"error": {"code", "message"}}``."""
        try:
            self.check(request)
        except (Unauthorized, Forbidden) as err:
            return web.json_response(err.to_json(), status=err.status, headers=err.headers())
        return None


def auth_middleware(config: AuthConfig, *, public_paths: Iterable[str] = PUBLIC_PATHS) -> Middleware:
    """An aiohttp middleware authenticating every request except ``public_paths`` (``Authenticator``), for
    apps other than riqr's own (whose one request pipeline runs the same check). Its refusals are rendered
    here, so it works wherever it sits in the middleware list."""
    authenticator = Authenticator(config, public_paths=public_paths)

    @web.middleware
    async def authenticate_request(request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = authenticator.refusal(request)
        return refusal if refusal is not None else await handler(request)

    return authenticate_request


def mint_token(
    secret: str,
    *,
    stores: Iterable[str] = ("*",),
    subject: str = "riqr",
    ttl_seconds: int = DEMO_TTL_SECONDS,
    issuer: str | None = None,
    audience: str | None = DEFAULT_AUDIENCE,
    roles: Iterable[str] = (),
    stores_claim: str = "stores",
    roles_claim: str = "roles",
    algorithm: str = "HS256",
) -> str:
    """A token for ``secret`` granting ``stores`` (and ``roles``) for ``ttl_seconds``, signed with
    ``algorithm`` (an HS one), the stores and roles in the claims an ``AuthConfig`` with these
    ``stores_claim`` and ``roles_claim`` reads (one claim holds both when they are the same)."""
    if algorithm not in _FAMILIES["HS"]:
        raise ValueError(f"a token minted with a secret is signed with one of {_FAMILIES['HS']}, not {algorithm}")
    _check_secret(secret, (algorithm,))
    if ttl_seconds <= 0:
        raise ValueError("ttl_seconds must be positive")
    now = int(time.time())
    claims: dict[str, Any] = {"sub": subject, "iat": now, "exp": now + ttl_seconds}
    claims[stores_claim] = list(stores)
    granted = list(roles)
    if granted:
        claims[roles_claim] = claims[roles_claim] + granted if roles_claim == stores_claim else granted
    if issuer is not None:
        claims["iss"] = issuer
    if audience is not None:
        claims["aud"] = audience
    return jwt.encode(claims, secret, algorithm=algorithm)


def _check_secret(secret: str, algorithms: Iterable[str]) -> None:
    """``ValueError`` unless ``secret`` is as long as RFC 7518 (3.2) asks of each HS algorithm: the hash's
    output, 32 bytes for HS256, 48 for HS384, 64 for HS512."""
    need = max((_MIN_SECRET_BYTES.get(a, MIN_SECRET_BYTES) for a in algorithms), default=MIN_SECRET_BYTES)
    if len(secret.encode("utf-8")) < need:
        which = ", ".join(a for a in algorithms if _MIN_SECRET_BYTES.get(a, MIN_SECRET_BYTES) == need) or "HS256"
        raise ValueError(f"the JWT secret must be at least {need} bytes for {which}; {_MAKE_ONE}")


# What an operator runs for a secret long enough for every HS algorithm (86 characters, 64 random bytes).
_MAKE_ONE = "make one with: python3 -c 'import secrets; print(secrets.token_urlsafe(64))'"


def generate_secret() -> str:
    """A fresh random HS secret (512 bits, URL-safe text: long enough for HS512 too)."""
    return secrets.token_urlsafe(64)


@dataclass(frozen=True, repr=False)
class DeploymentSecrets:
    """What one deployment (a Ray namespace) keeps secret: the HMAC key of its cursors and the HS256
    secret of its tokens (used unless the operator configures keys of their own).

    The registry holds them from its creation: Ray re-runs its constructor with the same arguments when
    it restarts it, so they survive restarts, and every node's verticles get the same ones.
    """

    cursor_key: bytes
    jwt_secret: str

    @classmethod
    def generate(cls) -> DeploymentSecrets:
        return cls(secrets.token_bytes(32), generate_secret())

    def __repr__(self) -> str:
        return "DeploymentSecrets(<hidden>)"

    __str__ = __repr__
