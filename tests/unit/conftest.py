"""Unit tests never start Ray: any attempt fails loudly instead of silently booting a cluster.

Nor do they use a Ray session the process is already connected to: a plain ``pytest tests`` runs the
integration tests first, in this process, and their session may still be connected when the unit tests
run. Every Ray entry point riqr calls then fails the test that calls it, instead of silently reaching
that cluster (a test that fakes one sets its own fake over the refusal).
"""

from __future__ import annotations

import importlib
import os

import pytest

# The Ray calls of runtime/, verticles/, topologies/ and riqr/ (``ray.<name>`` and the modules they take
# from ray), by module: each one, in a connected process, would act on that session. Not
# ``ray.util.get_node_ip_address``: it only reads this host's address, and Ray's own exceptions call it
# (``RayTaskError(...)``, which unit tests build).
RAY_ENTRY_POINTS: dict[str, tuple[str, ...]] = {
    "ray": (
        "get", "put", "wait", "kill", "remote", "get_actor", "nodes", "get_runtime_context", "shutdown",
        "cluster_resources", "available_resources",
    ),
    "ray.util": ("list_named_actors",),
    "ray.util.metrics": ("Counter", "Gauge", "Histogram"),
    "ray.experimental.internal_kv": ("_internal_kv_get", "_internal_kv_put", "_internal_kv_del",
                                     "_internal_kv_exists", "_internal_kv_list"),
    "ray._private.state": ("actors",),
}  # fmt: skip


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray  # here, not at import: collecting the unit tests stays fast

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("unit tests must not start or join Ray; move this test to tests/integration")

    monkeypatch.setattr(ray, "init", refuse)
    if not ray.is_initialized():
        return

    def refuse_connected(what: str) -> object:
        def refused(*_args: object, **_kwargs: object) -> None:
            raise RuntimeError(
                f"a unit test called {what} while this process is connected to Ray (the integration tests' "
                "session): unit tests never use Ray; fake it, or move the test to tests/integration"
            )

        return refused

    for module_name, names in RAY_ENTRY_POINTS.items():
        module = importlib.import_module(module_name)
        for name in names:
            monkeypatch.setattr(module, name, refuse_connected(f"{module_name}.{name}"))


@pytest.fixture
def no_feeders(monkeypatch: pytest.MonkeyPatch) -> None:
    """``supervise`` gives every feeder of the process its last words: none here. (Run after the
    integration tests, this process holds the feeders of their namespaces, long gone; finishing each
    waited out its timeout, 25 s in all.)"""
    from topologies import feeder

    monkeypatch.setattr(feeder, "_FEEDERS", {})


@pytest.fixture
def running(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """An empty table of the queries ``topologies.sink.materialize`` started in this process."""
    from topologies import sink

    table: dict[str, object] = {}
    monkeypatch.setattr(sink, "_RUNNING", table)
    monkeypatch.setattr(sink, "_REBUILT", {})
    monkeypatch.setattr(sink, "_LOOKS", {})
    monkeypatch.setattr(sink, "_FAILED_LOOKS", {})
    monkeypatch.setattr(sink, "_ASKED", {})
    monkeypatch.setattr(sink, "_UNREGISTERED", {})
    monkeypatch.setattr(sink, "_ensure_looker", lambda: None)  # no thread: the tests record looks themselves
    return table


# Hypothesis: a few seconds of examples in the normal suite; HYPOTHESIS_PROFILE=thorough for a long hunt.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "riqr", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile("thorough", parent=settings.get_profile("riqr"), max_examples=5000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "riqr"))
