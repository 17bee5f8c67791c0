# Sourced by every entry point in scripts/: the one Python environment they use.
# $PYTHON if set, else the repository's .venv (made by `make setup`), else
# `python` on PATH. fairseq's console scripts (fairseq-train, fairseq-generate…)
# are taken from beside that interpreter, and the repository is importable even
# when the package is not installed.
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ -z ${PYTHON:-} ]]; then
    if [[ -x $repo/.venv/bin/python ]]; then PYTHON=$repo/.venv/bin/python; else PYTHON=python; fi
fi
python_bin=$(dirname "$(command -v "$PYTHON")")
export PYTHON PATH="$python_bin:$PATH" PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
