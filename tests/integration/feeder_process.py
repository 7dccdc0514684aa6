"""A topology process without Spark, for tests/integration/test_liveness.py: it joins Ray, feeds one store
through this process's real ``Feeder`` (its heartbeat thread and ``supervise``), and runs until a signal.

    python -m tests.integration.feeder_process ADDRESS NAMESPACE STORE QUERY

Its query is a stand-in for Spark's StreamingQuery that runs until stopped, so the test can SIGKILL the
process (no last word) or SIGTERM it (``stopped``) and watch what the registry and ``/ready`` make of it.
"""

from __future__ import annotations

import sys


class StandInQuery:
    """Runs until ``stop()``, as far as ``supervise`` and the feeder ask."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.active = True

    @property
    def isActive(self) -> bool:  # noqa: N802 (Spark's name)
        return self.active

    def stop(self) -> None:
        self.active = False

    def exception(self) -> None:
        return None


def main(argv: list[str]) -> int:
    address, namespace, store, name = argv
    import ray

    from runtime import logs
    from topologies.feeder import feeder_for
    from topologies.runner import supervise

    logs.configure("info", "kv")
    ray.init(address=address, namespace=namespace, log_to_driver=False)
    query = StandInQuery(name)
    feeder = feeder_for(namespace)
    feeder.update(store, state="running", plan="fresh", query=name)
    feeder.attach(store, query)
    feeder.beat(timeout=30.0)  # acknowledged before the test is told to go on
    print("feeding", feeder.id, flush=True)
    return supervise([query], poll=0.05)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
