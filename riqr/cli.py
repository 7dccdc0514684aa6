"""The ``riqr`` command.

riqr demo [--port 7400]                    local Ray + Spark, the seed-000 food orders served over REST
riqr up [--address ADDR] [--no-auth]       deploy the verticles on a running Ray cluster (REST auth on)
riqr token [--stores a,b] [--ttl SECONDS]  mint a bearer token for the REST API of a deployment
riqr down [--address ADDR]                 remove them
riqr drop STORE [--force]                  drop one store: its query actors stop, its data is deleted
riqr rebalance [--store S] [--dry-run]     spread the stores' query actors over the live nodes (new ones too)
riqr drain NODE [--dry-run]                move every query actor off a node, before it is taken away
riqr standbys STORE N [--dry-run]          give each partition of a store N standby copies (adds or removes)
riqr status [--address ADDR] [--json]      stores, partitions, replicas, positions, lag, ingest, endpoints
riqr query STORE get KEY                   a value; range [FROM [TO]] / prefix P / all: JSON lines
riqr run TOPOLOGY [options]                run a topology (as ``python -m topologies.TOPOLOGY`` does)
echo "1--john" | riqr produce customer     append records to a landing directory
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from runtime.codec import encode_json
from runtime.config import (
    DEFAULT_MOVE_TIMEOUT,
    DEFAULT_NAMESPACE,
    DEFAULT_PAGE_SIZE,
    DEFAULT_PORT,
    REGISTRY_NAME,
    RuntimeConfig,
    check_count,
    check_port,
    check_seconds,
    http_url,
    riqr_home,
)
from runtime.errors import BadRequest, DeadlineExceeded, KeyNotFound, NotConnected, RiqrError, Unavailable
from runtime.landing import parse_console_bytes, topic_dir, write_records
from runtime.queries import UrlKey
from runtime.windows import Windowed

__all__ = ["main", "build_parser"]

T = TypeVar("T")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cmd_produce(args: argparse.Namespace) -> int:
    home = riqr_home(args.home)
    data = sys.stdin.buffer.read()
    records = parse_console_bytes(data, args.key_separator, split_escaped_newlines=not args.no_escapes)
    directory = topic_dir(home, args.topic)
    known = sorted(d.name for d in directory.parent.iterdir() if d.is_dir()) if directory.parent.is_dir() else []
    path = write_records(home, args.topic, records)
    _say(f"wrote {len(records)} records to topic {args.topic}" + (f" ({path})" if path else ""))
    if path is not None and args.topic not in known:  # a typo lands records nobody reads, silently
        _say(f"note: topic {args.topic} is new under {home} (its topics before: {', '.join(known) or 'none'}); "
             "a topology reads it only if it was started for it")  # fmt: skip
    return 0


def _connect_ray(address: str | None, namespace: str) -> None:
    from runtime.client import join_ray

    join_ray(address, namespace, quiet=True)


def _cmd_up(args: argparse.Namespace) -> int:
    from riqr.access import ray_auth_mode, ray_auth_warning, rest_auth, token_for
    from riqr.progress import Steps

    with Steps("[riqr up]") as steps:
        with steps.step("joining the Ray cluster"):
            _connect_ray(args.address, args.namespace)
        from verticles import deploy

        auth = rest_auth(args.namespace, disabled=args.no_auth)
        config = RuntimeConfig(
            namespace=args.namespace,
            http_host=args.host,
            http_port=args.port,
            advertise_host=args.advertise_host,
            auth=auth,
        )
        with steps.step("starting the registry, facades and HTTP verticles"):
            deployment = deploy.up(config)
    unsafe = ray_auth_warning(ray_auth_mode())
    if unsafe is not None:
        _say(unsafe)
    for ep in deployment.endpoints:
        print(f"node {ep.node_id[:12]}  REST API at {ep.url}  (web console: {ep.url}/)")
    kept = [ep for ep in deployment.endpoints if ep.kept]
    for ep in kept:
        _say(f"riqr up: node {ep.node_id[:12]}'s HTTP verticle was running and keeps its settings: "
             f"{'; '.join(ep.kept)}. riqr down first to change them")  # fmt: skip
    if any(not ep.auth_enabled for ep in deployment.endpoints):
        why = ("--no-auth" if args.no_auth else "RIQR_AUTH=off") if not auth.enabled else "as it was started"
        _say(f"riqr: REST authentication is OFF ({why}): anyone who reaches the port reads every store")
        return 1 if kept else 0
    if any(ep.auth != auth.fingerprint() for ep in deployment.endpoints):
        # The running verticles verify tokens with the settings they were started with: a token minted
        # from this command's would be refused.
        _say("REST authentication is on, with the keys and settings the verticles were started with, not "
             "these: tokens must come from those keys (riqr token mints with the deployment's own secret, "
             "when no key of yours is set)")  # fmt: skip
        return 1
    token = token_for(auth, subject="riqr-up")
    if token is None:
        _say("REST authentication is on: send tokens signed by your issuer as 'Authorization: Bearer <token>'")
    else:
        # On stdout, for the operator's terminal or a pipe; never logged. `riqr token` mints more.
        _say("REST authentication is on. A token for every store, valid 24 h (more: riqr token --stores a,b):")
        print(token)
    return 1 if kept else 0  # a binding kept against the one asked for: said above


def _cmd_token(args: argparse.Namespace) -> int:
    from riqr.access import operator_auth, token_for
    from runtime.auth import DEMO_TTL_SECONDS

    stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    if not stores:  # an empty variable in a script must not widen the token to every store
        _say("riqr: --stores names no store: give store names, comma-separated, or '*' for every store")
        return 2
    env, _ = operator_auth()
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
    # The HS algorithms the operator configured (any other fits only a public key, which mints nothing).
    hs = tuple(a for a in env.algorithms if a.startswith("HS"))
    auth = dataclasses.replace(env, enabled=True, secret=secret, public_key=None, algorithms=hs)
    token = token_for(auth, stores, DEMO_TTL_SECONDS if args.ttl is None else args.ttl, subject=args.subject)
    if env.secret is None:  # minted with the deployment's own key: is it the one its REST API checks?
        from verticles import deploy
        from verticles.http import NO_AUTH

        refusal = deploy.token_refusal(args.namespace, token or "")
        if refusal == NO_AUTH:
            _say(f"riqr: the REST API of namespace {args.namespace!r} {NO_AUTH}; no token printed")
            return 2
        if refusal is not None:
            _say(f"riqr: the REST API of namespace {args.namespace!r} would refuse this token ({refusal}): "
                 "it runs with other auth settings; mint with the RIQR_JWT_* settings riqr up ran with")  # fmt: skip
            return 2
        _note_unknown_stores(args.namespace, stores)
    print(token)
    return 0


def _note_unknown_stores(namespace: str, stores: list[str]) -> None:
    """Say which of the token's stores do not exist now (a typo reads nothing; a store made later is fine,
    so it is a note, and the token is printed). Nothing when the registry cannot be asked."""
    import ray

    from runtime import raycalls
    from runtime.config import REGISTRY_NAME

    try:
        view = raycalls.get(ray.get_actor(REGISTRY_NAME, namespace=namespace).view.remote(), "the stores", timeout=10)
    except Exception:  # noqa: BLE001 - only a note: the token is right either way
        return
    unknown = [s for s in stores if s != "*" and s not in view.tables]
    if unknown:
        known = ", ".join(sorted(view.tables)) or "none yet"
        _say(f"riqr: note: no store {', '.join(map(repr, unknown))} in namespace {namespace!r} now (its stores: "
             f"{known}); the token reads it once a topology creates it")  # fmt: skip


def _cmd_down(args: argparse.Namespace) -> int:
    from riqr.progress import Steps
    from verticles import deploy

    with Steps("[riqr down]") as steps:
        with steps.step("joining the Ray cluster"):
            _connect_ray(args.address, args.namespace)
        if not deploy.is_up(args.namespace):  # a mistyped --namespace is not a successful down
            _say(f"riqr: riqr is not up in namespace {args.namespace!r}: nothing to stop")
            return 2
        with steps.step("stopping every riqr actor and deleting the stores' data"):
            stopped = deploy.down(args.namespace)
    # Which cluster: without --address, Ray's "auto" joins whichever this machine runs (docs/operations.md).
    _say(f"stopped {len(stopped)} riqr actors in namespace {args.namespace} of the Ray cluster at {_cluster()}")
    return 0


def _cluster() -> str:
    """The address of the Ray cluster this process joined."""
    import ray

    return str(ray.get_runtime_context().gcs_address)


def _cmd_drop(args: argparse.Namespace) -> int:
    """Drop one store: the registry forgets it, its query actors stop and delete their data. A store a
    running topology feeds is refused without ``--force``: that topology would fail (at its next batch, or
    sooner under ``supervise``: ``topologies.sink.unregistered``)."""
    from runtime import raycalls
    from runtime.errors import DeadlineExceeded, OwnerUnavailable

    _connect_ray(args.address, args.namespace)
    registry = _registry(args.namespace)
    call = registry.drop_store.remote(args.store, refuse_if_fed=not args.force)
    try:
        uuids = raycalls.get(call, f"dropping store {args.store}", timeout=120)
    except (DeadlineExceeded, OwnerUnavailable) as err:
        # The call may have been taken and go on (behind a long check, or finished by a restarted registry).
        _say(f"riqr: {err.message}; the drop may still be made: see riqr status")
        return 2
    _say(f"dropped store {args.store}: {len(uuids)} query actors stopped (what a node could not delete now is "
         "reclaimed by its sweeper)")  # fmt: skip
    return 0


def _cmd_rebalance(args: argparse.Namespace) -> int:
    """Move query actors between live nodes while queries and batches go on (``riqr.moves``):
    ``rebalance`` spreads each store's actors evenly (a node that joined gets its share); ``drain`` first
    moves every actor off the given nodes."""
    try:
        return _rebalance(args)
    except KeyboardInterrupt:
        _say("riqr: stopped; the moves made before stay made (what became of one under way is said above)")
        return 130


def _rebalance(args: argparse.Namespace) -> int:
    from riqr import moves

    _connect_ray(args.address, args.namespace)
    _registry(args.namespace)  # riqr is up there
    drain = [_node_id(n) for n in getattr(args, "nodes", ())]
    stores = args.store or None
    _, planned = moves.plan(args.namespace, drain=drain, stores=stores)
    if args.dry_run:
        for m in planned:
            _say(f"would move {moves.describe(m)}")
        _say(f"{len(planned)} move(s) planned" if planned else "nothing to move")
        return 0
    done = moves.rebalance(args.namespace, drain=drain, stores=stores, timeout=args.timeout, say=_say)
    if drain:
        left = _actors_on(args.namespace, set(drain), stores)
        if left:
            _say(f"riqr: query actors still on the drained nodes: {', '.join(left)} (placed there after the plan: a "
                 "re-created actor, a new store); run the drain again")  # fmt: skip
            return 2
        # The moved actors' old copies delete their data after a grace: stopping the node before would
        # leave their directories on its disk.
        kept = moves.wait_until_deleted(args.namespace, [d.move.uuid for d in done], say=_say)
        if kept:
            _say(f"riqr: the old copies {', '.join(kept)} are not deleted yet (riqr status, the registry's log); "
                 "stopping their node now leaves their data on its disk")  # fmt: skip
            return 2
        nodes = ", ".join(n[:12] for n in drain)
        if stores:  # other stores' actors may still be there: not a node to stop yet
            _say(f"drained: no query actor of those stores runs on {nodes}, and their old copies are deleted; "
                 "other stores' actors may still run there (riqr drain without --store moves them all before a "
                 "stop)")  # fmt: skip
        else:
            _say(f"drained: no query actor runs on {nodes}, and the old copies are deleted: it can be stopped")
    if done:
        _say(f"moved {len(done)} query actor(s) in {sum(d.seconds for d in done):.1f}s")
    return 0


def _cmd_standbys(args: argparse.Namespace) -> int:
    """Give a store's partitions N standby copies while queries and batches go on: copies added
    (``riqr.moves.add_standbys``) or removed (``riqr.moves.remove_standbys``)."""
    from riqr import moves

    _connect_ray(args.address, args.namespace)
    _registry(args.namespace)  # riqr is up there
    try:
        removals = moves.plan_removals(args.namespace, args.store, args.count)
        has, planned = moves.plan_standby_copies(args.namespace, args.store, args.count)
        if args.dry_run:
            for r in removals:
                _say(f"would remove {r.describe()}")
            for m in planned:
                _say(f"would add {moves.describe(m)}")
            if not removals and not planned:
                _say(f"nothing to change: every partition of store {args.store} has {moves.copies(args.count)}")
            else:
                _say(", ".join(f"{moves.copies(len(xs))} {what}" for xs, what in
                               ((planned, "to add"), (removals, "to remove")) if xs))  # fmt: skip
            return 0
        removed = moves.remove_standbys(args.namespace, args.store, args.count, say=_say) if removals else []
        done = (
            moves.add_standbys(args.namespace, args.store, args.count, timeout=args.timeout, say=_say)
            if planned or not removed
            else []
        )
    except KeyboardInterrupt:
        _say("riqr: stopped; the standby copies added or removed before stay so (what became of one under way is "
             "said above)")  # fmt: skip
        return 130
    if removed:
        _say(f"removed {moves.copies(len(removed))}, and their data is deleted: no partition of store "
             f"{args.store} has more than {moves.copies(args.count)}")  # fmt: skip
    if done:
        _say(f"added {moves.copies(len(done))} in {sum(d.seconds for d in done):.1f}s: every partition of store "
             f"{args.store} has {moves.copies(args.count)}")  # fmt: skip
    return 0


def _copying_options(parser: argparse.ArgumentParser, unit: str, units: str) -> None:
    """The options of the commands that copy query actors' partitions (a ``unit`` is a move or a copy;
    ``units``, its plural)."""
    parser.add_argument("--dry-run", action="store_true", help=f"print the {units} planned, make none")
    parser.add_argument(
        "--timeout",
        type=_positive_seconds,
        default=DEFAULT_MOVE_TIMEOUT,
        help=f"seconds one {unit} may take (default {DEFAULT_MOVE_TIMEOUT:.0f})",
    )
    parser.add_argument("--address", default=None, help=_ADDRESS_HELP)
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=_NAMESPACE_HELP)


def _standby_count(text: str) -> int:
    return _checked(check_count, int(text), 0)


_standby_count.__name__ = "number of standby copies"


def _actors_on(namespace: str, nodes: set[str], stores: Sequence[str] | None) -> list[str]:
    from runtime import raycalls

    view = raycalls.get(_registry(namespace).view.remote(), "the registry's view", timeout=30)
    return sorted(
        u for u, info in view.actors.items() if info.node_id in nodes and (stores is None or info.store in stores)
    )


def _positive_seconds(text: str) -> float:
    return _checked(check_seconds, float(text))


_positive_seconds.__name__ = "number of seconds"  # argparse's "invalid <name> value" message


def _node_id(name: str) -> str:
    """A live node's id from its id, a prefix of it (6 characters at least) or its IP address."""
    import ray

    alive = [n for n in ray.nodes() if n.get("Alive")]
    ids = [str(n["NodeID"]) for n in alive]
    if name in ids:
        return name
    found = {str(n["NodeID"]) for n in alive if n.get("NodeManagerAddress") == name}
    if len(name) >= 6:
        found |= {i for i in ids if i.startswith(name)}
    if len(found) == 1:
        return found.pop()
    known = ", ".join(f"{n['NodeID'][:12]} ({n.get('NodeManagerAddress')})" for n in alive)
    which = (
        "names more than one live node"
        if found
        else ("is no live node's id, id prefix (6 characters at least) or address")
    )
    raise BadRequest(f"{name!r} {which} (live nodes: {known})")


