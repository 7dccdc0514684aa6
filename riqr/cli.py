"""The ``riqr`` command.

riqr demo [--port 7400]                    local Ray + Spark, the seed-000 food orders served over REST
riqr up [--address ADDR] [--no-auth]       deploy the verticles on a running Ray cluster (REST auth on)
riqr token [--stores a,b] [--ttl SECONDS]  mint a bearer token for the REST API of a deployment
riqr down [--address ADDR]                 remove them
riqr run TOPOLOGY [options]                run a topology (as ``python -m topologies.TOPOLOGY`` does)
echo "1--john" | riqr produce customer     append records to a landing directory
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

from riqr.access import rest_auth, token_for
from runtime.auth import DEMO_TTL_SECONDS, AuthConfig
from runtime.config import DEFAULT_NAMESPACE, DEFAULT_PORT, RuntimeConfig, riqr_home
from runtime.errors import RiqrError
from runtime.landing import parse_console_bytes, write_records

__all__ = ["main", "build_parser"]


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cmd_produce(args: argparse.Namespace) -> int:
    home = riqr_home(args.home)
    data = sys.stdin.buffer.read()
    records = parse_console_bytes(data, args.key_separator, split_escaped_newlines=not args.no_escapes)
    path = write_records(home, args.topic, records)
    _say(f"wrote {len(records)} records to topic {args.topic}" + (f" ({path})" if path else ""))
    return 0


def _connect_ray(address: str | None, namespace: str) -> None:
    import ray

    ray.init(address=address or "auto", namespace=namespace, log_to_driver=False)


def _cmd_up(args: argparse.Namespace) -> int:
    from verticles import deploy

    _connect_ray(args.address, args.namespace)
    auth = rest_auth(args.namespace, disabled=args.no_auth)
    config = RuntimeConfig(
        namespace=args.namespace,
        http_host=args.host,
        http_port=args.port,
        advertise_host=args.advertise_host,
        auth=auth,
    )
    deployment = deploy.up(config)
    for ep in deployment.endpoints:
        print(f"node {ep.node_id[:12]}  REST API at {ep.url}")
    if not auth.enabled:
        _say("riqr: REST authentication is OFF (--no-auth): anyone who reaches the port reads every store")
        return 0
    token = token_for(auth)
    if token is None:
        _say("REST authentication is on: send tokens signed by your issuer as 'Authorization: Bearer <token>'")
    else:
        # On stdout, for the operator's terminal or a pipe; never logged. `riqr token` mints more.
        _say("REST authentication is on. A token for every store, valid 24 h (more: riqr token --stores a,b):")
        print(token)
    return 0


def _cmd_token(args: argparse.Namespace) -> int:
    env = AuthConfig.from_env()
    secret = env.secret
    if secret is None and env.public_key is None:
        from verticles import deploy

        _connect_ray(args.address, args.namespace)
        secrets = deploy.existing_secrets(args.namespace)
        if secrets is None:
            _say(f"riqr: riqr is not up in namespace {args.namespace!r} (run riqr up first)")
            return 2
        secret = secrets.jwt_secret
    if secret is None:
        _say("riqr: the REST API verifies tokens with a public key (RIQR_JWT_PUBLIC_KEY_FILE): ask its issuer")
        return 2
    stores = [s.strip() for s in args.stores.split(",") if s.strip()] or ["*"]
    auth = dataclasses.replace(env, enabled=True, secret=secret, public_key=None, algorithms=())
    print(token_for(auth, stores, args.ttl))
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    from verticles import deploy

    _connect_ray(args.address, args.namespace)
    stopped = deploy.down(args.namespace)
    _say(f"stopped {len(stopped)} riqr actors in namespace {args.namespace}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from topologies import run_by_name

    return run_by_name(args.topology, args.options, prog=f"riqr run {args.topology}")


def _cmd_demo(args: argparse.Namespace) -> int:
    from riqr.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    from topologies import TOPOLOGIES

    parser = argparse.ArgumentParser(prog="riqr", description="Ray Interactive Query Runtime")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the seed-000 food-orders example on a local Ray and Spark")
    demo.add_argument("--port", type=int, default=DEFAULT_PORT)
    demo.add_argument("--host", default="127.0.0.1", help="address to bind the REST API to")
    demo.add_argument("--home", default=None, help="landing dirs and checkpoints; default $RIQR_HOME or ~/.riqr")
    demo.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    demo.add_argument("--ready-timeout", type=float, default=180.0)
    demo.set_defaults(func=_cmd_demo)

    up = sub.add_parser("up", help="deploy the verticles on a running Ray cluster (idempotent)")
    up.add_argument("--address", default=None, help="Ray address; default $RAY_ADDRESS or the local cluster")
    up.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help="REST port on every node (0: any free port)")
    up.add_argument(
        "--host", default="127.0.0.1", help="address the REST API binds to (default loopback; 0.0.0.0: every one)"
    )
    up.add_argument("--advertise-host", default=None, help="host named in metadata; default the node's IP")
    up.add_argument("--no-auth", action="store_true", help="serve the REST API without bearer tokens (unsafe)")
    up.set_defaults(func=_cmd_up)

    token = sub.add_parser("token", help="print a bearer token for the REST API (the deployment's secret)")
    token.add_argument("--address", default=None)
    token.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    token.add_argument("--stores", default="*", help="comma-separated stores the token may read; default all")
    token.add_argument("--ttl", type=int, default=DEMO_TTL_SECONDS, help="seconds until it expires")
    token.set_defaults(func=_cmd_token)

    down = sub.add_parser("down", help="remove the verticles (and the stores' state) from the Ray cluster")
    down.add_argument("--address", default=None)
    down.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    down.set_defaults(func=_cmd_down)

    run = sub.add_parser(
        "run",
        help="run a topology until stopped (its options: riqr run TOPOLOGY --help)",
        description="Run a topology with the same options as python -m topologies.TOPOLOGY.",
    )
    run.add_argument("topology", choices=sorted(TOPOLOGIES))
    run.add_argument("options", nargs=argparse.REMAINDER, help="the topology's options")
    run.set_defaults(func=_cmd_run)

    produce = sub.add_parser("produce", help="append key--value lines from stdin to a topic's landing dir")
    produce.add_argument("topic")
    produce.add_argument("--home", default=None)
    produce.add_argument("--key-separator", default="--")
    produce.add_argument("--no-escapes", action="store_true", help="do not treat a literal \\n as a record break")
    produce.set_defaults(func=_cmd_produce)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args))
    except RiqrError as err:
        _say(f"riqr: {err.message}")
        return 2
    except ConnectionError as err:
        _say(f"riqr: cannot reach the Ray cluster: {err}")
        return 2
    except ValueError as err:  # a bad auth setting (RIQR_JWT_*); its message never quotes a secret
        _say(f"riqr: {err}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
