#!/usr/bin/env bash
# Train an experiment config with fairseq-train.
#
#   scripts/train.sh CONFIG DATA_BIN SAVE_DIR [extra fairseq-train args...]
#
# CONFIG is a config name (configs/<name>.yaml, e.g. rope_base) or a path to a
# YAML file (format: fairseq_rope/experiment.py). Extra arguments come last on
# the command line, so they override the config's values (argparse keeps the
# last occurrence), e.g. `--max-update 10` or `--fp16`; a config's bare flag can
# only be dropped with a config that sets it to false.
#
# Writes SAVE_DIR/command.txt (the resolved command of the latest run, after a
# `cd` to the directory it ran in, as paths may be relative) and appends
# fairseq's log to SAVE_DIR/train.log while showing it on the terminal.
# Re-running with the same SAVE_DIR resumes from SAVE_DIR/checkpoint_last.pt.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

if [[ $# -lt 3 ]]; then
    echo "usage: $0 CONFIG DATA_BIN SAVE_DIR [extra fairseq-train args...]" >&2
    exit 2
fi
config=$1 data_bin=$2 save_dir=$3
shift 3

# Resolve the command first, so a bad config creates no SAVE_DIR.
argv_file=$(mktemp)
trap 'rm -f "$argv_file"' EXIT
"$PYTHON" -m fairseq_rope.experiment --null --data "$data_bin" --save-dir "$save_dir" \
    "$config" -- "$@" > "$argv_file"
mapfile -d '' -t args < "$argv_file"
cmd=(fairseq-train "${args[@]}")

# Shell-quote only the arguments that need it: '(0.9, 0.98)', not \(0.9\,\ 0.98\).
quote() {
    local arg out=()
    for arg; do
        if [[ $arg =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then out+=("$arg"); else out+=("${arg@Q}"); fi
    done
    echo "${out[*]}"
}

mkdir -p "$save_dir"
{ echo "cd $(quote "$PWD")"; quote "${cmd[@]}"; } > "$save_dir/command.txt"
echo "# $(date -Is) $(hostname) in $PWD: $(quote "${cmd[@]}")" >> "$save_dir/train.log"

# Unbuffered, so the terminal shows progress as it happens despite the pipe;
# pipefail makes a fairseq-train failure the script's exit status.
PYTHONUNBUFFERED=1 "${cmd[@]}" 2>&1 | tee -a "$save_dir/train.log"