def _registry(namespace: str) -> Any:
    """The registry of ``namespace`` (``NotConnected`` if riqr is not up there)."""
    import ray

    try:
        return ray.get_actor(REGISTRY_NAME, namespace=namespace)
    except ValueError:
        raise NotConnected(f"riqr is not up in namespace {namespace!r} (run riqr up first)") from None


def _registry_endpoints(namespace: str) -> dict[str, tuple[str, int]]:
    """Node id -> (host, port) of each node's REST API, as the registry has them."""
    from runtime import raycalls

    view = raycalls.get(_registry(namespace).view.remote(), "the registry's view", timeout=30)
    return {node: (ep.host, ep.port) for node, ep in view.endpoints.items()}


def _cmd_status(args: argparse.Namespace) -> int:
    from runtime.client import connect

    _connect_ray(args.address, args.namespace)
    endpoints = _registry_endpoints(args.namespace)
    client = connect(args.namespace)
    catalog, instances = client.stores(), client.metadata()
    if args.json:
        print(_json({"stores": catalog, "instances": instances,
                       "endpoints": {n: f"{http_url(h, p)}/" for n, (h, p) in endpoints.items()}}))  # fmt: skip
        return 0
    from rich.console import Console

    from riqr.status import render_status

    # Off a terminal (a pipe, a log) rich would wrap at 80 columns: keep rows whole there.
    console = Console(width=None if sys.stdout.isatty() else 200, soft_wrap=False)
    render_status(console, catalog, instances, endpoints)
    return 0


