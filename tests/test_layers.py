"""The package's layers depend downward only: the plugin core imports none of the
harness, each harness layer only the ones below it (docs/design.md), and no module
reaches itself through its imports, within a layer or across."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence, Set

import pytest

from tests.conftest import PLUGIN_DIR

# Layer of each top-level part of the package, lowest first; a module may import
# its own layer and those below. deploy (CTranslate2) lies below evaluation, which
# decodes with it (--engine ctranslate2).
LAYERS = {"base": 0, "core": 1, "data": 2, "deploy": 3, "evaluation": 4, "experiments": 5, "benchmark": 5, "gpu": 5}
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


def import_graph(modules: Mapping[str, Path]) -> Dict[str, Set[str]]:
    """Each module → the package's modules it imports (a ``from M import name`` counts as
    importing M, or M.name where that is a module), lazy imports in functions included; a
    package's ``__init__`` importing its own submodules through its name is no edge to itself."""
    return {name: {m for m in imports_of(path) if m in modules and m != name} for name, path in modules.items()}


def a_cycle(graph: Mapping[str, Set[str]]) -> Optional[Sequence[str]]:
    """One import cycle of ``graph`` (its modules in order, the first repeated last), or None."""
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as e:
        return e.args[1]
    return None


def test_no_module_imports_itself_through_others():
    cycle = a_cycle(import_graph(package_modules()))
    assert cycle is None, f"import cycle: {' -> '.join(reversed(cycle))}"


def test_deploy_lies_below_evaluation():
    assert LAYERS["deploy"] < LAYERS["evaluation"]
    evaluate = package_modules()["fairseq_rope.evaluation.evaluate"]
    assert {"fairseq_rope.deploy.export", "fairseq_rope.deploy.generate"} <= imports_of(evaluate)


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, {"a", "b", "c"}),
    ({"a": {"a"}}, {"a"}),
    ({"a": {"b"}, "b": set(), "c": {"a", "b"}}, None),
])
def test_the_cycle_check_sees_a_cycle(graph, expected):
    cycle = a_cycle(graph)
    assert (None if cycle is None else set(cycle)) == expected


def test_the_graph_sees_a_lazy_import(tmp_path):
    lazy = tmp_path / "convergence.py"
    lazy.write_text("def rule():\n    from fairseq_rope.experiments.training import parse_command\n")
    modules = {"fairseq_rope.experiments.convergence": lazy,
               "fairseq_rope.experiments.training": tmp_path / "training.py"}
    (tmp_path / "training.py").write_text("from fairseq_rope.experiments.convergence import Rule\n")
    assert a_cycle(import_graph(modules)) is not None
