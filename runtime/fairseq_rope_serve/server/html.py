"""``format: "html"``: the text of an HTML document or fragment translated, its markup kept.

As LibreTranslate does (its translatehtml, with BeautifulSoup's ``html.parser``): each text
node is translated, but not those inside ``address``, ``applet``, ``audio``, ``canvas``,
``code``, ``embed``, ``script``, ``style``, ``time`` or ``video``, nor under an element whose
nearest ``translate`` attribute says ``no`` (Mastodon marks mentions and hashtags so).
Comments, doctypes and CDATA stay as they are, and so do attributes (``alt``, ``title``).

Each node is one sentence for the model: its whitespace collapsed (in HTML a newline is a
space), the translation put back between the node's own leading and trailing whitespace, so
that inline markup keeps its spacing. The document comes back as BeautifulSoup writes it:
attributes in their order and in double quotes, ``&``, ``<`` and ``>`` escaped in text, a
newline after a doctype, and whitespace alone between tags as one newline or space (outside
``pre`` and ``textarea``: BeautifulSoup's parsing does that, and a browser shows no difference).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence

from bs4 import BeautifulSoup, NavigableString
from bs4.dammit import EntitySubstitution
from bs4.element import PreformattedString
from bs4.formatter import HTMLFormatter

#: Elements whose text is never translated (LibreTranslate's list).
UNTRANSLATED = frozenset({"address", "applet", "audio", "canvas", "code", "embed", "script", "style", "time",
                          "video"})


class _AsWritten(HTMLFormatter):
    """BeautifulSoup's minimal formatter, but attributes in the document's order (not sorted) and
    void elements as HTML writes them (``<br>``)."""

    def __init__(self) -> None:
        super().__init__(entity_substitution=EntitySubstitution.substitute_xml, void_element_close_prefix="")

    def attributes(self, tag):  # type: ignore[override]
        return list(tag.attrs.items()) if tag.attrs else []


_FORMATTER = _AsWritten()


@dataclass
class HtmlText:
    """A parsed document, the text nodes to translate and their text, one line each."""

    soup: BeautifulSoup
    nodes: List[NavigableString]
    lines: List[str]


def split_html(html: str) -> HtmlText:
    """The text of ``html`` to translate, one line per text node."""
    soup = BeautifulSoup(html, "html.parser")
    nodes = [node for node in soup.find_all(string=True) if _translated(node)]
    return HtmlText(soup, nodes, [" ".join(node.split()) for node in nodes])


def join_html(document: HtmlText, translations: Sequence[str]) -> str:
    """``document`` with each text node replaced by its translation."""
    for node, translation in zip(document.nodes, translations):
        text = str(node)
        lead, trail = text[:len(text) - len(text.lstrip())], text[len(text.rstrip()):]
        node.replace_with(NavigableString(lead + translation + trail))
    return document.soup.decode(formatter=_FORMATTER)


def _translated(node: NavigableString) -> bool:
    if isinstance(node, PreformattedString) or not node.strip():  # comments, doctypes; blank text
        return False
    decided = False  # the nearest translate attribute decides
    for element in node.parents:
        if element.name in UNTRANSLATED:
            return False
        value = element.get("translate") if not decided and hasattr(element, "get") else None
        if isinstance(value, str):
            if value.strip().lower() == "no":
                return False
            decided = True
    return True