def _bound(args: argparse.Namespace, which: str) -> str | None:
    """A range bound given as a positional or as ``--from``/``--to`` (``BadRequest`` if both)."""
    positional, option = getattr(args, which), getattr(args, f"{which}_option", None)
    if positional is not None and option is not None:
        flag = "--from" if which == "lo" else "--to"
        raise BadRequest(f"the {'lower' if which == 'lo' else 'upper'} bound is given twice: as an argument and {flag}")
    return positional if positional is not None else option


def _url_key(text: str | None) -> UrlKey | None:
    return None if text is None else UrlKey(text)


def _json(value: Any) -> str:
    """A line of JSON as the REST API writes it: NaN and infinities spelled as text (docs/api.md), never
    an error halfway through a scan."""
    return encode_json(value).decode("utf-8")


def _entry_json(entry: Any) -> str:
    if isinstance(entry, Windowed):
        return _json(entry.to_json())
    return _json({"key": entry[0], "value": entry[1]})


def query_lines(store: Any, args: argparse.Namespace) -> Iterator[str]:
    """The answer of ``riqr query`` as JSON lines: the value of a key, or one entry per line.

    Keys and bounds are written as in a REST path (docs/api.md): a composite key's components joined by
    '/', percent-escapes allowed (``%2F`` for a '/' inside one). Scans go a page at a time, so a large
    store streams with flat memory; ``--limit`` stops early.
    """
    if args.op == "get":
        yield _json(store.get(UrlKey(args.key)))
        return
    bounds: dict[str, Any] = {}
    if args.op == "range":
        bounds = {"lo": _url_key(_bound(args, "lo")), "hi": _url_key(_bound(args, "hi"))}
    elif args.op == "prefix":
        bounds = {"prefix": UrlKey(args.prefix).text()}
    page_size = min(args.limit or DEFAULT_PAGE_SIZE, DEFAULT_PAGE_SIZE)
    for n, entry in enumerate(store.iterate(reverse=args.reverse, page_size=page_size, **bounds), start=1):
        yield _entry_json(entry)
        if args.limit is not None and n >= args.limit:
            return


