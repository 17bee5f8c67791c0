"""LibreTranslate parity for one model: the requests of the clients people connect, replayed as
each sends them (read from their sources: libretranslatepy 2.1.4, libretranslate-aio 0.1.3,
Weblate's ``machinery/libretranslate.py``, Mastodon's ``translation_service/libre_translate.rb``,
Discourse's translator and Nextcloud's ``integration_libretranslate`` through jefs42's PHP
client), against a server of the toy export on loopback; then each endpoint and field as
LibreTranslate v1.9's ``app.py`` answers it. Expected translations are the model's own."""

from __future__ import annotations

import json
import urllib.request
from typing import Dict, List, Optional
from urllib.parse import quote_plus, urlencode

import pytest

from fairseq_rope_serve.server.app import Limits, create_app
from fairseq_rope_serve.translator import TextTranslator
from tests.serve.conftest import app_server, request

ENGLISH = "A man is riding a bike down the street."
GERMAN = "Ein Mann fährt mit dem Fahrrad die Straße entlang."
FORM = {"Content-Type": "application/x-www-form-urlencoded"}
JSON = {"Content-Type": "application/json"}
KEY = "s3cret"


@pytest.fixture(scope="module")
def model(exported) -> TextTranslator:
    return TextTranslator(exported("rope"), threads=1)


@pytest.fixture(scope="module")
def port(model):
    with app_server(create_app(model, Limits(max_sentences=32))) as port:
        yield port


@pytest.fixture(scope="module")
def keyed(model):
    """A server that has an API key."""
    with app_server(create_app(model, api_key=KEY)) as port:
        yield port


def t(model: TextTranslator, *lines: str) -> List[str]:
    """The model's own translations (each line a sentence)."""
    return model.translate(list(lines))


def multipart(fields: Dict[str, str], boundary: str = "------------------------4f1d0c6e8b9a2d37") -> tuple:
    """A multipart/form-data body as PHP's curl writes one from an array: (body, headers)."""
    parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
             for name, value in fields.items()]
    body = ("".join(parts) + f"--{boundary}--\r\n").encode()
    return body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}


# -- the clients, request by request ----------------------------------------------------------


