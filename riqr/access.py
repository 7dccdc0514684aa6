"""How ``riqr up`` and ``riqr demo`` secure the REST API: which keys verify tokens, and minting one."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from runtime.auth import DEMO_TTL_SECONDS, AuthConfig, mint_token

__all__ = ["operator_auth", "rest_auth", "token_for", "ray_auth_mode", "ray_auth_warning"]


def operator_auth(environ: Mapping[str, str] | None = None) -> tuple[AuthConfig, str]:
    """The operator's settings (``AuthConfig.from_env``) and ``RIQR_AUTH`` apart: ``""``, ``"on"`` or
    ``"off"``. For a deployment ``on`` without a key of the operator's means its own generated secret,
    where ``AuthConfig.from_env`` alone (for a program verifying tokens itself) needs a key."""
    env = dict(os.environ if environ is None else environ)
    switch = env.pop("RIQR_AUTH", "").strip().lower()
    if switch not in ("", "on", "off"):
        raise ValueError("RIQR_AUTH must be 'on' or 'off'")
    return AuthConfig.from_env(env), switch


def rest_auth(namespace: str, *, disabled: bool, environ: Mapping[str, str] | None = None) -> AuthConfig:
    """The REST auth of a deployment: off if asked (``--no-auth``, or ``RIQR_AUTH=off``); the operator's
    keys if the environment names one (RIQR_JWT_SECRET, RIQR_JWT_SECRET_FILE, RIQR_JWT_PUBLIC_KEY_FILE;
    docs/security.md); else the deployment's own secret, generated on the first ``riqr up`` and kept by
    its registry."""
    env, switch = operator_auth(environ)
    if disabled or switch == "off":
        return AuthConfig()
    if env.secret is not None or env.public_key is not None:
        return dataclasses.replace(env, enabled=True)
    from verticles import deploy

    return dataclasses.replace(env, enabled=True, secret=deploy.deployment_secrets(namespace).jwt_secret)


def token_for(
    auth: AuthConfig, stores: Sequence[str] = ("*",), ttl_seconds: int = DEMO_TTL_SECONDS, *, subject: str = "riqr"
) -> str | None:
    """A token ``auth`` accepts for reading ``stores``, or None when tokens come from the operator's issuer (a
    public key): signed with the first of its algorithms, its stores and roles in the claims it reads, and
    holding every role its ACL asks of a reader of those stores (whoever holds the secret can mint any
    token, so an ACL binds tokens from elsewhere, not these). ``subject`` is its ``sub``: who minted it
    (``riqr-demo``, ``riqr-up``, ``riqr token``'s ``--subject``)."""
    if auth.secret is None:
        return None
    return mint_token(
        auth.secret,
        stores=stores,
        subject=subject,
        ttl_seconds=ttl_seconds,
        issuer=auth.issuer,
        audience=auth.audience,
        roles=sorted(auth.roles_for(stores)),
        stores_claim=auth.stores_claim,
        roles_claim=auth.roles_claim,
        algorithm=auth.algorithms[0] if auth.algorithms else "HS256",
    )


def ray_auth_mode(timeout: float = 10.0) -> str | None:
    """The joined Ray cluster's authentication mode as its nodes run it (``token`` or ``disabled``, what a
    worker's ``get_authentication_mode`` says: the mode the node was started with, from ``RAY_AUTH_MODE`` or
    a token file, not this process's), or None when it cannot be told within ``timeout`` seconds."""
    import ray

    @ray.remote(num_cpus=0, max_retries=0)
    def mode() -> str:
        from ray._private.authentication.authentication_utils import get_authentication_mode_name
        from ray._raylet import get_authentication_mode  # type: ignore[attr-defined]

        return str(get_authentication_mode_name(get_authentication_mode()))

    try:
        return str(ray.get(mode.remote(), timeout=timeout))
    except Exception:  # noqa: BLE001 - a Ray without the call, or a busy cluster: nothing to say
        return None


def ray_auth_warning(mode: str | None) -> str | None:
    """What ``riqr up`` says of a Ray cluster in ``mode`` (``ray_auth_mode``): a warning when it runs without
    token auth, where whoever reaches its ports runs code in it (and so reads every store and the
    deployment's REST secret); nothing otherwise, or when the mode could not be told."""
    if mode is None or mode == "token":
        return None
    return (
        f"riqr: warning: this Ray cluster runs without token authentication (its mode: {mode}): anyone who "
        "reaches its ports can run code in it, read every store and mint REST tokens. Start its nodes with "
        "RAY_AUTH_MODE=token (docs/security.md, 'Running Ray safely')"
    )