# ``riqr query``'s exit statuses beside 0 (an answer) and 2 (an error: the command line, an unknown store,
# no cluster or no riqr there), so a script can tell them apart without reading stderr:
EXIT_ABSENT = 1  # ``get``: the key is not in the store; an answer, "nothing", as grep's 1 is
EXIT_TRY_AGAIN = 75  # sysexits' EX_TEMPFAIL: no copy could answer now (503) or not in time (504); retry later


def _cmd_query(args: argparse.Namespace) -> int:
    from runtime.client import connect

    if args.op == "range":  # a bound given twice is the command line's error: said before joining Ray
        for which in ("lo", "hi"):
            _bound(args, which)
    _connect_ray(args.address, args.namespace)
    store = connect(args.namespace).store(args.store)
    return print_query(store, args)


def print_query(store: Any, args: argparse.Namespace) -> int:
    """Print ``query_lines``; the exit status says whether what was printed is the whole answer. A scan
    cut by an unavailable partition has printed only some entries: its status (75) says so."""
    try:
        for line in query_lines(store, args):
            print(line, flush=args.op != "get")
    except KeyNotFound as err:
        _say(f"riqr: {err.message}")
        return EXIT_ABSENT
    except (Unavailable, DeadlineExceeded) as err:
        _say(f"riqr: {err.message} (try again)")
        return EXIT_TRY_AGAIN
    return 0


