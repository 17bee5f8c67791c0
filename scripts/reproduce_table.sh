#!/usr/bin/env bash
# One command per row of the RoFormer table, and one to make the table.
#
#   scripts/reproduce_table.sh ROW [--scale SCALE] [--seed N] [--device auto|cpu|cuda[:N]]
#       [--work-dir DIR] [--raw-dir DIR] [-- extra fairseq-train args...]
#   scripts/reproduce_table.sh collect [--scale SCALE] [--work-dir DIR] [--out-dir DIR]
#   scripts/reproduce_table.sh prepare [--scale SCALE] [--work-dir DIR] [--raw-dir DIR]
#
# ROW is sinusoidal, learned, rpe or rope; it trains configs/ROW_base.yaml at
# scale wmt14 and configs/ROW_demo.yaml at the demo scales (default: demo).
# A run prepares the scale's data if needed (WORK_DIR/SCALE/data), trains with
# scripts/train.sh into WORK_DIR/SCALE/ROW/seedN (rerunning resumes), evaluates
# with scripts/evaluate.sh and writes eval/run.json. `collect` writes
# docs/results/SCALE.md (the table) and SCALE_*.png from every finished run.
# WORK_DIR defaults to work/ in the repository. --help for details, including
# the length-extrapolation study (--scale demo-length) and its WMT14 analogue.
# Logic: fairseq_rope/experiments/reproduce.py and fairseq_rope/experiments/collect.py. Python: see scripts/env.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$PYTHON" -m fairseq_rope.experiments.reproduce "$@"
