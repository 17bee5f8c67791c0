#!/usr/bin/env bash
# Evaluate a training run the paper's way: average the last N checkpoints,
# decode with beam 4 / length penalty 0.6, report tokenized compound-split BLEU
# and sacreBLEU (fairseq_rope/evaluation/scoring.py explains both).
#
#   scripts/evaluate.sh SAVE_DIR DATA_BIN [--raw-ref FILE] [--subset test]
#       [--num-checkpoints 5] [--detok-lang LANG] [--max-tokens 8192] [--force]
#       [-- extra fairseq-generate args...]
#
# Averages the last N update checkpoints (epoch checkpoints if there are no
# update checkpoints; fewer than N is an error) into
# SAVE_DIR/checkpoint_avg_lastN.pt and decodes it. Writes to SAVE_DIR/eval/:
# generate-SUBSET.txt (fairseq-generate's output; its log: generate-SUBSET.log),
# hyps.tok.TGT, refs.tok.TGT, hyps.detok.TGT, averaged_checkpoints.txt and
# results.json. --raw-ref (untokenized references) defaults to
# DATA_BIN/../raw/SUBSET.TGT; if that does not exist, sacreBLEU is reported as
# unavailable. Extra arguments after -- go to fairseq-generate, last.
#
# results.json is written last and marks a finished evaluation: a SAVE_DIR that
# has one is refused unless --force. The inputs (the subset and its references,
# --raw-ref) are checked before anything is averaged or decoded; every output
# appears atomically.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

usage() {
    echo "usage: $0 SAVE_DIR DATA_BIN [--raw-ref FILE] [--subset test] [--num-checkpoints 5]" \
         "[--detok-lang LANG] [--max-tokens 8192] [--force] [-- extra fairseq-generate args...]" >&2
    exit 2
}
[[ $# -ge 2 ]] || usage
save_dir=$1 data_bin=$2
shift 2
raw_ref="" subset=test num=5 detok_lang="" max_tokens=8192 force=0 extra=()
while [[ $# -gt 0 ]]; do
    if [[ $1 == --?* && $1 != --force && $# -lt 2 ]]; then echo "error: $1 needs a value" >&2; usage; fi
    case $1 in
        --force) force=1; shift ;;
        --raw-ref) raw_ref=$2; shift 2 ;;
        --subset) subset=$2; shift 2 ;;
        --num-checkpoints) num=$2; shift 2 ;;
        --detok-lang) detok_lang=$2; shift 2 ;;
        --max-tokens) max_tokens=$2; shift 2 ;;
        --) shift; extra=("$@"); break ;;
        *) echo "unknown option: $1" >&2; usage ;;
    esac
done

for dir in "$save_dir" "$data_bin"; do
    if [[ ! -d $dir ]]; then echo "error: no such directory: $dir" >&2; exit 1; fi
done
eval_dir=$save_dir/eval
avg=$save_dir/checkpoint_avg_last$num.pt
if [[ -e $eval_dir/results.json && $force == 0 ]]; then
    echo "error: $eval_dir/results.json exists: $save_dir is evaluated already." \
         "Pass --force to evaluate it again (replaces its eval/ results and $avg)." >&2
    exit 1
fi

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Plugin dir without importing it (find_spec does not run the package), and
# whether CUDA is there (fairseq would fall back to CPU anyway; --cpu says so).
read -r plugin has_cuda < <("$PYTHON" -c '
import importlib.util, os, torch
print(os.path.dirname(importlib.util.find_spec("fairseq_rope").origin), int(torch.cuda.is_available()))')
if [[ -z ${plugin:-} ]]; then
    echo "error: cannot import fairseq_rope and torch (is the virtual environment active?)" >&2
    exit 1
fi

# Before averaging and decoding: the subset must have references, --raw-ref must match it.
check=("$PYTHON" -m fairseq_rope.evaluation.scoring --check --data-bin "$data_bin" --subset "$subset")
if [[ -n $raw_ref ]]; then check+=(--raw-ref "$raw_ref"); fi
"${check[@]}" || exit 1

# From here on the old results (and what reproduce_table.sh derived from them)
# no longer describe eval/: gone, so a failure cannot leave them looking current.
rm -f "$eval_dir/results.json" "$eval_dir/run.json" "$eval_dir/bleu_by_length.json"

# --force: the averaged checkpoint is this script's own intermediate, redone on every run.
averaged_list=$("$PYTHON" "$here/average_checkpoints.py" --inputs "$save_dir" --output "$avg" \
    --num-checkpoints "$num" --force) || exit 1
mapfile -t averaged <<< "$averaged_list"
mkdir -p "$eval_dir"
printf '%s\n' "${averaged[@]}" > "$eval_dir/.averaged_checkpoints.txt.tmp"
mv "$eval_dir/.averaged_checkpoints.txt.tmp" "$eval_dir/averaged_checkpoints.txt"

# --required-batch-size-multiple 1: with fairseq's default of 8 the last batch
# (the longest sentences) is dropped unless its size is a multiple of 8
# (facebookresearch/fairseq#5036), and BLEU would be on an incomplete test set.
gen=(fairseq-generate "$data_bin" --user-dir "$plugin" --path "$avg"
     --gen-subset "$subset" --beam 4 --lenpen 0.6 --remove-bpe --max-tokens "$max_tokens"
     --required-batch-size-multiple 1)
if [[ $has_cuda == 0 ]]; then gen+=(--cpu); fi
gen+=("${extra[@]}")
output=$eval_dir/generate-$subset.txt log=$eval_dir/generate-$subset.log
echo "decoding $subset with $avg -> $output (log: $log)" >&2
if ! "${gen[@]}" > "$output.tmp" 2> "$log"; then
    rm -f "$output.tmp"
    tail -n 40 "$log" >&2
    echo "error: fairseq-generate failed (full log: $log)" >&2
    exit 1
fi
mv "$output.tmp" "$output"

score=("$PYTHON" -m fairseq_rope.evaluation.scoring "$output" --out-dir "$eval_dir"
       --data-bin "$data_bin" --subset "$subset" --checkpoint "$avg"
       --averaged-checkpoints "${averaged[@]}")
if [[ -n $raw_ref ]]; then score+=(--raw-ref "$raw_ref"); fi
if [[ -n $detok_lang ]]; then score+=(--detok-lang "$detok_lang"); fi
"${score[@]}" -- "${gen[@]}"
