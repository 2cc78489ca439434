"""A real redis-server on 127.0.0.1 at a free port, for the tests of the shared judge cache.

Where redis-server (or the redis client) is not installed, the tests that need it skip, saying how to
install it: `.ci/run` installs it from Debian's packages, so CI always runs them.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

INSTALL = (
    "redis-server is not installed, so the Redis judge-cache tests cannot run: install it with "
    "`apt-get install -y redis-server` (Debian/Ubuntu) or `brew install redis` (macOS), then run the tests again"
)
CLIENT = "the redis client is not installed: pip install -e '.[dev]' (or 'skynet-dspy[redis]')"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RedisServer:
    """One redis-server process of our own (no persistence, loopback only); `url` reaches database 0."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        import redis

        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip(INSTALL)
        for _ in range(5):  # a port found free may be taken before the server binds it: try another
            self.port = _free_port()
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.folder)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
            client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and self.process.poll() is None:
                try:
                    client.ping()
                    return self
                except redis.RedisError:
                    time.sleep(0.05)
            self.stop()
        raise RuntimeError("redis-server did not start on 127.0.0.1 after 5 tries")

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    """A redis-server for the whole session (tests flush it: see `redis_url`)."""
    try:
        import redis  # noqa: F401
    except ImportError:
        pytest.skip(CLIENT)
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """The URL of an empty Redis database on the session's server."""
    redis_server.client().flushdb()
    return redis_server.url


@pytest.fixture
def own_redis(tmp_path):
    """A redis-server of this test's own, to stop in the middle of a run."""
    try:
        import redis  # noqa: F401
    except ImportError:
        pytest.skip(CLIENT)
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()
