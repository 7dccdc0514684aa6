import io
import json
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from riqr import cli, demo
from riqr.access import token_for
from runtime.auth import AuthConfig, generate_secret
from runtime.facade import Facade
from runtime.rest import build_app
from tests.unit.fakes import FakeBus, kv_spec

SECRET = generate_secret()


def stdin(data: bytes) -> io.TextIOWrapper:
    """A stand-in for sys.stdin with its bytes underneath (``riqr produce`` reads ``sys.stdin.buffer``)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")


def test_produce_writes_the_seed_records(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("sys.stdin", stdin(demo.SEED_ORDERS.encode() + b"\n"))
    assert cli.main(["produce", "order", "--home", str(tmp_path)]) == 0
    [path] = list((tmp_path / "data" / "order").glob("*.json"))
    assert [json.loads(x)["key"] for x in path.read_text().splitlines()] == ["1", "2", ""]


def test_produce_to_a_topic_new_under_its_home_says_so(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    def notes(topic: str) -> list[str]:
        monkeypatch.setattr("sys.stdin", stdin(b"1--a\n"))
        assert cli.main(["produce", topic, "--home", str(tmp_path)]) == 0
        said = capsys.readouterr().err
        assert said.startswith(f"wrote 1 records to topic {topic}")
        return [line for line in said.splitlines() if line.startswith("note:")]

    assert notes("order") == [
        f"note: topic order is new under {tmp_path} (its topics before: none); a topology reads it only if it was "
        "started for it"
    ]
    assert notes("order") == []  # known now
    assert notes("ordre") == [  # a typo: written all the same, and said to be new beside the topics there
        f"note: topic ordre is new under {tmp_path} (its topics before: order); a topology reads it only if it was "
        "started for it"
    ]
    assert len(list((tmp_path / "data" / "ordre").glob("*.json"))) == 1


def test_produce_rejects_bad_input_and_writes_nothing(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("sys.stdin", stdin(b"1--a\nno separator\n"))
    assert cli.main(["produce", "order", "--home", str(tmp_path)]) == 2
    assert "line 2" in capsys.readouterr().err
    assert not (tmp_path / "data" / "order").exists()


def test_produce_rejects_bytes_that_are_not_utf8_and_leaves_nothing_behind(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr("sys.stdin", stdin(b"1--ok\n2--caf\xe9\n"))
    assert cli.main(["produce", "order", "--home", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "line 2" in err and "UTF-8" in err and "Traceback" not in err
    assert not (tmp_path / "data" / "order").exists() or list((tmp_path / "data" / "order").iterdir()) == []


def test_produce_reads_riqr_home_from_the_environment(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RIQR_HOME", str(tmp_path))
    monkeypatch.setattr("sys.stdin", stdin(b"k--v"))
    assert cli.main(["produce", "customer"]) == 0
    assert len(list((tmp_path / "data" / "customer").glob("*.json"))) == 1


def test_the_demo_writes_under_a_home_of_its_own(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The demo resets its home at start: by default not the riqr home a deployment's topologies use."""
    monkeypatch.setenv("RIQR_HOME", str(tmp_path))
    assert demo.demo_home(None) == tmp_path.resolve() / "demo"
    assert demo.demo_home(str(tmp_path / "elsewhere")) == (tmp_path / "elsewhere").resolve()
    monkeypatch.delenv("RIQR_HOME")
    assert demo.demo_home(None) == Path.home() / ".riqr" / "demo"


@pytest.fixture
async def seeded_app(aiohttp_client):  # type: ignore[no-untyped-def]
    bus = FakeBus()
    bus.create_store(kv_spec("customer-v1-changelog"))
    customers = dict(line.split("--", 1) for line in demo.SEED_CUSTOMERS.splitlines())
    bus.load("customer-v1-changelog", customers)
    bus.create_store(kv_spec("order-count"))
    bus.load("order-count", {"1": 1, "2": 1, "": 1})
    # Auth on, with a secret as `riqr demo` has one: the printed curls must carry a token that works.
    auth = AuthConfig(enabled=True, secret=SECRET)
    return await aiohttp_client(build_app(Facade(bus, timeout=1.0), auth=auth))


