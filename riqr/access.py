"""How ``riqr up`` and ``riqr demo`` secure the REST API: which keys verify tokens, and minting one."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from runtime.auth import DEMO_TTL_SECONDS, AuthConfig, mint_token

__all__ = ["rest_auth", "token_for"]


def rest_auth(namespace: str, *, disabled: bool) -> AuthConfig:
    """The REST auth of a deployment: off if asked; the operator's keys if the environment names one
    (RIQR_JWT_SECRET, RIQR_JWT_SECRET_FILE, RIQR_JWT_PUBLIC_KEY_FILE; docs/security.md); else the
    deployment's own secret, generated on the first ``riqr up`` and kept by its registry."""
    env = AuthConfig.from_env()
    if disabled:
        return AuthConfig()
    if env.secret is not None or env.public_key is not None:
        return dataclasses.replace(env, enabled=True)
    from verticles import deploy

    return dataclasses.replace(env, enabled=True, secret=deploy.deployment_secrets(namespace).jwt_secret)


def token_for(auth: AuthConfig, stores: Sequence[str] = ("*",), ttl_seconds: int = DEMO_TTL_SECONDS) -> str | None:
    """A token ``auth`` accepts, or None when tokens come from the operator's issuer (a public key)."""
    if auth.secret is None:
        return None
    return mint_token(auth.secret, stores=stores, ttl_seconds=ttl_seconds, issuer=auth.issuer, audience=auth.audience)
