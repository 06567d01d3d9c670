"""A real ``paceline serve`` for the tests, on the memory store and on a Redis the tests
start themselves, each on a free port, stopped when the tests end (also on failure)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# The policies and queues the tests use; each worker test has a queue of its own.
CONFIG = """
allow_inline_policies = true

[policies]
api = "gcra:rate=1/m,burst=2"
"""
QUEUE = """
[queues.{name}]
group_policy = "gcra:rate=1000/s,burst=100"
lease = "{lease}"
retry_backoff = "10ms"
retry_backoff_max = "20ms"
"""
# Keeps its acknowledged jobs readable, with their results.
RESULTS = """
[queues.results]
group_policy = "gcra:rate=1000/s,burst=100"
lease = "30s"
keep_completed = 1000
"""
QUEUES = {
    "jobs": "30s",
    "manual": "30s",
    "work": "30s",
    "failing": "30s",
    "upstream": "30s",
    "upstream-http": "30s",
    "lost": "1s",
    "shutdown": "30s",
    "sigterm": "30s",
    "async-producer": "30s",
    "release": "30s",
    "paused": "30s",
    "deep": "30s",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} never listened on {port}")


def paceline_bin() -> str:
    given = os.environ.get("PACELINE_BIN")
    if given:
        return given
    built = ROOT / "target" / "debug" / "paceline"
    if not built.exists():
        subprocess.run(
            ["cargo", "build", "--locked", "-q", "-p", "paceline-cli"], cwd=ROOT, check=True
        )
    return str(built)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("redis-server is missing: the Redis tests need it (apt-get install redis-server)")
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_port(port, proc, "redis-server")
        yield f"redis://127.0.0.1:{port}"
    finally:
        stop(proc)


@pytest.fixture(scope="session", params=["memory", "redis"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The URL of a ``paceline serve`` on the memory store, then on Redis."""
    store = "memory" if request.param == "memory" else request.getfixturevalue("redis_url")
    yield from serve(store, [])


TOKEN = "s3cret-token"


@pytest.fixture(scope="session")
def token_url() -> Iterator[str]:
    """The URL of a ``paceline serve`` that asks for the token ``TOKEN``."""
    yield from serve("memory", ["--auth-token", TOKEN])


def serve(store: str, flags: list[str]) -> Iterator[str]:
    folder = tempfile.mkdtemp(prefix="paceline-py-")
    config = Path(folder) / "paceline.toml"
    config.write_text(
        CONFIG + "".join(QUEUE.format(name=n, lease=lease) for n, lease in QUEUES.items()) + RESULTS
    )
    port = free_port()
    log = open(Path(folder) / "serve.log", "wb")
    proc = subprocess.Popen(
        [paceline_bin(), "serve", "--listen", f"127.0.0.1:{port}", "--store", store, "--config", str(config), *flags],
        stdout=log,
        stderr=log,
    )
    try:
        wait_port(port, proc, "paceline serve")
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A name no other test (nor the other store's run) uses: keys, groups, job ids."""
    return f"{request.node.name}-{time.time_ns()}".replace("[", "-").replace("]", "")
