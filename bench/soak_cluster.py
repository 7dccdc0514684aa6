"""The soak's cluster, started and stopped as an operator would (bench/soak.py): ``ray start --head`` with
Ray's token auth, ``riqr up``, one ``ray job submit`` of the soak topology; at the end ``ray job stop``,
``riqr down``, and Ray's processes stopped by pid.

Everything lives under one work directory: Ray's temp dir (sessions, logs, sockets), its auth token, the
riqr home (landing files, checkpoints, dead letters) and data dir. Ray runs as ``ray start --head --block``, a
child of this process, so SIGTERM to that one pid stops the processes Ray started (its own shutdown), and
this process is a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): whatever Ray's processes start and
leave orphaned (workers, the job's driver, Spark's JVM) is reparented here rather than to init, so the
final sweep finds every process the soak started, and only those, by walking this process's children.
``ray stop`` is never used: it stops every Ray on the machine, other people's too.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from bench.soak_figures import Sample, classify, descendants

__all__ = [
    "Head",
    "alive",
    "become_subreaper",
    "disk_usage",
    "process_table",
    "processes_under",
    "sample_processes",
    "stop_descendants",
    "REPO",
]

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
NAMESPACE = "riqr"
_PR_SET_CHILD_SUBREAPER = 36


def say(text: str) -> None:
    print(f"[soak {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def process_table() -> dict[int, int]:
    """Every live process's parent, from ``/proc``."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            if stat:
                parents[int(entry)] = int(stat.rsplit(b")", 1)[1].split()[1])
    return parents


def _cmdline(pid: int) -> list[str]:
    raw = _read(f"/proc/{pid}/cmdline") or b""
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _status(pid: int) -> tuple[int, int, int] | None:
    """RSS (KiB), threads and open descriptors of ``pid``; None if it is gone."""
    raw = _read(f"/proc/{pid}/status")
    if raw is None:
        return None
    fields = dict(line.split(":", 1) for line in raw.decode(errors="replace").splitlines() if ":" in line)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    rss = fields.get("VmRSS", "0 kB").split()[0]
    return int(rss), int(fields.get("Threads", "0").strip()), fds


def sample_processes(t: float, root: int | None = None) -> list[Sample]:
    """One look at every process under ``root`` (this process by default) that plays a role."""
    out = []
    for pid in processes_under(root or os.getpid()):
        role = classify(_cmdline(pid))
        status = _status(pid) if role else None
        if role and status:
            out.append(Sample(t, pid, role, *status))
    return out


