"""``fairseq-rope-serve`` as a user starts it: loopback by default, the API key from a file or
the environment and never the command line, and SIGTERM answering the request in flight."""

from __future__ import annotations

import json
import signal
import socket
import subprocess

import pytest

from fairseq_rope_serve.server.cli import KEY_VARIABLE, main
from tests.serve.conftest import LOOPBACK, TIMEOUT, post, request

GOOD = {"q": "Hello.", "source": "en", "target": "de"}


def test_it_listens_on_loopback_unless_told(serve, raw_test_set, reference):
    server = serve()
    assert server.host == LOOPBACK
    reply = post(server.port, {**GOOD, "q": raw_test_set[:3]})
    assert (reply.status, reply.body) == (200, {"translatedText": [reference[s] for s in raw_test_set[:3]]})
    assert server.stop()[0] == 0


def test_the_key_from_the_environment_or_a_file(serve, tmp_path, raw_test_set, reference):
    key_file = tmp_path / "key"
    key_file.write_text("from-the-file\n")
    for server, key in ((serve(env={KEY_VARIABLE: "from-the-env"}), "from-the-env"),
                        (serve("--api-key-file", str(key_file)), "from-the-file")):
        assert "(API key required)" in "".join(server.log) and key not in "".join(server.log)
        assert post(server.port, GOOD).status == post(server.port, {**GOOD, "api_key": "wrong"}).status == 403
        reply = post(server.port, {**GOOD, "q": raw_test_set[4], "api_key": key})
        assert (reply.status, reply.body) == (200, {"translatedText": reference[raw_test_set[4]]})


@pytest.mark.parametrize("argv, env, error", [
    (["--api-key-file", "KEY"], {KEY_VARIABLE: "k"},
     f"error: both --api-key-file and {KEY_VARIABLE} are set: give the key one way\n"),
    (["--api-key-file", "EMPTY"], {}, "error: the API key (EMPTY) is empty\n"),
    ([], {KEY_VARIABLE: " "}, f"error: the API key ({KEY_VARIABLE}) is empty\n"),
])
def test_a_key_given_two_ways_or_empty_is_refused(tmp_path, monkeypatch, capsys, argv, env, error):
    (tmp_path / "KEY").write_text("k\n")
    (tmp_path / "EMPTY").write_text("\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["no-model", *argv]) == 1
    assert capsys.readouterr().err == error


def test_there_is_no_way_to_give_the_key_on_the_command_line(capsys):
    """Other users see a command line (ps); not even a prefix of --api-key-file is taken."""
    with pytest.raises(SystemExit) as exit:
        main(["no-model", "--api-key", "s3cret"])
    assert exit.value.code == 2 and "unrecognized arguments: --api-key s3cret" in capsys.readouterr().err


def test_sigterm_answers_the_request_in_flight_then_exits(serve, raw_test_set, reference):
    """A request whose body is half sent when SIGTERM comes: the server stops accepting
    connections, waits for the rest of the body, answers it, and exits with status 0."""
    server = serve()
    body = json.dumps({**GOOD, "q": raw_test_set[:4]}).encode()
    half = len(body) // 2
    with socket.create_connection((LOOPBACK, server.port), timeout=TIMEOUT) as client:
        client.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: %d\r\n\r\n%s" % (len(body), body[:half]))
        while request(server.port, "GET", "/health").body["in_flight"] < 1:
            pass  # the request is in the application, waiting for its body
        server.process.send_signal(signal.SIGTERM)
        while listening(server.port):
            try:
                server.process.wait(0.01)
            except subprocess.TimeoutExpired:
                pass
        assert server.process.poll() is None  # still there, for the request in flight
        client.sendall(body[half:])
        answer = b"".join(iter(lambda: client.recv(65536), b""))
    assert answer.startswith(b"HTTP/1.1 200 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"translatedText": [reference[s] for s in raw_test_set[:4]]}
    status, log = server.stop()
    assert status == 0, log


def listening(port: int) -> bool:
    try:
        socket.create_connection((LOOPBACK, port), timeout=TIMEOUT).close()
        return True
    except ConnectionRefusedError:
        return False
