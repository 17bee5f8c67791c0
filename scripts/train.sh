#!/usr/bin/env bash
# Train an experiment config with fairseq-train; rerun unchanged to resume.
#
#   scripts/train.sh [--force] CONFIG DATA_BIN SAVE_DIR [extra fairseq-train args...]
#
# CONFIG is a config name (configs/<name>.yaml, e.g. rope_base) or a path to a
# YAML file (format: fairseq_rope/experiments/config.py). Extra arguments come last on
# the command line, so they override the config's values (argparse keeps the
# last occurrence), e.g. `--max-update 10` or `--fp16`; a config's bare flag can
# only be dropped with a config that sets it to false.
#
# Writes SAVE_DIR/command.txt (the resolved command of the latest run, after a
# `cd` to the directory it ran in, as paths may be relative) and appends
# fairseq's log to SAVE_DIR/train.log while showing it on the terminal, after
# two lines of its own: the command, and what it trains with (threads, CPU,
# plugin commit, device) as JSON, so a run resumed elsewhere keeps both.
#
# Resuming: rerunning with the same SAVE_DIR continues from
# SAVE_DIR/checkpoint_last.pt (model, optimizer, lr schedule, position in the
# epoch); on CPU the result is bit-identical to an uninterrupted run. Only the
# same run may resume: a SAVE_DIR holding checkpoints of a different command is
# refused. "Different" means another data-bin or any other option after the
# config is expanded, except when to stop and how often to validate, save and
# log (--max-update, --max-epoch, --save-interval-updates, --log-interval, ...:
# see fairseq_rope/experiments/training.py), so `--max-update N` continues a run for longer.
#   --force   continue from SAVE_DIR's checkpoints with the new arguments anyway
#             (e.g. another --update-freq on other hardware); they become the
#             recorded command. To start over, use a new SAVE_DIR.
# Bad input (unknown config, missing or incomplete DATA_BIN, a different run's
# SAVE_DIR) fails before anything is created or changed.
# $LAUNCHER, if set, runs fairseq-train under a launcher, split on whitespace, e.g.
# LAUNCHER="torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 --rdzv-id JOB"
# (torchrun takes the script's path, not a command name; see docs/distributed.md).
#
# Same as `fairseq-rope-train` (installed package): fairseq_rope/experiments/training.py.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$PYTHON" -m fairseq_rope.experiments.training "$@"
