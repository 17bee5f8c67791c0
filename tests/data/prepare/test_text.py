"""Sentence-level processing, SGM unwrapping and line I/O."""

from __future__ import annotations

import pytest

from fairseq_rope.data.prepare.archives import unwrap_sgm, xml_unescape
from fairseq_rope.base import LineDecodingError
from fairseq_rope.data.prepare.files import PrepareError, copy_user_file, count_lines, read_lines
from fairseq_rope_serve.text import normalize_whitespace, preprocess_line, remove_non_printing

from fairseq_rope.data.prepare.text import keep_pair


def test_remove_non_printing_replaces_every_category_c_char_by_a_space():
    # Cc (tab, BEL, DEL), Cf (zero-width space, soft hyphen), Co (private use), Cn (unassigned)
    assert remove_non_printing("a\tb\x07c\x7fd\u200be\u00adf\ue000g\U000e0fffh") == "a b c d e f g h"
    assert remove_non_printing("Grüße, naïve «x» – ok") == "Grüße, naïve «x» – ok"


def test_preprocess_line_normalizes_and_splits_hyphens_aggressively():
    assert preprocess_line("„Das ist state-of-the-art“, sagt er.", "de") == '" Das ist state @-@ of @-@ the @-@ art " , sagt er .'
    # escape=False: no &amp; / &quot; in the tokenized text
    assert preprocess_line('AT&T said "no" <b>', "en") == 'AT & T said " no " < b >'
    # non-printing characters vanish into whitespace, which tokenization collapses
    assert preprocess_line("zero\u200bwidth\tand  tab", "en") == "zero width and tab"
    assert preprocess_line("", "en") == ""


def test_keep_pair_is_clean_corpus_n_with_ratio_1_5():
    assert keep_pair("a b", "c d e")  # ratio exactly 1.5 is kept
    assert not keep_pair("a b", "c d e f")
    assert not keep_pair("a b c d", "e")
    assert not keep_pair("", "a")
    assert not keep_pair("a", "   ")
    assert keep_pair(" ".join("x" * 250), " ".join("y" * 250))
    assert not keep_pair(" ".join("x" * 251), " ".join("y" * 250))


def test_normalize_whitespace():
    assert normalize_whitespace("  a \t b\u00a0c  ") == "a b c"


def test_xml_unescape_is_strict_about_entities():
    assert xml_unescape("AT&amp;T &lt;b&gt; &quot;x&quot; &apos;y&apos; &#228; &#xE4;") == "AT&T <b> \"x\" 'y' ä ä"
    # raw ampersands and HTML-only names stay as they are (html.unescape would eat "&not")
    assert xml_unescape("R&D &nothing &copy; &") == "R&D &nothing &copy; &"
    assert xml_unescape("&amp;lt;") == "&lt;"  # one pass only


def test_unwrap_sgm():
    text = (
        '<srcset setid="newstest2014" srclang="any">\n<doc sysid="ref" docid="1" genre="news" origlang="en">\n'
        '<p>\n<seg id="1">  Fish &amp; chips  </seg>\n<seg id="2">A &quot;b&quot;\tc</seg>\n</p>\n</doc>\n'
        '<doc sysid="ref" docid="2"><seg id="1">x &lt; y</seg></doc>\n</srcset>\n'
    )
    assert unwrap_sgm(text) == ["Fish & chips", 'A "b" c', "x < y"]


def test_line_io_splits_on_newline_only(tmp_path):
    path = tmp_path / "f.txt"
    path.write_bytes("a\rb\u2028c\nd\r\nlast".encode())
    assert count_lines(path) == 3
    assert list(read_lines(path)) == ["a\rb\u2028c", "d\r", "last"]
    copied = tmp_path / "copy.txt"
    assert copy_user_file(path, copied) == 3
    assert copied.read_bytes() == "a\rb\u2028c\nd\nlast\n".encode()  # CRLF → LF, lone CR kept


def test_copy_user_file_errors(tmp_path):
    bad = tmp_path / "bad.de"
    bad.write_bytes("gut\nsch\xf6n\n".encode("latin-1"))
    with pytest.raises(LineDecodingError, match=r"bad\.de: line 2 is not valid UTF-8"):
        copy_user_file(bad, tmp_path / "out")
    empty = tmp_path / "empty.en"
    empty.write_bytes(b"")
    with pytest.raises(PrepareError, match=r"empty\.en: file is empty"):
        copy_user_file(empty, tmp_path / "out")
    with pytest.raises(PrepareError, match=r"missing\.en: no such file"):
        copy_user_file(tmp_path / "missing.en", tmp_path / "out")
