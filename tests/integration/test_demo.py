"""The real `riqr demo` command: ready means the seed's queries answer with its data over REST (auth on), with
Spark's JVM started beside Ray; Ctrl-C, at any step, leaves no process of the demo behind (its JVM too).

Each test starts the demo in a scratch home, with a Ray cluster of its own, as a user does."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.soak_cluster import alive, processes_under
from bench.startup import get, seed_answers
from tests.integration.conftest import REPO
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

SUMMARY_STEP = re.compile(r"(?P<what>[^;]+?) (?P<seconds>[0-9.]+)s \(at (?P<ended>[0-9.]+)s\)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Demo:
    """``riqr demo`` running in a subprocess; its stderr and stdout lines collected as they come."""

    def __init__(self, home: Path) -> None:
        self.port = _free_port()
        self.home = home
        # No $RIQR_DATA (the session's own cluster sets one in this process): the demo keeps the stores'
        # state under its --home, as a user running it gets.
        env = {k: v for k, v in os.environ.items() if k != "RIQR_DATA"} | {"PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "riqr", "demo", "--port", str(self.port), "--home", str(home)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )  # fmt: skip
        self.lines: list[str] = []

    def read_until(self, pattern: str, timeout: float = 240.0) -> re.Match[str]:
        """Lines until one matches ``pattern`` (the demo's output is line-buffered: it flushes each)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if (m := re.search(pattern, line)) is not None:
                return m
            assert time.monotonic() < deadline, f"no {pattern!r} within {timeout:g}s:\n" + "\n".join(self.lines)
        raise AssertionError(f"the demo exited ({self.proc.wait()}) before {pattern!r}:\n" + "\n".join(self.lines))

    def interrupt(self) -> tuple[int, list[int]]:
        """Ctrl-C; returns its exit code and the processes it started that are still alive 30 s later."""
        tree = processes_under(self.proc.pid)
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.stdout is not None
        self.lines += [line.rstrip("\n") for line in self.proc.stdout]
        code = self.proc.wait(timeout=120)
        print("\n".join(self.lines))  # whole, in the captured output of a failed test (asserts truncate it)
        deadline = time.monotonic() + 30
        while any(alive(p) for p in tree) and time.monotonic() < deadline:
            time.sleep(0.2)
        return code, [p for p in tree if alive(p)]

    def kill(self) -> None:
        for pid in [*processes_under(self.proc.pid), self.proc.pid]:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    started = Demo(tmp_path)
    yield started
    if started.proc.poll() is None:  # a failed test: nothing of it may outlive the test
        started.kill()


def test_the_demo_is_ready_with_the_seed_and_spark_starts_beside_ray(demo: Demo) -> None:
    token = demo.read_until(r"^\s*TOKEN=(\S+)\s*$")[1]
    steps = {
        m["what"].strip(): (float(m["ended"]) - float(m["seconds"]), float(m["ended"]))
        for m in SUMMARY_STEP.finditer(next(line for line in demo.lines if "[riqr demo] steps: " in line))
    }
    spark = next(v for k, v in steps.items() if k.endswith("starting Spark (beside Ray)"))
    ray = next(v for k, v in steps.items() if k.endswith("starting a local Ray cluster"))
    assert spark[0] < ray[1], steps  # the JVM started before Ray was up
    base = f"http://localhost:{demo.port}"
    assert get(f"{base}/ready")[0] == 200
    assert seed_answers(base, token)
    assert get(f"{base}/stores/customer-v1-changelog/get/2")[0] == 401  # auth stays on
    state = demo.home / "state" / "riqr"
    assert state.is_dir() and any(state.iterdir()), "the stores' partitions are not under the demo's --home"
    code, left = demo.interrupt()
    assert code == 0 and not left, (left, demo.lines[-20:])
    assert "[riqr demo] stopped" in demo.lines


def test_ctrl_c_as_the_demo_becomes_ready_stops_it(demo: Demo) -> None:
    """The moment ``bench.startup`` sends its Ctrl-C: the dead-letter queries are starting and serving is
    about to begin. That Ctrl-C was once lost, and the demo served on until a second one; later it
    stopped, but its KeyboardInterrupt, raised inside the call into Spark's JVM that starts them, broke
    that call and printed py4j's tracebacks and the JVM's (a hundred lines for one Ctrl-C). A stop that
    comes while a dead-letter query plans its first batch may still see that batch's job cancelled and
    logged by Spark and py4j (docs/design.md, "A stop lets the batch in progress end"): not checked here;
    tests/integration/test_parsing_ansi.py and test_job_submit.py check the stop between batches."""
    demo.read_until(r"\] ready in ")
    code, left = demo.interrupt()
    assert code == 0 and not left, (left, demo.lines[-20:])
    assert "[riqr demo] stopped" in demo.lines
    interrupted = [line for line in demo.lines if "KeyboardInterrupt" in line]
    assert interrupted == [], interrupted


def test_ctrl_c_before_the_topology_stops_the_jvm_started_beside_ray(demo: Demo) -> None:
    demo.read_until(r"starting the registry, facades and HTTP verticles \.\.\.$")
    java = wait_for(
        lambda: [p for p in processes_under(demo.proc.pid) if b"java" in Path(f"/proc/{p}/cmdline").read_bytes()],
        timeout=60,
        what="Spark's JVM to be started",
    )
    code, left = demo.interrupt()
    assert code == 0, demo.lines[-20:]
    assert not any(alive(p) for p in java) and not left, (left, demo.lines[-20:])
