"""The package's layers depend downward only: the plugin core imports none of the
harness, and each harness layer only the ones below it (docs/design.md)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Set

from tests.conftest import PLUGIN_DIR

# Layer of each top-level part of the package, lowest first; a module may import
# its own layer and those below.
# deploy (CTranslate2) shares evaluation's layer: each uses the other (--engine ctranslate2;
# the tables' decoding and scoring).
LAYERS = {"base": 0, "core": 1, "data": 2, "evaluation": 3, "deploy": 3, "experiments": 4, "benchmark": 4, "gpu": 4}
HARNESS = ("data", "evaluation", "deploy", "experiments", "benchmark", "gpu")


def part(module: str) -> str:
    """``fairseq_rope.data.prepare.cli`` → ``data``; core modules (rotary, models…) → ``core``."""
    name = module.split(".")[1] if "." in module else ""
    if name == "base":
        return "base"
    return name if name in HARNESS else "core"


def imports_of(path: Path) -> Set[str]:
    """The fairseq_rope modules ``path`` imports, at any depth of its code."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m.split(".")[0] == "fairseq_rope" and m != "fairseq_rope"}


def package_modules() -> Dict[str, Path]:
    modules = {}
    for path in PLUGIN_DIR.rglob("*.py"):
        parts = path.relative_to(PLUGIN_DIR.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def test_the_core_imports_nothing_from_the_harness():
    modules = package_modules()
    core = {name: path for name, path in modules.items() if part(name) in ("core", "base")}
    assert {"fairseq_rope.rotary", "fairseq_rope.attention", "fairseq_rope.models.transformer_rope",
            "fairseq_rope.checkpoints", "fairseq_rope.patches"} <= set(core)
    for name, path in core.items():
        harness = sorted(m for m in imports_of(path) if part(m) in HARNESS)
        assert not harness, f"{name} imports {harness}"


def test_layers_depend_downward_only():
    for name, path in package_modules().items():
        upward = sorted(m for m in imports_of(path) if LAYERS[part(m)] > LAYERS[part(name)])
        assert not upward, f"{name} imports {upward}, above its layer"


def test_the_walk_sees_an_upward_import(tmp_path):
    bad = tmp_path / "rotary.py"
    bad.write_text("from fairseq_rope.experiments.table import ROWS\nimport fairseq_rope.data.prepare\n")
    assert {part(m) for m in imports_of(bad)} == {"experiments", "data"}
