"""``make wheelhouse``: what fairseq-rope needs on an offline GPU node, beside the node's torch.

GPU nodes are often offline, and their torch is the one built for their CUDA:
nothing here may replace it. The node provides its PyTorch stack — torch,
numpy, and scikit-learn with scipy (fairseq imports scikit-learn when it loads
its tasks; those two alone would overflow the 60 MiB this folder may take). The
wheelhouse holds the rest of the dependency closure of ``fairseq-rope[test]``
as installed in this environment (the versions the test suite passed with):

* ``fairseq-rope`` itself and its runtime ``fairseq-rope-serve`` (``runtime/``), as wheels;
* ``fairseq-fixed`` and ``antlr4-python3-runtime`` as sources: fairseq's C++
  extensions are compiled on the node, against the node's torch;
* every other package as a binary wheel for the node's Python and platform
  (default CPython 3.12, manylinux x86-64), whatever this machine runs.

fairseq-fixed also declares ``torchaudio``, which nothing fairseq-rope runs
imports: ``scripts/install_wheelhouse.sh`` installs fairseq-fixed without its
declared dependencies. ``requirements.txt`` lists the rest by name, so that
what the node already has is kept.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

from packaging.requirements import Requirement

from fairseq_rope.base import PLUGIN_DIR

REPO_ROOT = PLUGIN_DIR.parent

#: The node's PyTorch stack, and fairseq's unused torchaudio: neither they nor what only
#: they need go into the wheelhouse (scripts/install_wheelhouse.sh checks the node has them).
#: Nor CTranslate2 (the [test] extra's, for tests/deploy): the GPU suite does not use it, and
#: its wheel (about 40 MB, CUDA kernels included) would overflow LIMIT_MIB.
#: Nor what only the server needs (fairseq_rope_serve.server, which nothing of fairseq-rope
#: imports, and the GPU suite serves nothing): uvicorn's C parser and event loop (httptools,
#: uvloop) and CLD2 (pycld2, for /detect); with them the wheelhouse was 65 MiB.
#: scipy (the seed-level t-tests of collect) comes with the node's scikit-learn, which needs it.
NOT_SHIPPED = frozenset({"torch", "torchaudio", "numpy", "scikit-learn", "scipy", "ctranslate2", "httptools",
                         "uvloop", "pycld2"})
#: Shipped as sources, built on the node.
SOURCES = frozenset({"fairseq-fixed", "antlr4-python3-runtime"})
PROJECT = "fairseq-rope"
#: fairseq-rope's runtime, built from the checkout like the project (it is on no index).
RUNTIME = "fairseq-rope-serve"
LIMIT_MIB = 60
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(root: str = PROJECT, extras: Iterable[str] = ("test",)) -> Dict[str, str]:
    """Name -> installed version of ``root`` and everything it needs (with ``extras``),
    not descending into :data:`NOT_SHIPPED`."""
    found: Dict[str, str] = {}
    pending = [(root, tuple(extras))]
    while pending:
        name, wanted = pending.pop()
        key = canonical(name)
        if key in found or key in NOT_SHIPPED:
            continue
        dist = metadata.distribution(name)
        found[key] = dist.version
        for line in dist.requires or ():
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *wanted)):
                pending.append((requirement.name, tuple(requirement.extras)))
    return found


def pip(*args: str) -> None:
    command = [sys.executable, "-m", "pip", *args]
    print("+", " ".join(command), file=sys.stderr, flush=True)
    subprocess.run(command, check=True)


def make(out: Path, python_version: str = "3.12", platforms: Sequence[str] = PLATFORMS) -> List[Path]:
    """Fill ``out`` (emptied of wheels and sources first); returns its files."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("*.whl"), *out.glob("*.tar.gz"), *out.glob("*.zip")]:
        old.unlink()
    versions = closure()
    binaries = sorted(n for n in versions if n not in SOURCES and n not in (PROJECT, RUNTIME))
    pip("wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", str(out), str(REPO_ROOT),
        str(REPO_ROOT / "runtime"))
    pip("download", "--no-deps", "--no-build-isolation", "--no-binary", ":all:", "--dest", str(out),
        *(f"{n}=={versions[n]}" for n in sorted(SOURCES)))
    pip("download", "--no-deps", "--only-binary", ":all:", "--python-version", python_version,
        "--implementation", "cp", *(f"--platform={p}" for p in platforms), "--dest", str(out),
        *(f"{n}=={versions[n]}" for n in binaries))
    # By name: what the node has already is kept (its numpy, its sacrebleu, ...).
    (out / "requirements.txt").write_text(
        "# Installed by scripts/install_wheelhouse.sh before fairseq-fixed and fairseq-rope (--no-deps).\n"
        + "".join(f"{n}\n" for n in binaries), encoding="utf-8")
    return sorted(p for p in out.iterdir() if p.is_file())


def size_mib(files: Iterable[Path]) -> float:
    return sum(p.stat().st_size for p in files) / 2**20


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="make wheelhouse", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, nargs="?", default=REPO_ROOT / "wheelhouse")
    parser.add_argument("--python-version", default="3.12",
                        help="the node's Python (default: %(default)s, which pip reads as 3.12.0: give the "
                             "patch release too, e.g. 3.12.7, when a wheel needs a later one)")
    args = parser.parse_args(argv)
    files = make(args.out, args.python_version)
    total = size_mib(files)
    print(f"{args.out}: {len(files)} files, {total:.1f} MiB (limit {LIMIT_MIB})")
    return 0 if total <= LIMIT_MIB else 1


if __name__ == "__main__":
    sys.exit(main())
