"""fairseq-rope-serve's HTTP API, as LibreTranslate's clients use it, through the standard
library's plain HTTP client on loopback: translations equal fairseq's; every refusal is its
status with a JSON error, and the server answers the next request as before."""

from __future__ import annotations

import json
import socket
from types import SimpleNamespace
from urllib.parse import urlencode

import pytest

from fairseq_rope_serve.server.app import Limits, create_app
from fairseq_rope_serve.translator import TextTranslator
from tests.serve.conftest import LOOPBACK, app_server, post, request

#: Small limits, so that the tests can reach them with little text.
LIMITS = Limits(max_body_bytes=4000, max_chars=600, max_sentences=6)


@pytest.fixture(scope="module")
def port(exported):
    with app_server(create_app(TextTranslator(exported("rope"), threads=1), LIMITS)) as port:
        yield port


def test_translate_a_string_and_a_list(port, raw_test_set, reference):
    """q a string (each line a sentence, a blank one kept) → a string; q a list → a list."""
    text = "\n".join([raw_test_set[0], "", raw_test_set[1]])
    reply = post(port, {"q": text, "source": "en", "target": "de"})
    assert (reply.status, reply.body) == (200, {"translatedText": "\n".join(reference[s] for s in text.split("\n"))})
    assert reply.headers["content-type"] == "application/json"
    texts = raw_test_set[2:5]
    reply = post(port, {"q": texts, "source": "en", "target": "de", "format": "text"})
    assert (reply.status, reply.body) == (200, {"translatedText": [reference[s] for s in texts]})


def test_translate_a_form_as_libretranslates_own_client_sends(port, raw_test_set, reference):
    body = urlencode({"q": raw_test_set[7], "source": "en", "target": "de", "api_key": ""}).encode()
    reply = request(port, "POST", "/translate", body, {"Content-Type": "application/x-www-form-urlencoded"})
    assert (reply.status, reply.body) == (200, {"translatedText": reference[raw_test_set[7]]})


def test_languages_and_health(port):
    assert request(port, "GET", "/languages").body == [{"code": "en", "name": "English", "targets": ["de"]},
                                                       {"code": "de", "name": "German", "targets": []}]
    health = request(port, "GET", "/health")
    assert health.status == 200 and health.body["status"] == "ok"
    assert (health.body["source"], health.body["target"]) == ("en", "de")


GOOD = {"q": "Hello.", "source": "en", "target": "de"}
#: (body, status, error): each refusal and its message.
REFUSALS = [
    (b"{\"q\": \"Hello.\", ", 400, "the body is not valid JSON"),
    (b"\xff\xfe{}", 400, "the body is not valid JSON"),
    (b"[" * 1900 + b"]" * 1900, 400, "the body is not valid JSON"),  # deeper than the parser goes
    (b"[\"Hello.\"]", 400, "the body must be a JSON object with q, source and target"),
    ({"source": "en", "target": "de"}, 400, "q is required"),
    ({"q": "Hello.", "target": "de"}, 400, "source is required"),
    ({**GOOD, "q": 3}, 400, "q must be a string or a list of strings"),
    ({**GOOD, "q": ["Hello.", None]}, 400, "q must be a string or a list of strings"),
    ({**GOOD, "q": {"text": "Hello."}}, 400, "q must be a string or a list of strings"),
    ({**GOOD, "target": ["de"]}, 400, "target must be a string"),
    ({**GOOD, "q": ""}, 400, "q is empty: nothing to translate"),
    ({**GOOD, "q": []}, 400, "q is empty: nothing to translate"),
    ({**GOOD, "q": [" ", "\n"]}, 400, "q is empty: nothing to translate"),
    ({**GOOD, "source": "de", "target": "en"}, 400,
     "this server translates en to de, not de to en (GET /languages)"),
    ({**GOOD, "source": "fr"}, 400, "this server translates en to de, not fr to de (GET /languages)"),
    ({**GOOD, "format": "xml"}, 400, "format 'xml' is not supported: text or html"),
    ({**GOOD, "alternatives": "two"}, 400, "alternatives must be a whole number"),
    ({**GOOD, "alternatives": 4}, 400, "alternatives must be at most 3 (the beam's other hypotheses)"),
    ({**GOOD, "q": "a" * 601}, 413, "q has 601 characters, more than this server's limit of 600"),
    ({**GOOD, "q": ["a" * 300, "b" * 301]}, 413, "q has 601 characters, more than this server's limit of 600"),
    ({**GOOD, "q": "a\n" * 6 + "a"}, 413, "q has 7 lines (sentences), more than this server's limit of 6"),
    ({**GOOD, "q": ["a", "b\nc", "d", "e", "f", "g"]}, 413,
     "q has 7 lines (sentences), more than this server's limit of 6"),
    ({**GOOD, "padding": "x" * 4000}, 413,
     f"the body has {len(json.dumps({**GOOD, 'padding': 'x' * 4000}))} bytes, more than this server's limit of 4000"),
]


