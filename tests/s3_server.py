"""A real S3-compatible server on loopback for the remote-storage tests: moto's standalone
server (``python -m moto.server``, installed by the project's set-up through the test extra),
started once per test session in its own process. Clients reach it only through the standard
AWS environment (``AWS_ENDPOINT_URL`` and test credentials), as they would a real store."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Iterator

import pytest

__all__ = ["S3Server", "s3_server", "s3_bucket", "wait_until_answered"]


def wait_until_answered(url: str, process: subprocess.Popen, seconds: float) -> bool:
    """Whether ``url`` answers within ``seconds`` while ``process`` (the server) runs."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return True
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.2)


class S3Server:
    """A running moto server: its endpoint and the environment that points clients at it."""

    def __init__(self) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        if not wait_until_answered(f"{self.endpoint}/moto-api/", self.process, 30):
            raise RuntimeError(f"moto server did not start on {self.endpoint}")

    @property
    def env(self) -> dict[str, str]:
        """The standard AWS variables that send every S3 client (s3fs, boto3) to this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One moto S3 server for the whole session (skips when moto is not installed)."""
    pytest.importorskip("moto.server", reason="the S3 tests need moto[server] (the test extra installs it)")
    pytest.importorskip("s3fs", reason="the S3 tests need s3fs (the s3 extra installs it)")
    server = S3Server()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty bucket on the session's server, with this process's AWS environment
    pointing at it (subprocesses inherit it); returns its ``s3://`` URL."""
    for key, value in s3_server.env.items():
        monkeypatch.setenv(key, value)
    import fsspec

    fs = fsspec.filesystem("s3", skip_instance_cache=True)
    name = f"tzrun-{uuid.uuid4().hex[:12]}"
    fs.mkdir(name)
    return f"s3://{name}"
