#!/usr/bin/env bash
# Install fairseq-rope offline from the wheelhouse (`make wheelhouse`) into a prefix,
# beside the node's own torch, numpy and scikit-learn, which it never replaces.
#
#   scripts/install_wheelhouse.sh [--wheelhouse DIR] [--prefix DIR]
#
# PYTHON (default python3) is the node's Python, the one that has its CUDA torch.
# Packages the node already has are kept; the rest come from the wheelhouse;
# fairseq-fixed is compiled there against the node's torch. The last line printed
# is the `export` that puts the prefix on PYTHONPATH and PATH; eval it:
#
#   eval "$(scripts/install_wheelhouse.sh | tail -n 1)"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
WHEELHOUSE=wheelhouse
PREFIX=/tmp/fairseq-rope-prefix
PY=${PYTHON:-python3}
while [[ $# -gt 0 ]]; do
    case $1 in
        --wheelhouse) WHEELHOUSE=$2; shift 2 ;;
        --prefix) PREFIX=$2; shift 2 ;;
        -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (--help for usage)" >&2; exit 2 ;;
    esac
done
if [[ ! -f $WHEELHOUSE/requirements.txt ]]; then
    echo "error: $WHEELHOUSE/requirements.txt not found: make the wheelhouse first (make wheelhouse," \
         "on a machine with the package registry) and bring it along" >&2
    exit 1
fi
if ! "$PY" -c "import torch, numpy, sklearn" 2>/dev/null; then
    echo "error: $PY must provide torch (the node's CUDA build), numpy and scikit-learn; the wheelhouse" \
         "does not ship them (see fairseq_rope/gpu/wheelhouse.py)" >&2
    exit 1
fi
PREFIX=$(mkdir -p "$PREFIX" && cd "$PREFIX" && pwd)
WHEELHOUSE=$(cd "$WHEELHOUSE" && pwd)
# Where pip --prefix puts packages for this Python (its preferred prefix scheme).
read -r PURELIB PLATLIB < <("$PY" - "$PREFIX" <<'EOF'
import sys, sysconfig
prefix = sys.argv[1]
paths = sysconfig.get_paths(sysconfig.get_preferred_scheme("prefix"), vars={"base": prefix, "platbase": prefix})
print(paths["purelib"], paths["platlib"])
EOF
)
export PYTHONPATH="$PURELIB:$PLATLIB${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$PREFIX/bin:$PATH"
pip_install() {
    "$PY" -m pip install --quiet --no-index --find-links "$WHEELHOUSE" --prefix "$PREFIX" \
        --no-build-isolation --no-warn-script-location --disable-pip-version-check "$@"
}
pip_install -r "$WHEELHOUSE/requirements.txt"  # by name: what the node has is kept as it is
# --ignore-installed: pip would otherwise uninstall a fairseq or fairseq-rope the node's
# environment already has before installing into the prefix (seen here).
build_fairseq() {  # its C++ against the node's torch
    # Without CUDA_HOME: fairseq-fixed's setup.py adds its CUDA extensions whenever CUDA_HOME is
    # set, and its sdist lacks their sources (libnat_cuda's binding.cpp), so the build fails on
    # a node that sets it (an H200 node, 2026-11-27); fairseq-rope uses none of them.
    unset CUDA_HOME
    # Its six extensions side by side, one per core (193 s one after another on that node).
    source "$(dirname "${BASH_SOURCE[0]}")/parallel_build.sh"
    with_parallel_build pip_install --no-deps --ignore-installed "$WHEELHOUSE"/fairseq_fixed-*.tar.gz
}
(build_fairseq)
pip_install --no-deps --ignore-installed "$WHEELHOUSE"/fairseq_rope_serve-*.whl  # the runtime, which fairseq-rope imports
pip_install --no-deps --ignore-installed "$WHEELHOUSE"/fairseq_rope-*.whl
(cd /tmp && "$PY" -c "import fairseq_rope, fairseq, torch; print('fairseq-rope installed in $PREFIX: torch',
    torch.__version__, '(CUDA', torch.version.cuda, '), fairseq', fairseq.__version__)") >&2
echo "export PYTHONPATH=\"$PYTHONPATH\" PATH=\"$PATH\""
