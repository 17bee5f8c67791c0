"""The runtime installed alone: its wheel into a fresh virtual environment without torch or
fairseq, offline (``--no-index``) from the wheels of its dependencies that ``make setup``
keeps in ``.venv/runtime-wheels``. There, the Python API, ``fairseq-rope-translate`` and
``fairseq-rope-serve`` translate the raw test set as fairseq does, and neither torch nor
fairseq (nor fairseq_rope) is ever imported."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.serve.conftest import ServerProcess, get_page, post, request

#: Where `make setup` keeps the wheels of the runtime's dependencies (Makefile: RUNTIME_WHEELS).
WHEELS = Path(sys.prefix) / "runtime-wheels"
TRAINING_SIDE = ("torch", "fairseq", "fairseq_cli", "fairseq_rope")


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, f"{command[:4]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


def alone_env() -> dict:
    """The environment without PYTHONPATH (which points into the checkout)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> Path:
    """bin/ of a fresh virtual environment holding the runtime and its dependencies only."""
    assert WHEELS.is_dir(), f"{WHEELS}: no wheels of the runtime's dependencies; `make setup` keeps them there"
    tmp = tmp_path_factory.mktemp("alone")
    # Built from a copy, so that the checkout gets no build/ or egg-info.
    shutil.copytree(REPO / "runtime", tmp / "source",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build"))
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", tmp / "dist",
        tmp / "source", cwd=tmp)
    (wheel,) = (tmp / "dist").glob("fairseq_rope_serve-*.whl")
    run(sys.executable, "-m", "venv", "--without-pip", tmp / "venv", cwd=tmp)
    run(sys.executable, "-m", "pip", "--python", tmp / "venv" / "bin" / "python", "install", "--no-index",
        "--find-links", WHEELS, wheel, cwd=tmp, env=alone_env())
    return tmp / "venv" / "bin"


def test_the_api_translates_without_torch_or_fairseq(alone, exported, raw_test_set, fairseq_translations, tmp_path):
    script = (
        "import importlib.util, json, sys\n"
        "from fairseq_rope_serve.translator import TextTranslator\n"
        f"lines = open({str(tmp_path / 'in.en')!r}, encoding='utf-8').read().splitlines()\n"
        f"translations = TextTranslator({str(exported('rope'))!r}, threads=1).translate(lines)\n"
        f"sides = {TRAINING_SIDE!r}\n"
        "print(json.dumps({'translations': translations,\n"
        "                  'imported': sorted(m for m in sys.modules if m.split('.')[0] in sides),\n"
        "                  'installed': [m for m in sides if importlib.util.find_spec(m)]}))\n"
    )
    (tmp_path / "in.en").write_text("\n".join(raw_test_set) + "\n", encoding="utf-8")
    result = json.loads(run(alone / "python", "-c", script, cwd=tmp_path, env=alone_env()).stdout)
    assert result == {"translations": fairseq_translations("rope"), "imported": [], "installed": []}


def test_translate_and_serve_commands(alone, exported, raw_test_set, fairseq_translations, tmp_path):
    assert sorted(p.name for p in alone.glob("fairseq-rope-*")) == ["fairseq-rope-serve", "fairseq-rope-translate"]
    translated = run(alone / "fairseq-rope-translate", exported("rope"), "--threads", "1",
                     input="\n".join(raw_test_set) + "\n", cwd=tmp_path, env=alone_env())
    assert translated.stdout.splitlines() == fairseq_translations("rope")
    server = ServerProcess(exported("rope"), command=[str(alone / "fairseq-rope-serve")], env=alone_env())
    try:
        reply = post(server.port, {"q": raw_test_set[:5], "source": "en", "target": "de"})
        assert (reply.status, reply.body) == (200, {"translatedText": fairseq_translations("rope")[:5]})
        # LibreTranslate's other paths, on the dependencies installed with it alone: CLD2,
        # BeautifulSoup and python-multipart.
        reply = post(server.port, {"q": f"<p>{raw_test_set[0]}</p>", "source": "auto", "target": "de",
                                   "format": "html"})
        assert reply.body == {"translatedText": f"<p>{fairseq_translations('rope')[0]}</p>",
                              "detectedLanguage": {"confidence": reply.body["detectedLanguage"]["confidence"],
                                                   "language": "en"}}
        body = (b'--b\r\nContent-Disposition: form-data; name="q"\r\n\r\nEin Mann f\xc3\xa4hrt Fahrrad.\r\n--b--\r\n')
        reply = request(server.port, "POST", "/detect", body, {"Content-Type": "multipart/form-data; boundary=b"})
        assert (reply.status, reply.body[0]["language"]) == (200, "de")
        status, _, page = get_page(server.port)  # the page travels in the runtime's wheel
        assert status == 200 and 'id="translation"' in page
    finally:
        assert server.stop()[0] == 0


def test_no_module_of_the_runtime_imports_the_training_side():
    """Statically, at any depth of the code (a lazy import in a path the tests above do not
    take included): the runtime imports nothing of torch, fairseq or fairseq_rope."""
    found = {}
    for path in (REPO / "runtime" / "fairseq_rope_serve").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            found.update({name: path.name for name in names if name.split(".")[0] in TRAINING_SIDE})
    assert len(list((REPO / "runtime" / "fairseq_rope_serve").rglob("*.py"))) >= 12
    assert found == {}