def processes_under(pid: int) -> list[int]:
    """Every process below ``pid`` now (children, theirs, ...), from ``/proc``."""
    return descendants(process_table(), pid)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: there, and not a zombie waiting to be reaped."""
    stat = _read(f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def stop_descendants(grace: float = 10.0, root: int | None = None) -> list[str]:
    """SIGTERM every live process under ``root`` (this one by default), SIGKILL what is left after
    ``grace``; returns what had to be stopped, as ``pid command``. Nothing outside this process's tree is
    touched. (Exited orphans reparented here are only reaped.)"""
    me = root or os.getpid()
    _reap()
    left = [pid for pid in processes_under(me) if alive(pid)]
    said = [f"{pid} {' '.join(_cmdline(pid))[:120]}" for pid in left]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while left and time.monotonic() < deadline:
            _reap()
            under = set(processes_under(me))
            left = [p for p in left if p in under and alive(p)]
            time.sleep(0.2)
    _reap()
    return said


def _reap() -> None:
    """Collect exited children (orphans reparented to a subreaper are its children)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def disk_usage(path: Path) -> tuple[int, int]:
    """Bytes and files under ``path`` (0, 0 if it does not exist)."""
    size = files = 0
    for directory, _, names in os.walk(path):
        for name in names:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(directory, name)).st_size
                files += 1
    return size, files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class Head:
    """A one-node Ray cluster with riqr and the soak topology on it, under ``work``."""

    work: Path
    partitions: int = 4
    actors: int = 2
    windowed: bool = True
    gcs_port: int = field(default_factory=free_port)
    dashboard_port: int = field(default_factory=free_port)
    ray: subprocess.Popen[bytes] | None = None
    url: str = ""  # the REST API
    token: str = ""  # riqr up's bearer token
    job_id: str = ""
    _logs: list[IO[bytes]] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return self.work / "home"

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def stores(self) -> list[str]:
        names = ["customer-v1-changelog", "order-count"]
        return names + (["orders-per-minute", "order-sessions"] if self.windowed else [])

    def environment(self) -> dict[str, str]:
        """What every process of the cluster runs with (Ray's processes pass it on to workers and jobs):
        riqr's home and data dir under the work dir, Ray's token auth with a token of this cluster's own
        (never ~/.ray/auth_token), ``.venv/bin`` first on PATH (the job's ``python``)."""
        token = self.work / "ray-auth-token"
        if not token.exists():
            token.write_text(secrets.token_hex(32))
            token.chmod(0o600)
        return {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "RIQR_HOME": str(self.home),
            "RIQR_DATA": str(self.work / "data"),
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",  # nothing to drain: riqr is down by then
        }

    def _log(self, name: str) -> IO[bytes]:
        log = open(self.work / "logs" / name, "ab")  # noqa: SIM115 (closed by stop)
        self._logs.append(log)
        return log

    def _run(self, *args: str, timeout: float = 300) -> str:
        done = subprocess.run(
            [str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
            env=self.environment(), check=False,
        )  # fmt: skip
        with open(self.work / "logs" / "commands.log", "a") as log:
            log.write(f"$ {' '.join(args)}\n(exit {done.returncode})\n{done.stdout}{done.stderr}\n")
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:3])} failed (exit {done.returncode}): {done.stderr[-2000:]}")
        return done.stdout + done.stderr

    def start(self) -> None:
        """``ray start --head``, ``riqr up``, ``ray job submit``; returns once every store serves."""
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        for topic in ("order", "customer"):  # Spark's file source refuses a directory that does not exist
            (self.home / "data" / topic).mkdir(parents=True, exist_ok=True)
        env = self.environment()
        os.environ.update({k: env[k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RIQR_HOME")})
        say(f"ray start --head (GCS {self.address}, dashboard {self.dashboard}, temp dir {self.work / 'ray'})")
        argv = [
            str(BIN / "ray"), "start", "--head", "--block", "--disable-usage-stats",
            f"--port={self.gcs_port}", "--node-ip-address=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}", "--dashboard-host=127.0.0.1",
            f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
            f"--temp-dir={self.work / 'ray'}",
        ]  # fmt: skip
        log = self._log("ray-start.log")
        self.ray = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.work)
        started = time.monotonic()
        while not (_port_open(self.gcs_port) and _port_open(self.dashboard_port) and self._ray_said_started()):
            if self.ray.poll() is not None:
                raise RuntimeError(f"ray start exited {self.ray.returncode}: see {self.work / 'logs/ray-start.log'}")
            if time.monotonic() - started > 120:
                raise TimeoutError("Ray's head did not start within 120 s")
            time.sleep(0.5)
        say(f"Ray up in {time.monotonic() - started:.1f}s (pid {self.ray.pid}); riqr up")
        out = self._run(
            str(BIN / "riqr"), "up", "--address", self.address, "--namespace", NAMESPACE,
            "--host", "127.0.0.1", "--port", "0", "--advertise-host", "127.0.0.1",
        )  # fmt: skip
        urls = re.findall(r"REST API at (http://\S+)", out)
        tokens = re.findall(r"\beyJ[\w-]+\.[\w-]+\.[\w-]+", out)
        if len(urls) != 1 or len(tokens) != 1:
            raise RuntimeError(f"riqr up did not print one REST URL and one token:\n{out}")
        self.url, self.token = urls[0], tokens[0]
        self.job_id = f"riqr-soak-{uuid.uuid4().hex[:8]}"
        say(f"REST API at {self.url}; ray job submit {self.job_id} (python -m bench.soak_topology)")
        excludes = [".git", ".venv", ".mypy_cache", ".hypothesis", ".pytest_cache", "tests", "docs"]
        self._run(
            str(BIN / "ray"), "job", "submit", "--address", self.dashboard, "--submission-id", self.job_id,
            "--no-wait", "--working-dir", str(REPO), "--runtime-env-json", json.dumps({"excludes": excludes}),
            "--", "python", "-m", "bench.soak_topology", "--namespace", NAMESPACE, "--home", str(self.home),
            "--partitions", str(self.partitions), "--actors", str(self.actors),
            *([] if self.windowed else ["--no-windowed"]),
        )  # fmt: skip

    def _ray_said_started(self) -> bool:
        return b"Ray runtime started" in (_read(str(self.work / "logs" / "ray-start.log")) or b"")

    def job_status(self) -> str:
        """The topology job's status (``RUNNING``, ``FAILED``, ...)."""
        from ray.job_submission import JobSubmissionClient

        return str(JobSubmissionClient(self.dashboard).get_job_status(self.job_id))

    def job_logs(self) -> str:
        from ray.job_submission import JobSubmissionClient

        return str(JobSubmissionClient(self.dashboard).get_job_logs(self.job_id))

    def headers(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}

    def stop(self) -> list[str]:
        """``ray job stop``, ``riqr down``, then Ray's head by its pid (SIGTERM: Ray stops what it started),
        then any process under this one that is left (its pid and command are returned: none, normally)."""
        steps: list[tuple[str, list[str]]] = []
        if self.job_id:
            steps.append(("ray job stop", [str(BIN / "ray"), "job", "stop", "--address", self.dashboard, self.job_id]))
        if self.url:
            steps.append(
                ("riqr down", [str(BIN / "riqr"), "down", "--address", self.address, "--namespace", NAMESPACE])
            )
        for name, argv in steps:
            try:
                say(name)
                self._run(*argv, timeout=180)
                if name == "ray job stop":
                    with open(self.work / "logs" / "topology-job.log", "w") as out:
                        out.write(self.job_logs())
            except Exception as err:  # the next step, and the pids, stop what this one did not
                say(f"{name} failed: {err}")
        if self.ray is not None and self.ray.poll() is None:
            say(f"stopping Ray's head (pid {self.ray.pid})")
            self.ray.send_signal(signal.SIGTERM)
            try:
                self.ray.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.ray.kill()
                self.ray.wait(timeout=30)
        left = stop_descendants()
        for log in self._logs:
            log.close()
        return left


@contextlib.contextmanager
def started(head: Head) -> Iterator[Head]:
    """``head`` started, and stopped however the block ends (what it had to kill is said)."""
    try:
        head.start()
        yield head
    finally:
        left = head.stop()
        if left:
            say(
                f"{len(left)} process(es) of this run outlived Ray's own stop (the dashboard's forked modules, "
                "normally) and were ended by pid:"
            )
            for line in left:
                say(f"  {line}")