@pytest.mark.parametrize("body, status, error", REFUSALS)
def test_each_bad_request_gets_its_error_and_the_server_goes_on(port, raw_test_set, reference, body, status, error):
    reply = post(port, body)
    assert (reply.status, reply.body) == (status, {"error": error})
    reply = post(port, {**GOOD, "q": raw_test_set[3]})
    assert (reply.status, reply.body) == (200, {"translatedText": reference[raw_test_set[3]]})


def raw_exchange(port: int, head: bytes, body: bytes = b"") -> bytes:
    """What the server answers to ``head`` (and ``body``), read until it closes the connection."""
    with socket.create_connection((LOOPBACK, port), timeout=60) as connection:
        connection.sendall(head + body)
        connection.shutdown(socket.SHUT_WR)  # no more from the client: what it declared is never sent
        return b"".join(iter(lambda: connection.recv(65536), b""))


def test_the_declared_body_size_is_refused_before_the_body_is_read(port):
    """A Content-Length of 1 GB and no body at all: the 413 comes from the header alone."""
    head = (b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000\r\nConnection: close\r\n\r\n")
    answer = raw_exchange(port, head)
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert answer.split(b"\r\n\r\n", 1)[1] == b'{"error":"the body has 1000000000 bytes, more than this server\'s limit of 4000"}'


def test_a_chunked_body_is_refused_as_soon_as_it_exceeds_the_limit(port):
    """No Content-Length (chunked): counted while read, refused at the chunk that passes 4000 bytes."""
    head = b"POST /translate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    chunk = b"x" * 3000
    answer = raw_exchange(port, head, b"%x\r\n%s\r\n" % (len(chunk), chunk) * 2 + b"0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "the body has more than this server's limit of 4000 bytes"}


def test_unknown_paths_and_methods_are_json_errors(port):
    assert (request(port, "GET", "/nowhere").status, request(port, "GET", "/nowhere").body) == (404, {"error": "Not Found"})
    reply = request(port, "GET", "/translate")
    assert (reply.status, reply.body) == (405, {"error": "Method Not Allowed"})


def test_an_unexpected_error_is_a_500_without_its_traceback(exported):
    """The model fails (here: on purpose): the client gets a generic JSON error, not the
    exception's text or traceback; the next request is served."""
    model = TextTranslator(exported("rope"), threads=1)
    calls = []

    def translate_full(lines, alternatives=()):
        calls.append(lines)
        if len(calls) == 1:
            raise RuntimeError("secret detail of the failure")
        return model.translate_full(lines, alternatives)

    fake = SimpleNamespace(settings=model.settings, decoding=model.decoding, translate_full=translate_full)
    with app_server(create_app(fake)) as port:
        reply = post(port, GOOD)
        assert (reply.status, reply.body) == (500, {"error": "internal error; the server's log has the details"})
        assert post(port, GOOD).body == {"translatedText": model.translate(["Hello."])[0]}


def test_the_api_key_when_the_server_has_one(exported, raw_test_set, reference):
    """Translate needs the key, /languages and /health do not; a wrong, missing or non-string key is a 403."""
    with app_server(create_app(TextTranslator(exported("rope"), threads=1), api_key="s3cret")) as port:
        for key in (None, "", "s3cre", "s3cret ", 42):
            payload = {**GOOD, **({} if key is None else {"api_key": key})}
            reply = post(port, payload)
            assert (reply.status, reply.body) == (403, {"error": "invalid or missing API key (api_key)"}), key
        reply = post(port, {**GOOD, "q": raw_test_set[0], "api_key": "s3cret"})
        assert (reply.status, reply.body) == (200, {"translatedText": reference[raw_test_set[0]]})
        assert request(port, "GET", "/languages").status == request(port, "GET", "/health").status == 200