# The plain handler ``main`` gives the command's own warnings (``_cmd_run`` hands logging to the topology).
_PLAIN_HANDLERS: list[logging.Handler] = []


def _cmd_run(args: argparse.Namespace) -> int:
    from topologies import NotATopology, run_by_name

    # The topology logs riqr's way (logfmt or JSON, its own level); the command's plain handler beside it
    # would print every line twice, once in each format.
    root = logging.getLogger()
    for handler in _PLAIN_HANDLERS:
        root.removeHandler(handler)
    try:
        return run_by_name(args.topology, args.options, prog=f"riqr run {args.topology}")
    except NotATopology as err:
        _say(f"riqr: {err}")
        return 2


def _cmd_demo(args: argparse.Namespace) -> int:
    from riqr.demo import run_demo

    return run_demo(args)


def _positive(text: str) -> int:
    return _checked(check_count, int(text), 1)


_positive.__name__ = "positive integer"  # argparse's "invalid <name> value" message

# The longest a minted token may live: a bearer token cannot be revoked (only every token at once, with the
# deployment's key by riqr down and up, or an operator's key changed), so a ttl of centuries is a leak for ever.
MAX_TOKEN_TTL_SECONDS = 366 * 24 * 3600


def _ttl(text: str) -> int:
    value = _positive(text)
    if value > MAX_TOKEN_TTL_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_TOKEN_TTL_SECONDS} seconds (366 days; a token cannot be revoked), got {value}"
        )
    return value