async def test_every_curl_the_demo_prints_answers_as_the_seed_says(seeded_app) -> None:  # type: ignore[no-untyped-def]
    answers = {}
    token = token_for(AuthConfig(enabled=True, secret=SECRET))
    assert token is not None
    for command in demo.seed_curls("http://localhost:7400", token):
        words = shlex.split(command)
        assert words[:2] == ["curl", "-H"] and len(words) == 4, command
        name, _, value = words[2].partition(": ")
        url = urlsplit(words[3])
        path = url.path + (f"?{url.query}" if url.query else "")
        assert (await seeded_app.get(path)).status == 401  # the token is what lets it through
        resp = await seeded_app.get(path, headers={name: value})
        assert resp.status == 200, (command, await resp.text())
        answers[path] = await resp.json()
    assert answers["/stores/customer-v1-changelog/get/2"] == {"response": "adam"}
    assert [e["key"] for e in answers["/stores/customer-v1-changelog/range?from=1&to=5"]["result"]] == list("12345")
    assert answers["/stores/customer-v1-changelog/approximate-num-entries"] == {"result": 7}
    assert answers["/stores/order-count/get/1"] == {"response": 1}
    assert len(answers["/stores/customer-v1-changelog/all"]["result"]) == 7
    assert answers["/metadata/stores/order-count/key/1"]["result"]["state-store-names"] == ["order-count"]


def test_riqr_run_hands_the_topology_its_own_options() -> None:
    args = cli.build_parser().parse_args(["run", "railway", "--namespace", "ns", "--partitions", "8"])
    assert (args.topology, args.options) == ("railway", ["--namespace", "ns", "--partitions", "8"])


