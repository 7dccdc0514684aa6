"""Defaults and the few settings every part of riqr agrees on."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_NAMESPACE",
    "DEFAULT_PORT",
    "RuntimeConfig",
    "riqr_home",
    "REGISTRY_NAME",
    "facade_name",
    "http_name",
]

DEFAULT_NAMESPACE = "riqr"
DEFAULT_PORT = 7400
REGISTRY_NAME = "riqr-registry"


def facade_name(node_id: str) -> str:
    """The bus address of a node's facade verticle."""
    return f"riqr-facade-{node_id}"


def http_name(node_id: str) -> str:
    """The name of a node's HTTP verticle."""
    return f"riqr-http-{node_id}"


def riqr_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Where landing directories and checkpoints live: ``--home``, else ``$RIQR_HOME``, else ``~/.riqr``."""
    if explicit:
        return Path(explicit).expanduser().resolve()
    env = os.environ.get("RIQR_HOME")
    return Path(env).expanduser().resolve() if env else Path.home() / ".riqr"


@dataclass(frozen=True)
class RuntimeConfig:
    """How the verticles are deployed: namespace, HTTP binding, request deadline."""

    namespace: str = DEFAULT_NAMESPACE
    http_host: str = "0.0.0.0"
    http_port: int = DEFAULT_PORT
    request_timeout: float = 10.0
    # Advertised host in metadata; None means the node's IP address.
    advertise_host: str | None = None