_ttl.__name__ = "number of seconds"


def _port(text: str) -> int:
    return _checked(check_port, int(text))


def _checked(check: Callable[..., T], value: T, *rule: Any) -> T:
    """``check(value, *rule)`` (``runtime.config``'s rules, which ``RuntimeConfig`` and the topologies'
    runner apply too) as argparse's usage error."""
    try:
        return check(value, *rule)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


_port.__name__ = "port"


def _subject(text: str) -> str:
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be a name without control characters, got {text!r}")
    return text.strip()


_ADDRESS_HELP = "Ray address; default $RAY_ADDRESS or the local cluster"
_NAMESPACE_HELP = f"riqr's Ray namespace (default {DEFAULT_NAMESPACE})"


def build_parser() -> argparse.ArgumentParser:
    from topologies import TOPOLOGIES

    parser = argparse.ArgumentParser(prog="riqr", description="Ray Interactive Query Runtime")
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run the seed-000 food-orders example on a local Ray and Spark")
    demo.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"REST port (default {DEFAULT_PORT})")
    demo.add_argument("--host", default="127.0.0.1", help="address to bind the REST API to (default 127.0.0.1)")
    demo.add_argument(
        "--home",
        default=None,
        help="the demo's landing dirs, dead letters and checkpoints (reset at start) and, unless $RIQR_DATA is "
        "set, its stores' state (deleted at a clean stop); default demo/ under $RIQR_HOME or ~/.riqr, apart "
        "from a deployment's",
    )
    demo.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=_NAMESPACE_HELP)
    demo.add_argument(
        "--ready-timeout", type=_positive_seconds, default=180.0,
        help="seconds to wait for the seed records to reach the stores before giving up (default 180)",
    )  # fmt: skip
    demo.add_argument(
        "--dashboard", action="store_true", help="start Ray's dashboard too (slower start; the demo needs none)"
    )
    demo.add_argument(
        "--no-class-archive", action="store_true",
        help="load Spark's classes from its jars instead of the archive an earlier run wrote (~/.cache/riqr)",
    )  # fmt: skip
    demo.set_defaults(func=_cmd_demo)

    up = sub.add_parser("up", help="deploy the verticles on every node of a running Ray cluster, now and as they join")
    up.add_argument("--address", default=None, help=_ADDRESS_HELP)
    up.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=_NAMESPACE_HELP)
    up.add_argument(
        "--port",
        type=_port,
        default=DEFAULT_PORT,
        help=f"REST port on every node (default {DEFAULT_PORT}; 0: any free port)",
    )
    up.add_argument(
        "--host", default="127.0.0.1", help="address the REST API binds to (default loopback; 0.0.0.0: every one)"
    )
    up.add_argument(
        "--advertise-host",
        default=None,
        help="host named in metadata; default the bound address (the node's IP when binding 0.0.0.0 or ::)",
    )
    up.add_argument("--no-auth", action="store_true", help="serve the REST API without bearer tokens (unsafe)")
    up.set_defaults(func=_cmd_up)

    token = sub.add_parser("token", help="print a bearer token for the REST API (the deployment's secret)")
    token.add_argument("--address", default=None, help=_ADDRESS_HELP)
    token.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=_NAMESPACE_HELP)
    token.add_argument("--stores", default="*", help="comma-separated stores the token may read; default all")
    token.add_argument(
        "--ttl", type=_ttl, default=None, help="seconds until it expires (default: 24 h; at most 366 days)"
    )
    token.add_argument(
        "--subject",
        type=_subject,
        default="riqr-token",
        help="the token's sub claim: whom it is for (default riqr-token)",
    )
    token.set_defaults(func=_cmd_token)

    status = sub.add_parser("status", help="stores, partitions, replicas, positions, lag, ingest, REST endpoints")
    status.add_argument("--address", default=None, help=_ADDRESS_HELP)
    status.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=_NAMESPACE_HELP)
    status.add_argument("--json", action="store_true", help="print what the table shows as one JSON object")
    status.set_defaults(func=_cmd_status)

    query = sub.add_parser(
        "query",
        help="query a store: get KEY, range [FROM [TO]], prefix P, all (JSON lines)",
        description="Keys and bounds as in a REST path: composite keys' components joined by '/', "
        "percent-escapes allowed. Values print as JSON; scans one {key, value} per line. Exit status: 0 the "
        "answer, 1 get's key is absent, 75 nothing could answer now (503/504: try again), 2 an error.",
    )
    query.add_argument("store", help="the store's name (riqr status lists them)")
    query.add_argument("--address", default=None, help=_ADDRESS_HELP)
    query.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=_NAMESPACE_HELP)
    ops = query.add_subparsers(dest="op", required=True)
    get = ops.add_parser("get", help="the value of a key")
    get.add_argument("key")
    scans = [ops.add_parser("all", help="every entry in key order")]
    scans.append(
        ops.add_parser(
            "range",
            help="entries between two keys, both inclusive, either optional",
            description="FROM and TO, or --from and --to: `range --to 5` has no lower bound ('' is a key).",
        )
    )
    scans[-1].add_argument("lo", nargs="?", default=None, metavar="FROM")
    scans[-1].add_argument("hi", nargs="?", default=None, metavar="TO")
    scans[-1].add_argument("--from", dest="lo_option", default=None, metavar="FROM", help="the lower bound")
    scans[-1].add_argument("--to", dest="hi_option", default=None, metavar="TO", help="the upper bound")
    scans.append(ops.add_parser("prefix", help="entries whose key starts with a prefix"))
    scans[-1].add_argument("prefix")
    for scan in scans:
        scan.add_argument("--limit", type=_positive, default=None, help="stop after this many entries")
        scan.add_argument("--reverse", action="store_true", help="descending key order")
    for op in (get, *scans):  # also after the query, as `riqr query STORE all --namespace x`
        op.add_argument("--address", default=argparse.SUPPRESS, help="Ray address, as before the store")
        op.add_argument("--namespace", default=argparse.SUPPRESS, help="riqr's namespace, as before the store")
    query.set_defaults(func=_cmd_query)

    down = sub.add_parser("down", help="remove the verticles (and the stores' state) from the Ray cluster")
    down.add_argument("--address", default=None, help=_ADDRESS_HELP)
    down.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=_NAMESPACE_HELP)
    down.set_defaults(func=_cmd_down)

    drop = sub.add_parser("drop", help="drop one store: its query actors stop and its data is deleted")
    drop.add_argument("store")
    drop.add_argument("--force", action="store_true", help="even while a running topology feeds it")
    drop.add_argument("--address", default=None, help=_ADDRESS_HELP)
    drop.add_argument("--namespace", default=DEFAULT_NAMESPACE, help=_NAMESPACE_HELP)
    drop.set_defaults(func=_cmd_drop)

    for name in ("rebalance", "drain"):
        helps = {
            "rebalance": "spread each store's query actors evenly over the live nodes, while queries go on",
            "drain": "move every query actor off the given nodes, while queries go on (before removing them)",
        }
        moving = sub.add_parser(name, help=helps[name], description=helps[name])
        if name == "drain":
            moving.add_argument("nodes", nargs="+", metavar="NODE", help="a node id, a prefix of it, or its address")
        moving.add_argument("--store", action="append", default=[], help="only this store (repeatable)")
        _copying_options(moving, "move", "moves")
        moving.set_defaults(func=_cmd_rebalance)

    what = "give each partition of a store N standby copies on other nodes, while queries and batches go on"
    standbys = sub.add_parser(
        "standbys",
        help=what,
        description=what + ": each new copy is a new query actor that copies its partitions from live copies, "
        "catches up and stays. Fewer than a partition has removes copies riqr standbys added (whole query "
        "actors that answer for no partition; a store's own actors keep theirs). A store created on one node "
        "has none.",
    )
    standbys.add_argument("store")
    standbys.add_argument("count", metavar="N", type=_standby_count, help="standby copies each partition should have")
    _copying_options(standbys, "copy", "copies")
    standbys.set_defaults(func=_cmd_standbys)

    run = sub.add_parser(
        "run",
        help="run a topology until stopped (its options: riqr run TOPOLOGY --help)",
        description="Run a topology with the same options as python -m topologies.TOPOLOGY, or your own: a "
        'module with main(argv, prog), imported from the current directory (README, "Writing a topology").',
    )
    run.add_argument(
        "topology",
        metavar="TOPOLOGY",
        help=f"one of {', '.join(sorted(TOPOLOGIES))}, a module (sensors, jobs.sensors) or a file (path/to/sensors.py)",
    )
    run.add_argument("options", nargs=argparse.REMAINDER, help="the topology's options")
    run.set_defaults(func=_cmd_run)

    produce = sub.add_parser("produce", help="append key--value lines from stdin to a topic's landing dir")
    produce.add_argument("topic")
    produce.add_argument("--home", default=None, help="the topology's home (default $RIQR_HOME, else ~/.riqr)")
    produce.add_argument("--key-separator", default="--", help="what splits each line into key and value (default --)")
    produce.add_argument("--no-escapes", action="store_true", help="do not treat a literal \\n as a record break")
    produce.set_defaults(func=_cmd_produce)
    return parser


