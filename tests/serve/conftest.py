"""Fixtures of the runtime's tests: the deploy tests' exported toy model and fairseq's own
translations of its raw test set (the reference), and servers on loopback: in this process
(a uvicorn thread) or as the installed ``fairseq-rope-serve`` command."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest

from tests.conftest import console_script
from tests.deploy.conftest import (  # noqa: F401 (fixtures)
    checkpoint,
    deploy_data,
    exported,
    fairseq_beams,
    fairseq_model,
    fairseq_translations,
)

LOOPBACK = "127.0.0.1"
#: How long a test waits for a server's answer before it fails (no test should come near).
TIMEOUT = 60


@dataclass
class Reply:
    status: int
    body: Any  # the decoded JSON
    headers: Dict[str, str]


def request(port: int, method: str, path: str, body: Optional[bytes] = None,
            headers: Optional[Dict[str, str]] = None) -> Reply:
    """One request with the standard library's plain HTTP client; the reply's JSON decoded."""
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=TIMEOUT)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        raw = response.read()
        return Reply(response.status, json.loads(raw), {k.lower(): v for k, v in response.getheaders()})
    finally:
        connection.close()


def get_page(port: int) -> Tuple[int, str, str]:
    """GET / (the page): its status, content type and HTML."""
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=TIMEOUT)
    try:
        connection.request("GET", "/")
        response = connection.getresponse()
        return response.status, response.getheader("content-type", ""), response.read().decode("utf-8")
    finally:
        connection.close()


def post(port: int, payload: Any, **kwargs) -> Reply:
    """POST /translate with ``payload`` as JSON (bytes: sent as they are)."""
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return request(port, "POST", "/translate", body, {"Content-Type": "application/json", **kwargs})


@pytest.fixture(scope="session")
def raw_test_set(deploy_data) -> List[str]:
    return (deploy_data / "raw" / "test.en").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="session")
def reference(raw_test_set, fairseq_translations) -> Dict[str, str]:
    """Raw test sentence → fairseq's translation of it (blank lines → empty)."""
    return {**dict(zip(raw_test_set, fairseq_translations("rope"))), "": ""}


def listening_socket() -> socket.socket:
    """A socket listening on a free loopback port: requests wait in its backlog until the server runs."""
    sock = socket.socket()
    sock.bind((LOOPBACK, 0))
    sock.listen(128)
    return sock


@contextmanager
def app_server(app) -> Iterator[int]:
    """``app`` served by uvicorn in a thread of this process; yields its port."""
    import uvicorn

    sock = listening_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        sock.close()


class ServerProcess:
    """``fairseq-rope-serve MODEL_DIR --port 0 …`` started as a user starts it (in ``env``,
    default this process's environment)."""

    def __init__(self, model_dir: Path, *options: str, env: Optional[Dict[str, str]] = None,
                 command: Sequence[str] = ()) -> None:
        self.process = subprocess.Popen(
            [*(command or [console_script("fairseq-rope-serve")]), str(model_dir), "--port", "0",
             "--intra-threads", "1", "--log-level", "warning", *options],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        self.log: List[str] = []
        self._banner = threading.Event()
        self._drain = threading.Thread(target=self._read_log, daemon=True)
        self._drain.start()
        # The banner comes once it listens (the model loaded); EOF if it stopped first.
        self._banner.wait(TIMEOUT)
        found = re.search(r"fairseq-rope-serve: .* on http://(\S+):(\d+)", "".join(self.log))
        if not found:
            self.process.kill()
            raise AssertionError(f"the server did not start: {''.join(self.log)}")
        self.host, self.port = found.group(1), int(found.group(2))

    def _read_log(self) -> None:
        for line in self.process.stderr:
            self.log.append(line)
            if line.startswith("fairseq-rope-serve: "):
                self._banner.set()
        self._banner.set()

    def rss_kib(self, field: str = "VmRSS") -> int:
        """The server's resident memory (VmRSS) or its peak (VmHWM), from /proc."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} for {self.process.pid}")

    def stop(self) -> Tuple[int, str]:
        """SIGTERM; (exit status, its log)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(TIMEOUT)
        self._drain.join(TIMEOUT)
        return status, "".join(self.log)


@pytest.fixture
def serve(exported) -> Iterator:
    """``serve(*options, env={…})``: a started :class:`ServerProcess` of the rope export, with
    ``env`` added to the environment; stopped after the test."""
    started: List[ServerProcess] = []

    def start(*options: str, env: Optional[Dict[str, str]] = None) -> ServerProcess:
        started.append(ServerProcess(exported("rope"), *options, env={**os.environ, **(env or {})}))
        return started[-1]

    yield start
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait()