def test_riqr_run_runs_a_module_of_yours_from_the_current_directory(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))  # the cwd it adds goes with the test
    (tmp_path / "riqr_test_sensors.py").write_text(
        "def main(argv, prog=None):\n    print('ran', argv, prog)\n    return 3\n"
    )
    assert cli.main(["run", "riqr_test_sensors", "--partitions", "8"]) == 3
    assert capsys.readouterr().out == "ran ['--partitions', '8'] riqr run riqr_test_sensors\n"
    assert cli.main(["run", "riqr_test_sensors.py"]) == 3  # a file's path names its module
    elsewhere = tmp_path / "jobs"
    elsewhere.mkdir()
    (elsewhere / "riqr_test_elsewhere.py").write_text("def main(argv, prog=None):\n    return 4\n")
    assert cli.main(["run", "./jobs/riqr_test_elsewhere.py"]) == 4
    assert cli.main(["run", str(elsewhere / "riqr_test_elsewhere.py")]) == 4
    capsys.readouterr()
    assert cli.main(["run", "jobs/missing.py"]) == 2
    assert f"no file {tmp_path / 'jobs' / 'missing.py'}" in capsys.readouterr().err
    # Its own import of a module that is not there: that module's traceback, not "no topology".
    (tmp_path / "riqr_test_pandas_job.py").write_text("import riqr_test_pandas\n")
    with pytest.raises(ModuleNotFoundError, match="riqr_test_pandas"):
        cli.main(["run", "riqr_test_pandas_job"])
    (tmp_path / "riqr_test_nomain.py").write_text("x = 1\n")
    assert cli.main(["run", "riqr_test_nomain"]) == 2
    assert "module 'riqr_test_nomain' has no main(argv, prog)" in capsys.readouterr().err
    assert cli.main(["run", "no_such_topology"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("riqr: no topology 'no_such_topology': not one of riqr's (events, food_orders,")
        and str(tmp_path) in err
    )


def test_riqr_run_help_shows_the_topology_options(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exited:
        cli.main(["run", "food_orders_windowed", "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: riqr run food_orders_windowed")
    for option in ["--watermark", "--partitions", "--actors", "--namespace", "--source", "--trigger"]:
        assert option in out
    assert "--skip-lost-offsets" in out  # the Kafka sources' failOnDataLoss=false, named by the loss's error


def test_a_topology_skips_lost_kafka_offsets_only_when_told(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The data-loss error names --skip-lost-offsets: the flag reaches the source's configuration."""
    import argparse

    import ray

    from topologies.runner import run_topology

    seen = []

    def stop_at_ray(**_: object) -> None:
        raise ConnectionError("no cluster in a unit test")

    monkeypatch.setattr(ray, "init", stop_at_ray)
    import topologies.sources as sources

    real = sources.SourceConfig

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(sources, "SourceConfig", recording)
    for flags in ([], ["--skip-lost-offsets"]):
        argv = ["--source", "kafka", "--kafka-bootstrap", "b:9092", *flags]
        assert run_topology(argparse.ArgumentParser(prog="t"), argv, lambda *a: []) == 1
    assert [config.fail_on_data_loss for config in seen] == [True, False]


def test_wait_until_returns_or_times_out() -> None:
    assert demo.wait_until(lambda: True, timeout=1, what="x") >= 0
    with pytest.raises(TimeoutError, match="never"):
        demo.wait_until(lambda: False, timeout=0.05, what="never", interval=0.01)


def test_the_demo_starts_ray_without_its_dashboard_unless_asked() -> None:
    plain = cli.build_parser().parse_args(["demo"])
    assert plain.dashboard is False and plain.no_class_archive is False
    asked = cli.build_parser().parse_args(["demo", "--dashboard", "--no-class-archive"])
    assert asked.dashboard is True and asked.no_class_archive is True


def test_riqr_drop_takes_a_store_and_is_safe_by_default() -> None:
    from riqr.cli import build_parser

    args = build_parser().parse_args(["drop", "order-count"])
    assert (args.store, args.force, args.namespace) == ("order-count", False, "riqr")
    assert build_parser().parse_args(["drop", "order-count", "--force", "--namespace", "ns"]).force is True


def test_a_missing_secret_file_is_a_message_not_a_traceback(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RIQR_JWT_SECRET_FILE", str(tmp_path / "absent"))
    assert cli.main(["token"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("riqr: RIQR_JWT_SECRET_FILE ") and "No such file or directory" in err and "absent" in err
    assert "Traceback" not in err


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """`riqr query S all | head`: the pipe's reader goes away; no traceback, the shell's code for SIGPIPE."""
    import os
    import signal

    def closed_pipe(args: Any) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    saved = os.dup(1)
    monkeypatch.setattr(cli, "_cmd_produce", closed_pipe)
    monkeypatch.setattr(cli.sys, "stdout", cli.sys.__stdout__)  # a real descriptor to point at /dev/null
    try:
        assert cli.main(["produce", "order"]) == 128 + signal.SIGPIPE
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert "Traceback" not in capsys.readouterr().err


def test_an_error_raised_by_ray_is_said_in_one_line(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Ray's own exceptions (its AuthenticationError when the cluster wants a token) are not tracebacks."""
    refused = type("AuthenticationError", (Exception,), {"__module__": "ray.exceptions"})

    def ray_refuses(args: Any) -> int:
        raise refused("the cluster requires a token")

    monkeypatch.setattr(cli, "_cmd_produce", ray_refuses)
    assert cli.main(["produce", "order"]) == 2
    assert capsys.readouterr().err == "riqr: Ray: AuthenticationError: the cluster requires a token\n"


def test_rebalance_and_drain_take_their_options_and_a_node_by_id_prefix_or_address(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import ray

    from runtime.errors import BadRequest

    args = cli.build_parser().parse_args(["rebalance", "--store", "a", "--store", "b", "--dry-run"])
    assert (args.store, args.dry_run, args.timeout) == (["a", "b"], True, 900.0)
    assert args.func is cli._cmd_rebalance
    drain = cli.build_parser().parse_args(["drain", "abc123", "10.0.0.2", "--timeout", "60"])
    assert (drain.nodes, drain.timeout, drain.store) == (["abc123", "10.0.0.2"], 60.0, [])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["drain"])  # which node is not optional
    nodes = [
        {"NodeID": "abcdef123456" + "0" * 44, "NodeManagerAddress": "10.0.0.1", "Alive": True},
        {"NodeID": "abcdef999456" + "0" * 44, "NodeManagerAddress": "10.0.0.2", "Alive": True},
        {"NodeID": "fff000000000" + "0" * 44, "NodeManagerAddress": "10.0.0.3", "Alive": False},
    ]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    assert cli._node_id("abcdef1") == nodes[0]["NodeID"]
    assert cli._node_id("10.0.0.2") == nodes[1]["NodeID"]
    assert cli._node_id(nodes[1]["NodeID"]) == nodes[1]["NodeID"]
    with pytest.raises(BadRequest, match="more than one live node"):
        cli._node_id("abcdef")
    with pytest.raises(BadRequest, match="no live node"):
        cli._node_id("abc")  # too short to be taken for a prefix
    with pytest.raises(BadRequest, match="no live node"):
        cli._node_id("fff000")  # a dead node is no place to drain from


def test_standbys_takes_a_store_and_a_count_of_zero_or_more() -> None:
    args = cli.build_parser().parse_args(["standbys", "order-count", "2", "--dry-run", "--timeout", "60"])
    assert (args.store, args.count, args.dry_run, args.timeout) == ("order-count", 2, True, 60.0)
    assert args.func is cli._cmd_standbys
    for bad in (["standbys", "s", "-1"], ["standbys", "s", "two"], ["standbys", "s"]):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(bad)


def test_a_token_for_no_store_is_refused_rather_than_minted_for_every_store(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import base64
    import json

    monkeypatch.setenv("RIQR_JWT_SECRET", "s" * 40)
    for empty in ("", " , ", ","):  # an empty variable in a script: `riqr token --stores "$STORES"`
        assert cli.main(["token", "--stores", empty]) == 2
        assert "names no store" in capsys.readouterr().err
    assert cli.main(["token", "--stores", "a, b"]) == 0
    claims = capsys.readouterr().out.strip().split(".")[1]
    decoded = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
    assert (decoded["stores"], decoded["sub"]) == (["a", "b"], "riqr-token")  # not the demo's
    assert cli.main(["token", "--subject", "grafana"]) == 0
    claims = capsys.readouterr().out.strip().split(".")[1]
    assert json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))["sub"] == "grafana"
    with pytest.raises(SystemExit):
        cli.main(["token", "--subject", " "])
    assert "argument --subject: must be a name" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["token", "--ttl", "0"])
    assert "argument --ttl: must be at least 1, got 0" in capsys.readouterr().err  # not ttl_seconds
    with pytest.raises(SystemExit):  # minted for about 3,000 years before: a token cannot be revoked
        cli.main(["token", "--ttl", "99999999999"])
    assert "argument --ttl: must be at most 31622400 seconds (366 days" in capsys.readouterr().err
    assert cli.main(["token", "--ttl", "31622400"]) == 0
    capsys.readouterr()


def test_argument_errors_name_what_is_wanted_not_a_function(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit):
        cli.main(["query", "order-count", "all", "--limit", "abc"])
    err = capsys.readouterr().err
    assert "invalid positive integer value: 'abc'" in err and "_positive" not in err
    with pytest.raises(SystemExit):
        cli.main(["rebalance", "--timeout", "soon"])
    assert "invalid number of seconds value: 'soon'" in capsys.readouterr().err
    for command in (["token"], ["query", "s", "get", "k"], ["down"], ["drop", "s"], ["status"], ["up"]):
        with pytest.raises(SystemExit):
            cli.main([*command[:1], "--help"])
        shown = capsys.readouterr().out
        assert "Ray address; default $RAY_ADDRESS" in shown and "riqr's Ray namespace" in shown, command


def test_an_address_where_no_ray_cluster_listens_is_an_error_at_once_not_a_hang(capsys) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["query", "order-count", "get", "1", "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    # Ray's own reading of the address: 127.0.0.1 may be written as this node's IP.
    assert err.startswith("riqr: cannot reach the Ray cluster: no Ray cluster answers at ") and f":{port} (" in err
    assert f"127.0.0.1:{port}" in err  # the address as given, beside what Ray made of it


def test_an_address_whose_lookup_hangs_is_an_error_within_the_probes_time(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import threading
    import time

    import ray._private.services as services

    from runtime.client import join_ray

    release = threading.Event()
    monkeypatch.setattr(services, "canonicalize_bootstrap_address", lambda address: release.wait(30) and None)
    started = time.monotonic()
    try:
        with pytest.raises(ConnectionError, match=r"no Ray cluster answered at riqr-head\.invalid:6379 within 0\.3 s"):
            join_ray("riqr-head.invalid:6379", "riqr", probe_timeout=0.3)
    finally:
        release.set()
    assert time.monotonic() - started < 5  # not the resolver's own minutes


def test_a_cluster_that_listens_but_will_not_let_the_client_join_names_rays_token(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """A wrong Ray token: Ray's client retries, logs InvalidAuthToken, and raises a bare "Failed to connect"
    (checked against a `ray start` with RAY_AUTH_MODE=token and a wrong RAY_AUTH_TOKEN); riqr names the
    likely cause. ``ray.init`` is stood in for: unit tests start no Ray."""
    import socket

    import ray

    with socket.socket() as listening:
        listening.bind(("0.0.0.0", 0))  # Ray reads a local address as this node's
        listening.listen()
        port = listening.getsockname()[1]

        def refused(**_: object) -> None:
            raise ConnectionError(f"Failed to connect to Ray cluster at 127.0.0.1:{port}")

        monkeypatch.setattr(ray, "init", refused)
        assert cli.main(["token", "--address", f"127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"riqr: cannot join the Ray cluster: Failed to connect to Ray cluster at 127.0.0.1:{port}")
    assert "RAY_AUTH_TOKEN" in err and "InvalidAuthToken" in err and "Traceback" not in err


def test_a_drain_waits_until_the_moved_actors_old_copies_are_gone(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from riqr import moves

    listings = iter([["a", "b", "x"], ["b", "x"], ["x"]])
    monkeypatch.setattr(moves, "_named_in", lambda _ns: next(listings))
    monkeypatch.setattr(moves, "_LOOK_EVERY", 0.0)
    said: list[str] = []
    assert moves.wait_until_deleted("ns", ["a", "b"], say=said.append) == []
    assert said == ["waiting for the old copies (2) to be deleted (a grace of a few seconds for reads sent to them)"]
    monkeypatch.setattr(moves, "_named_in", lambda _ns: ["a"])
    assert moves.wait_until_deleted("ns", ["a"], timeout=0.0, say=said.append) == ["a"]  # named when it gives up
    assert moves.wait_until_deleted("ns", [], say=said.append) == [] and len(said) == 2  # nothing moved: no wait


def test_riqr_run_leaves_logging_to_the_topology_each_line_once(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import logging

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", list(__import__("sys").path))
    monkeypatch.setattr(logging.root, "handlers", [])  # as a shell starts it: the command's handler is the first
    (tmp_path / "riqr_test_logging.py").write_text(
        "import logging\nfrom runtime import logs\n"
        "def main(argv, prog=None):\n"
        "    handler = logs.configure('info', 'json')\n"
        "    logging.getLogger('topologies.runner').info('home here')\n"
        "    logging.getLogger().removeHandler(handler)\n"
        "    return 0\n"
    )
    assert cli.main(["run", "riqr_test_logging"]) == 0
    err = capsys.readouterr().err
    assert err.count("home here") == 1 and err.lstrip().startswith("{"), err  # once, as the JSON it asked for


def test_the_clis_commands_join_ray_without_its_info_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """A black-box run: every `riqr query` and `riqr status` printed Ray's "Connecting to existing Ray
    cluster" info lines above its own output; Ray's warnings (a wrong token's) still show."""
    import logging

    import ray

    import runtime.client
    from riqr import cli

    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(runtime.client, "_probe_bootstrap", lambda target, timeout: True)
    monkeypatch.setattr(ray, "init", lambda **options: asked.append(options))
    cli._connect_ray("10.0.0.1:6379", "riqr")
    runtime.client.join_ray("10.0.0.1:6379", "riqr")  # a library caller's Ray logs as Ray sets them
    assert asked[0]["logging_level"] == logging.WARNING and "logging_level" not in asked[1]


def test_riqr_up_warns_of_a_ray_cluster_without_token_auth_only() -> None:
    from riqr.access import ray_auth_warning

    said = ray_auth_warning("disabled")
    assert said is not None and "without token authentication (its mode: disabled)" in said
    assert "RAY_AUTH_MODE=token" in said and "Running Ray safely" in said
    assert ray_auth_warning("token") is None
    assert ray_auth_warning(None) is None  # could not be told: nothing said rather than a guess


def test_spark_s_jvm_gone_under_riqr_run_is_not_called_ray_unreachable(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """A black-box run killed the Spark JVM of `riqr run`: py4j's refused connection ended the topology with
    "riqr: cannot reach the Ray cluster: [Errno 111] Connection refused" while Ray was fine."""
    import importlib
    import sys as _sys

    (tmp_path / "py4j").mkdir()
    (tmp_path / "py4j" / "fake_gateway.py").write_text(
        "def send():\n    raise ConnectionRefusedError(111, 'Connection refused')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "py4j"))
    gateway = importlib.import_module("fake_gateway")
    monkeypatch.setattr(cli, "_cmd_run", lambda args: gateway.send())
    try:
        assert cli.main(["run", "food_orders"]) == 1
    finally:
        _sys.modules.pop("fake_gateway", None)
    err = capsys.readouterr().err
    assert err.startswith("riqr: lost Spark's driver JVM (its py4j gateway: [Errno 111] Connection refused)"), err
    assert "Ray cluster" not in err

    def refused_elsewhere(args: object) -> int:
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(cli, "_cmd_run", refused_elsewhere)
    assert cli.main(["run", "food_orders"]) == 2
    assert capsys.readouterr().err.startswith("riqr: cannot reach the Ray cluster")


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["up", "--port", "99999"], "must be a TCP port, 0 to 65535"),
        (["up", "--port", "-5"], "must be a TCP port, 0 to 65535"),
        (["demo", "--port", "65536"], "must be a TCP port, 0 to 65535"),
        (["demo", "--ready-timeout", "nan"], "must be a finite number of seconds"),
        (["demo", "--ready-timeout", "-5"], "must be a finite number of seconds"),
        (["rebalance", "--timeout", "inf"], "must be a finite number of seconds"),
        (["standbys", "order-count", "-1"], "argument N: must be at least 0, got -1"),
        (["query", "s", "all", "--limit", "0"], "argument --limit: must be at least 1, got 0"),
        (["query", "s", "all", "--limit", "two"], "invalid positive integer value: 'two'"),
    ],
)
def test_ports_and_seconds_no_command_can_use_are_refused_before_it_joins_ray(argv, words, capsys) -> None:  # type: ignore[no-untyped-def]
    """A port past 65535 failed inside each node's HTTP verticle (OverflowError from bind(), not the
    OSError it handled), which then kept that port for every later `riqr up` until `riqr down`; a nan
    timeout never ended and inf never gave up."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and words in capsys.readouterr().err


def test_ctrl_c_ends_a_command_with_a_line_not_a_traceback_and_by_sigint(tmp_path: Path) -> None:
    """A traceback before; then a plain exit 130, which a shell loop runs on from (`for s in a b; do riqr
    query $s all; done` needed a Ctrl-C per store). Now one line, and the process ends by SIGINT."""
    import signal
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "interrupted.py"
    script.write_text(
        textwrap.dedent("""
        import sys
        from riqr import cli
        def interrupted(args):
            raise KeyboardInterrupt
        cli._cmd_produce = interrupted
        sys.exit(cli.main(["produce", "t"]))
    """)
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60,
                          cwd=Path(cli.__file__).parents[1])  # fmt: skip
    assert done.returncode == -signal.SIGINT, (done.returncode, done.stderr)
    assert done.stderr == "riqr: interrupted\n" and done.stdout == ""


def test_a_command_whose_spark_cannot_start_says_what_java_it_looked_for(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from topologies.spark import SparkNotStarted

    def no_java(args: Any) -> int:
        raise SparkNotStarted("Spark's driver JVM did not start (JAVA_HOME is not set; java on PATH: none)")

    monkeypatch.setattr(cli, "_cmd_demo", no_java)
    assert cli.main(["demo"]) == 2
    said = capsys.readouterr().err
    assert said == "riqr: Spark's driver JVM did not start (JAVA_HOME is not set; java on PATH: none)\n"


def test_an_unreachable_ray_address_from_the_environment_is_named_as_such(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    assert cli.main(["status"]) == 2
    err = capsys.readouterr().err
    assert f"no Ray cluster answers at $RAY_ADDRESS=127.0.0.1:{port}" in err and " auto" not in err


def test_a_range_bound_given_twice_is_said_before_joining_ray(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """It was found only once the store was being read: with no cluster there, the operator was told the
    cluster was unreachable instead."""

    def joins(*_: Any, **__: Any) -> None:
        raise AssertionError("joined Ray for a command line that cannot run")

    monkeypatch.setattr(cli, "_connect_ray", joins)
    assert cli.main(["query", "s", "range", "1", "5", "--from", "2"]) == 2
    assert "the lower bound is given twice: as an argument and --from" in capsys.readouterr().err