def _raised_in_py4j(err: BaseException) -> bool:
    """Whether ``err`` came out of py4j, PySpark's link to its JVM: a connection refused there is Spark's
    driver gone, which the CLI once reported as "cannot reach the Ray cluster"."""
    import traceback

    return any(f"{os.sep}py4j{os.sep}" in frame.filename for frame in traceback.extract_tb(err.__traceback__))


def main(argv: Sequence[str] | None = None) -> int:
    from runtime.raycalls import no_auto_connect

    no_auto_connect()  # before Ray is imported
    args = build_parser().parse_args(argv)
    before = set(logging.getLogger().handlers)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _PLAIN_HANDLERS[:] = [h for h in logging.getLogger().handlers if h not in before]
    try:
        return int(args.func(args))
    except RiqrError as err:
        _say(f"riqr: {err.message}")
        return 2
    except KeyboardInterrupt:  # Ctrl-C: said in a line, not a traceback (the demo and the movers stop on their own)
        _say("riqr: interrupted")
        # Raised on, with the traceback silenced: Python then ends by SIGINT itself, which a shell running
        # the command in a loop or a script takes as the user's stop (a plain exit 130 it would go on from).
        previous = sys.excepthook
        sys.excepthook = lambda kind, *rest: None if kind is KeyboardInterrupt else previous(kind, *rest)
        raise
    except BrokenPipeError:  # `riqr query S all | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not raise again
        return 128 + signal.SIGPIPE
    except ConnectionError as err:
        from runtime.client import JoinRefused

        if _raised_in_py4j(err):  # Spark's JVM went away under `riqr run` (killed, out of memory), not Ray
            _say(f"riqr: lost Spark's driver JVM (its py4j gateway: {err}); see the lines above for why it ended")
            return 1
        _say(f"riqr: {'cannot join' if isinstance(err, JoinRefused) else 'cannot reach'} the Ray cluster: {err}")
        return 2
    except ValueError as err:  # a bad auth setting (RIQR_JWT_*); its message never quotes a secret
        _say(f"riqr: {err}")
        return 2
    except OSError as err:  # a file a setting names (RIQR_JWT_SECRET_FILE, an ACL) missing or unreadable
        _say(f"riqr: {err}")
        return 2
    except Exception as err:
        from topologies.spark import SparkNotStarted

        if isinstance(err, SparkNotStarted):  # no Java, or not one Spark runs on: said, no traceback
            _say(f"riqr: {err}")
            return 2
        if type(err).__module__.startswith("ray."):  # Ray refused the connection (its auth token) or failed
            _say(f"riqr: Ray: {type(err).__name__}: {err}")
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