def urllib_json(port: int, path: str, data: bytes, method: Optional[str] = None):
    """What libretranslatepy does: urllib's Request with ``data`` (a form), urlopen, json.loads."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}/{path}", data=data, method=method)
    with urllib.request.urlopen(req, timeout=60) as response:
        return json.loads(response.read().decode())


def test_libretranslatepy(port, keyed, model):
    """libretranslatepy 2.1.4: translate, detect and languages as urlencoded forms (languages a
    GET with an empty form body, or one holding the key)."""
    assert urllib_json(port, "translate", urlencode({"q": ENGLISH, "source": "en", "target": "de"}).encode()
                       )["translatedText"] == t(model, ENGLISH)[0]
    detected = urllib_json(port, "detect", urlencode({"q": GERMAN}).encode())
    assert detected[0]["language"] == "de" and 0 < detected[0]["confidence"] <= 100
    assert [lang["code"] for lang in urllib_json(port, "languages", urlencode({}).encode(), "GET")] == ["en", "de"]
    assert [lang["code"] for lang in urllib_json(keyed, "languages", urlencode({"api_key": KEY}).encode(),
                                                 "GET")] == ["en", "de"]
    form = urlencode({"q": ENGLISH, "source": "en", "target": "de", "api_key": KEY}).encode()
    assert urllib_json(keyed, "translate", form)["translatedText"] == t(model, ENGLISH)[0]


def test_libretranslate_aio(port, model):
    """libretranslate-aio 0.1.3 (httpx ``data=``: a list ``q`` as repeated fields, ``alternatives``
    only when asked, its command line's ``source`` auto; no ``api_key`` when it has none); its
    parsers read every field they need."""
    texts = [ENGLISH, "The king writes the newspaper."]
    body = urlencode({"q": texts, "source": "auto", "target": "de", "format": "text", "alternatives": 2},
                     doseq=True).encode()
    reply = request(port, "POST", "/translate", body, FORM)
    assert reply.status == 200 and reply.body["translatedText"] == t(model, *texts)
    assert [float(d["confidence"]) > 0 and d["language"] for d in reply.body["detectedLanguage"]] == ["en", "en"]
    assert reply.body["alternatives"] == [tr.alternatives for tr in model.translate_full(texts, [2, 2])]
    assert all(len(a) <= 2 for a in reply.body["alternatives"])
    reply = request(port, "POST", "/detect", urlencode({"q": ENGLISH}).encode(), FORM)
    assert [(float(d["confidence"]) > 0, str(d["language"])) for d in reply.body] == [(True, "en")]
    settings = request(port, "GET", "/frontend/settings").body
    assert (int(settings["charLimit"]), bool(settings["apiKeys"]), bool(settings["keyRequired"]),
            bool(settings["suggestions"]), list(settings["supportedFilesFormat"])) == (10_000, False, False, False, [])
    assert settings["language"] == {"source": {"code": "en", "name": "English"},
                                    "target": {"code": "de", "name": "German"}}
    assert int(settings["frontendTimeout"]) > 0
    assert str(request(port, "GET", "/health").body["status"]).lower() == "ok"


def test_weblate_batch_of_20(port, raw_test_set, model):
    """Weblate: GET /languages (codes), then a JSON batch of 20 with its key (empty when unset)."""
    assert {x["code"] for x in request(port, "GET", "/languages").body} == {"en", "de"}
    texts = raw_test_set[:20]
    payload = {"api_key": "", "q": texts, "source": "en", "target": "de"}
    reply = request(port, "POST", "/translate", json.dumps(payload).encode(), JSON)
    assert (reply.status, reply.body) == (200, {"translatedText": t(model, *texts)})


MASTODON_STATUS = ('<p>{0}</p><p><span class="h-card" translate="no"><a href="https://social.example/@alice" '
                   'class="u-url mention">@<span>alice</span></a></span> {1}</p>')


def test_mastodon(port, keyed, model):
    """Mastodon: GET /languages with a JSON type and no body (each code's targets without
    itself); a status (its HTML, mentions marked translate="no") with ``source`` auto and a
    null key, read back by index with its detected language."""
    reply = request(port, "GET", "/languages", headers=JSON)
    languages = {lang["code"]: [c for c in lang["targets"] if c != lang["code"]] for lang in reply.body}
    assert languages == {"en": ["de"], "de": []}
    statuses = [MASTODON_STATUS.format(ENGLISH, "The king writes the newspaper."), "<p>Hello.</p>"]
    body = json.dumps({"q": statuses, "source": "auto", "target": "de", "format": "html", "api_key": None})
    reply = request(port, "POST", "/translate", body.encode(), JSON)
    first, second = t(model, ENGLISH, "The king writes the newspaper.")
    assert reply.status == 200
    assert reply.body["translatedText"] == [MASTODON_STATUS.format(first, second), f"<p>{t(model, 'Hello.')[0]}</p>"]
    assert [d["language"] for d in reply.body["detectedLanguage"]] == ["en", "en"]
    # A post whose language is known, to a server with a key.
    body = json.dumps({"q": ["<p>Hello.</p>"], "source": "en", "target": "de", "format": "html", "api_key": KEY})
    assert request(keyed, "POST", "/translate", body.encode(), JSON).body == {
        "translatedText": [f"<p>{t(model, 'Hello.')[0]}</p>"]}


DISCOURSE_POST = ('<p>Run <code>make test</code> before you push.</p>\n'
                  '<pre><code class="lang-bash">make test\n</code></pre>\n'
                  '<aside class="quote" translate="no">Keep this.</aside>\n<p>Thanks &amp; bye!</p>')


def encode_www_form(fields: Dict[str, str]) -> bytes:
    """Ruby's URI.encode_www_form: '+' for spaces, in the order given."""
    return "&".join(f"{quote_plus(k)}={quote_plus(v)}" for k, v in fields.items()).encode()


def test_discourse(port, model):
    """Discourse's translator: POST /detect (the post's text, tags stripped) and /translate (its
    cooked HTML, format html, the detected source), both urlencoded with ``api_key`` last;
    GET /languages to see that both codes are there."""
    reply = request(port, "POST", "/detect", encode_www_form({"q": "Run make test before you push.",
                                                              "api_key": ""}), FORM)
    detected = reply.body[0]["language"]
    assert (reply.status, detected) == (200, "en")
    codes = [lang["code"] for lang in request(port, "GET", "/languages").body]
    assert detected in codes and "de" in codes
    body = encode_www_form({"q": DISCOURSE_POST, "source": detected, "target": "de", "format": "html", "api_key": ""})
    reply = request(port, "POST", "/translate", body, FORM)
    run, push, thanks = t(model, "Run", "before you push.", "Thanks & bye!")
    assert reply.body["translatedText"] == (
        f'<p>{run} <code>make test</code> {push}</p>\n<pre><code class="lang-bash">make test\n</code></pre>\n'
        f'<aside class="quote" translate="no">Keep this.</aside>\n<p>{thanks.replace("&", "&amp;")}</p>')


def test_nextcloud(port, model):
    """Nextcloud's integration_libretranslate through jefs42/libretranslate (PHP curl): POST /
    to see the server is there, GET /frontend/settings and /languages with an empty multipart
    body, /detect with ``q`` and an empty key in the query string, /translate as a multipart
    form with format html."""
    empty, multipart_type = multipart({})
    # Any answer will do (JSON, as curl needs): / is the page, GET only, as LibreTranslate's.
    assert request(port, "POST", "/", b"", {"Content-Length": "0"}).status == 405
    assert request(port, "GET", "/frontend/settings", empty, multipart_type).body["charLimit"] == 10_000
    assert [lang["code"] for lang in request(port, "GET", "/languages", empty, multipart_type).body] == ["en", "de"]
    reply = request(port, "POST", "/detect?" + urlencode({"q": GERMAN, "api_key": ""}), empty, multipart_type)
    assert (reply.status, reply.body[0]["language"]) == (200, "de")
    text = "The king writes the newspaper.\nA man is riding a bike."
    body, headers = multipart({"q": text, "format": "html", "source": "en", "target": "de", "api_key": ""})
    reply = request(port, "POST", "/translate", body, headers)
    # In HTML a newline is a space: the text is one node, one sentence for the model.
    assert (reply.status, reply.body) == (200, {"translatedText": t(model, " ".join(text.split()))[0]})


# -- endpoint by endpoint ------------------------------------------------------------------------


def test_languages_list_both_and_ignore_any_body(port):
    both = [{"code": "en", "name": "English", "targets": ["de"]}, {"code": "de", "name": "German", "targets": []}]
    for body, headers in ((None, {}), (b"", FORM), (b"{}", JSON), (b"not even JSON", JSON)):
        reply = request(port, "GET", "/languages", body, headers)
        assert (reply.status, reply.body) == (200, both)


def test_detect_reads_q_from_json_a_form_multipart_or_the_query_string(port, keyed):
    answers = [
        request(port, "POST", "/detect", json.dumps({"q": GERMAN}).encode(), JSON),
        request(port, "POST", "/detect", urlencode({"q": GERMAN}).encode(), FORM),
        request(port, "POST", "/detect", *multipart({"q": GERMAN})),
        request(port, "POST", "/detect?" + urlencode({"q": GERMAN})),
    ]
    assert all(a.status == 200 and a.body == answers[0].body for a in answers)
    assert answers[0].body[0]["language"] == "de" and answers[0].body[0]["confidence"] > 50
    assert request(port, "POST", "/detect", json.dumps({"q": ENGLISH}).encode(), JSON).body[0]["language"] == "en"
    # Neither language: the source, with confidence 0.
    assert request(port, "POST", "/detect?q=12345").body == [{"confidence": 0.0, "language": "en"}]
    assert request(port, "POST", "/detect", b"{}", JSON).body == {"error": "q is required"}
    assert request(keyed, "POST", "/detect?q=Hello").status == 403
    assert request(keyed, "POST", "/detect?" + urlencode({"q": "Hello", "api_key": KEY})).status == 200


def test_auto_detects_and_says_so(port, model):
    reply = request(port, "POST", "/translate", json.dumps({"q": ENGLISH, "source": "auto", "target": "de"}).encode(),
                    JSON)
    assert reply.body["translatedText"] == t(model, ENGLISH)[0]
    assert reply.body["detectedLanguage"]["language"] == "en" and reply.body["detectedLanguage"]["confidence"] > 50
    # Already the target's language: given back as it is, as LibreTranslate does.
    reply = request(port, "POST", "/translate", json.dumps({"q": [GERMAN], "source": "auto", "target": "de"}).encode(),
                    JSON)
    assert reply.body["translatedText"] == [GERMAN] and reply.body["detectedLanguage"][0]["language"] == "de"
    # Not asked: no detectedLanguage.
    reply = request(port, "POST", "/translate", json.dumps({"q": ENGLISH, "source": "en", "target": "de"}).encode(),
                    JSON)
    assert "detectedLanguage" not in reply.body


def test_html_translates_text_nodes_and_keeps_the_markup(port, model):
    html = ('<!DOCTYPE html><div title="Not translated"><!-- a comment --><p>Hello <b>world</b>!</p>'
            '<script>var s = "Hello";</script><style>p {color: red}</style><code>Hello</code>'
            '<p translate="no">Hello <span translate="yes">Bye.</span></p><br><p>  \n  </p>a &lt; b</div>')
    reply = request(port, "POST", "/translate", json.dumps(
        {"q": html, "source": "en", "target": "de", "format": "html", "alternatives": 2}).encode(), JSON)
    hello, world, bang, bye, less = t(model, "Hello", "world", "!", "Bye.", "a < b")
    assert reply.status == 200
    assert reply.body == {"translatedText": (  # BeautifulSoup's: a newline after the doctype, blanks as one
        f'<!DOCTYPE html>\n<div title="Not translated"><!-- a comment --><p>{hello} <b>{world}</b>{bang}</p>'
        '<script>var s = "Hello";</script><style>p {color: red}</style><code>Hello</code>'
        f'<p translate="no">Hello <span translate="yes">{bye}</span></p><br><p>\n</p>'
        f'{less.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")}</div>'),
        "alternatives": []}


def test_alternatives_are_the_beams_other_translations(port, model):
    texts = [ENGLISH, f"{ENGLISH}\nThe king writes the newspaper."]
    reply = request(port, "POST", "/translate", json.dumps(
        {"q": texts[0], "source": "en", "target": "de", "alternatives": 3}).encode(), JSON)
    expected = model.translate_full([ENGLISH], [3])[0]
    assert reply.body == {"translatedText": expected.text, "alternatives": expected.alternatives}
    assert expected.alternatives and expected.text not in expected.alternatives
    reply = request(port, "POST", "/translate", urlencode(
        {"q": texts[1], "source": "en", "target": "de", "alternatives": "1"}).encode(), FORM)
    first, second = model.translate_full(texts[1].split("\n"), [1, 1])
    other = "\n".join([first.alternatives[0] if first.alternatives else first.text,
                       second.alternatives[0] if second.alternatives else second.text])
    assert reply.body["alternatives"] == ([other] if other != reply.body["translatedText"] else [])
    reply = request(port, "POST", "/translate", json.dumps(
        {"q": [ENGLISH], "source": "en", "target": "de", "alternatives": 0}).encode(), JSON)
    assert reply.body == {"translatedText": t(model, ENGLISH)}  # none asked: no field


def test_an_empty_or_null_key_is_no_key(port, keyed, model):
    for key in ("", None):
        payload = {"q": ENGLISH, "source": "en", "target": "de", "api_key": key}
        assert request(port, "POST", "/translate", json.dumps(payload).encode(), JSON).body == {
            "translatedText": t(model, ENGLISH)[0]}
        reply = request(keyed, "POST", "/translate", json.dumps(payload).encode(), JSON)
        assert (reply.status, reply.body) == (403, {"error": "invalid or missing API key (api_key)"})
    settings = request(keyed, "GET", "/frontend/settings").body
    assert (settings["apiKeys"], settings["keyRequired"]) == (True, True)


def test_bodies_that_are_not_what_they_say(port):
    reply = request(port, "POST", "/translate", b"--x\r\nbroken", {"Content-Type": "multipart/form-data"})
    assert reply.status == 400 and reply.body["error"].startswith("the body is not a valid multipart form")
    file_part = (b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.txt"\r\n\r\nHello\r\n--x--\r\n')
    reply = request(port, "POST", "/translate", file_part, {"Content-Type": "multipart/form-data; boundary=x"})
    assert reply.status == 400 and reply.body["error"].startswith("the body is not a valid multipart form")
    reply = request(port, "POST", "/translate?q=Hello&source=en&target=de")  # the query string alone will do
    assert reply.status == 200
