"""The page at /: served with the API, self-contained, and in a real browser (Debian's chromium,
headless; ``make test-browser``) it translates what it is given as the API does."""

from __future__ import annotations

import html.parser
import os
import shutil
import subprocess
from pathlib import Path
from typing import Dict, List
from urllib.parse import quote

import pytest

from fairseq_rope_serve.server.app import create_app
from fairseq_rope_serve.translator import TextTranslator
from tests.serve.conftest import LOOPBACK, app_server, get_page, post, request

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def port(exported):
    with app_server(create_app(TextTranslator(exported("rope"), threads=1))) as port:
        yield port


class _Elements(html.parser.HTMLParser):
    """The text of each element with an id, and the URLs of every src or href."""

    def __init__(self) -> None:
        super().__init__()
        self.text: Dict[str, str] = {}
        self.urls: List[str] = []
        self._open: List[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.urls += [attrs[k] for k in ("src", "href") if attrs.get(k)]
        if "id" in attrs:
            self._open.append(attrs["id"])
            self.text.setdefault(attrs["id"], "")
        else:
            self._open.append("")

    def handle_endtag(self, tag):
        if self._open:
            self._open.pop()

    def handle_data(self, data):
        for name in self._open:
            if name:
                self.text[name] += data


def elements(markup: str) -> _Elements:
    parser = _Elements()
    parser.feed(markup)
    return parser


def test_the_page_is_served_and_asks_only_this_server(port):
    status, content_type, page = get_page(port)
    assert status == 200 and content_type.startswith("text/html")
    found = elements(page)
    assert {"source", "translation", "status"} <= set(found.text)
    assert found.urls == []  # no external script, style, font or image: it works offline
    assert "http://" not in page and "https://" not in page
    # Relative URLs: behind a reverse proxy under a sub-path, the page asks its own server.
    assert 'fetch("translate"' in page and 'fetch("frontend/settings")' in page
    assert request(port, "GET", "/frontend/settings").status == 200


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("the browser tests need Debian's chromium: `make test-browser` installs it (apt)")
    return found


def headless(url: str, tmp_path: Path, *action: str) -> subprocess.CompletedProcess:
    """chromium, headless, on ``url``: its virtual time runs until the page's fetches are answered
    and its scripts are idle (10 s of page time at most), then ``action`` (--dump-dom,
    --screenshot=…)."""
    result = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000",
         "--window-size=1000,560", *action, url],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.browser
def test_the_page_translates_in_a_browser_as_the_api_does(port, raw_test_set, tmp_path):
    text = "\n".join(raw_test_set[:3])
    expected = post(port, {"q": text, "source": "en", "target": "de"}).body["translatedText"]
    url = f"http://{LOOPBACK}:{port}/?q={quote(text)}"
    found = elements(headless(url, tmp_path, "--dump-dom").stdout)
    assert found.text["translation"] == expected and expected.count("\n") == 2
    assert found.text["source-name"] == "English" and found.text["target-name"] == "German"
    assert found.text["status"].strip() == ""  # no error shown
    # The screenshot of docs/deploy.md: FAIRSEQ_ROPE_SCREENSHOT_DIR=docs make test-browser.
    shots = Path(os.environ.get("FAIRSEQ_ROPE_SCREENSHOT_DIR", tmp_path))
    headless(url, tmp_path, f"--screenshot={shots / 'serve-page.png'}")
    assert (shots / "serve-page.png").read_bytes().startswith(PNG_SIGNATURE)


@pytest.mark.browser
def test_the_page_shows_the_servers_refusal(port, tmp_path):
    url = f"http://{LOOPBACK}:{port}/?q={quote('x' * 10_001)}"  # over the character limit
    found = elements(headless(url, tmp_path, "--dump-dom").stdout)
    assert "more than this server's limit of 10000" in found.text["status"]
    assert found.text["translation"] == ""
