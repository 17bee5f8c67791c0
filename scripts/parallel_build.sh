# Sourced: `with_parallel_build COMMAND…` runs COMMAND (a pip install that compiles
# fairseq-fixed) with fairseq's six C/C++ extensions built side by side, one per core, not one
# after another: setuptools' build_ext --parallel, which pip reaches only through
# DIST_EXTRA_CONFIG, with torch's distutils backend. Torch's ninja backend writes every
# extension's build.ninja to one folder, so extensions built at once overwrite each other's
# (seen on an H200 node); torch falls back to distutils where `ninja --version` fails
# (cpp_extension.is_ninja_available), as the stand-in put first on PATH makes it.
# Used by `make setup` and scripts/install_wheelhouse.sh (docs/install.md).
with_parallel_build() {
    local tools rc=0
    tools=$(mktemp -d)
    mkdir -p "$tools/bin"
    printf '#!/bin/sh\nexit 1\n' > "$tools/bin/ninja"
    chmod +x "$tools/bin/ninja"
    printf '[build_ext]\nparallel = %s\n' "$(nproc)" > "$tools/build_ext.cfg"
    PATH="$tools/bin:$PATH" DIST_EXTRA_CONFIG=$tools/build_ext.cfg "$@" || rc=$?
    rm -rf "$tools"
    return "$rc"
}
