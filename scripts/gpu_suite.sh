#!/usr/bin/env bash
# The GPU results in one command, on a fresh GPU node, from the repository root:
#
#   scripts/gpu_suite.sh [--dry-run] [--out DIR] [--step STEP]... [--limit STEP=SECONDS]...
#                        [--raw-dir DIR] [--seeds N] [--parallel N] [--dtypes LIST]
#                        [--wheelhouse DIR] [--state DIR]
#
# Without --step it runs the one command of docs/gpus.md, at most 9 minutes in all (a node may
# be held for 15, its start included): install, test, benchmark. Each step is time-boxed; a step
# may also use what the steps before it left of their boxes. A step that fails or runs out of
# time is reported (suite.log, and the exit status) and the next steps run all the same,
# unless it is the install.
#   install    fairseq-rope from the wheelhouse (`make wheelhouse`) into a prefix beside the
#              node's torch (scripts/install_wheelhouse.sh); skipped where it already imports.
#              Every step then runs the checkout's own fairseq_rope: the wheelhouse
#              brings what it needs, a copy made before the last edit is never measured
#              -> OUT/install.log (box: 220 s; 157 s measured on an H100 node and 193 s on
#              an H200 node when fairseq's extensions compiled one after another, which
#              they no longer do); if it does not finish, the steps after it are skipped
#              (they would only fail to import fairseq)
#   test       pytest -m gpu (tests/gpu): exactness on CUDA in fp32, fp16 and bf16, the fused
#              rotation against the PyTorch path, kernel launches per step
#              -> OUT/test.log, OUT/test.xml (box: 110 s)
#   benchmark  scripts/benchmark.py at base size in DTYPES, stock, learned (the control), rope
#              and rope_pytorch (rope with FAIRSEQ_ROPE_TRITON=0: which rotation a step
#              should take), with its own time box (--max-seconds) inside the step's
#              -> OUT/benchmarks/ (and docs/benchmarks/<gpu>.md) (box: 210 s)
# and, only when named with --step (each fits a 10-minute job of its own):
#   profile    scripts/profile_step.py at base size, once per dtype of DTYPES (about 3
#              minutes each on an H100 node): each operator's CPU time, calls and CUDA time
#              per training step and beam search, RoPE against stock
#              -> OUT/benchmarks/profile-base-<gpu>-DTYPE.md (and docs/benchmarks/)
#   kernels    the fused rotation's host cost per call against its GPU time, and the kernel's
#              time by layout, tile and table strides (scripts/triton_launch_cost.py,
#              scripts/triton_kernel_sweep.py; about a minute on an H200 node)
#              -> OUT/benchmarks/triton-launch.md, OUT/benchmarks/triton-sweep.md (box: 150 s)
#   table      the multi30k-converged table: every row x SEEDS seeds (default 5), PARALLEL
#              runs at once on the GPU (default 4); needs --raw-dir, the six Multi30k release
#              files -> OUT/results/ (the table, plots, and every run's record under runs/)
#
# A rerun on the same machine skips the steps that finished (STATE/done/); the table's runs
# resume where they stopped. STATE (default /tmp/fairseq-rope-gpu-suite) keeps the prefix,
# the runs and the markers between jobs. OUT defaults to $OUT when set, else gpu-suite/.
# DTYPES (--dtypes, default fp32,fp16,bf16): what the benchmark and profile steps measure.
# --limit STEP=SECONDS replaces a step's box.
#
# --dry-run: every step at tiny size on the CPU, which is how CI checks this script:
# the test step runs tests/gpu with FAIRSEQ_ROPE_GPU_TESTS_DEVICE=cpu, the benchmark
# its --smoke preset, the profile fp32 at tiny size, the table every row at the demo
# scale for a few updates. Its boxes are three times as long (a CPU is slower).
set -euo pipefail
SELF=$(realpath "${BASH_SOURCE[0]}")
cd "$(dirname "$SELF")/.."
ALL_STEPS=(install test benchmark profile kernels table)
DEFAULT_STEPS=(install test benchmark)  # the one command: 220 + 110 + 210 = 540 s
ALL_DTYPES=(fp32 fp16 bf16)
# Seconds each step may take: the default steps within 9 minutes, the others a 10-minute job each.
declare -A LIMIT=([install]=220 [test]=110 [benchmark]=210 [profile]=540 [kernels]=150 [table]=570)

log() { echo "[gpu_suite $(date -u +%H:%M:%S)] $*" | tee -a "$OUT_DIR/suite.log" >&2; }

step_install() {
    if "$PY" -c "import fairseq_rope, sacremoses, subword_nmt, sacrebleu" 2>/dev/null; then
        log "install: fairseq-rope already imports with $PY: skipped"
        return 0
    fi
    # Its whole log comes back in OUT: a build error is otherwise lost in the output of the
    # steps after it.
    if ! scripts/install_wheelhouse.sh --wheelhouse "$WHEELHOUSE" --prefix "$STATE/prefix" \
            >"$OUT_DIR/install.log" 2>&1; then
        tail -n 20 "$OUT_DIR/install.log" >&2
        return 1
    fi
    tail -n 1 "$OUT_DIR/install.log" >"$STATE/env.sh"
}

step_test() {
    FAIRSEQ_ROPE_GPU_TESTS_DEVICE=$DEVICE "$PY" -m pytest -m gpu tests/gpu -q -p no:cacheprovider \
        --junitxml "$OUT_DIR/test.xml" 2>&1 | tee "$OUT_DIR/test.log"
}

step_benchmark() {
    # Its own time box, inside the step's, so that what it measured is written.
    local seconds=$((STEP_LIMIT > 60 ? STEP_LIMIT - 30 : STEP_LIMIT / 2))
    # The control (learned), and RoPE both ways: the fused kernel and the PyTorch path.
    local rows=sinusoidal,learned,rope,rope_pytorch
    if [[ $DRY_RUN == 1 ]]; then
        "$PY" scripts/benchmark.py --smoke --device cpu --dtypes fp32 --rows "$rows" \
            --out-dir "$OUT_DIR/benchmarks" --max-seconds "$seconds"
    else
        "$PY" scripts/benchmark.py --size base --device cuda --dtypes "$DTYPES" --rows "$rows" \
            --train-lengths 64,256 --decode-lengths 32 --op-lengths 256,1024 --max-tokens 4096 \
            --max-seconds "$seconds" --out-dir "$OUT_DIR/benchmarks"
        cp "$OUT_DIR"/benchmarks/*.md docs/benchmarks/
    fi
}

step_profile() {
    mkdir -p "$OUT_DIR/benchmarks"
    if [[ $DRY_RUN == 1 ]]; then
        "$PY" scripts/profile_step.py --size tiny --length 4 --steps 1 --out "$OUT_DIR/benchmarks/profile-dry-run.md"
        return
    fi
    local dtype
    for dtype in ${DTYPES//,/ }; do
        "$PY" scripts/profile_step.py --size base --device cuda --dtype "$dtype" --out-dir "$OUT_DIR/benchmarks"
    done
    cp "$OUT_DIR"/benchmarks/profile-base-*.md docs/benchmarks/
}

step_kernels() {
    mkdir -p "$OUT_DIR/benchmarks"
    local dry=()
    [[ $DRY_RUN == 1 ]] && dry=(--dry-run)
    "$PY" scripts/triton_launch_cost.py ${dry[@]+"${dry[@]}"} --out "$OUT_DIR/benchmarks/triton-launch.md"
    "$PY" scripts/triton_kernel_sweep.py ${dry[@]+"${dry[@]}"} | tee "$OUT_DIR/benchmarks/triton-sweep.md"
}

run_one() {  # ROW SEED: one cell of the table, its output in OUT/run-ROW-seedSEED.log
    local log="$OUT_DIR/run-$1-seed$2.log"
    # shellcheck disable=SC2086  # EXTRA: words
    scripts/reproduce_table.sh "$1" --scale "$SCALE" --seed "$2" --device "$DEVICE" --work-dir "$STATE/work" \
        $EXTRA >"$log" 2>&1 || { echo "run $1 seed $2 failed: $log" >&2; return 1; }
}

step_table() {
    local raw=() status=0
    [[ -n $RAW_DIR ]] && raw=(--raw-dir "$RAW_DIR")
    # The data once, before the runs that share it.
    scripts/reproduce_table.sh prepare --scale "$SCALE" --work-dir "$STATE/work" ${raw[@]+"${raw[@]}"}
    # Several runs at once on the one GPU, a few CPU threads each for data and Python.
    export -f run_one
    export SCALE DEVICE STATE OUT_DIR EXTRA PYTHON=$PY OMP_NUM_THREADS=2
    for seed in $(seq 1 "$SEEDS"); do
        for row in sinusoidal rope rpe learned; do echo "$row $seed"; done
    done | xargs -P "$PARALLEL" -L 1 bash -c 'run_one "$@"' _ || status=$?
    mkdir -p "$OUT_DIR/results"
    # The table, plots and every finished run's record (results/runs/SCALE/ROW/seedN/run.json).
    "$PY" -m fairseq_rope.experiments.reproduce collect --scale "$SCALE" --work-dir "$STATE/work" \
        --out-dir "$OUT_DIR/results" || status=1
    return "$status"
}

if [[ ${1:-} == __step ]]; then  # one step, as the loop below runs it (under timeout)
    [[ -f $STATE/env.sh ]] && source "$STATE/env.sh"
    # The checkout's fairseq_rope, not the wheelhouse's copy: a wheelhouse made before the
    # last edit would otherwise be what scripts/benchmark.py and the table import.
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    "step_$2"
    exit
fi

PY=${PYTHON:-python3}
OUT_DIR=${OUT:-gpu-suite}
STATE=/tmp/fairseq-rope-gpu-suite
WHEELHOUSE=wheelhouse
RAW_DIR=
SEEDS=5
PARALLEL=4
DTYPES=$(IFS=,; echo "${ALL_DTYPES[*]}")
DRY_RUN=0
STEPS=()
declare -A OVERRIDE=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --dry-run) DRY_RUN=1; shift ;;
        --out) OUT_DIR=$2; shift 2 ;;
        --step) STEPS+=("$2"); shift 2 ;;
        --raw-dir) RAW_DIR=$2; shift 2 ;;
        --seeds) SEEDS=$2; shift 2 ;;
        --parallel) PARALLEL=$2; shift 2 ;;
        --dtypes) DTYPES=$2; shift 2 ;;
        --wheelhouse) WHEELHOUSE=$2; shift 2 ;;
        --state) STATE=$2; shift 2 ;;
        --limit)
            [[ $2 =~ ^([a-z]+)=([0-9]+)$ && -n ${LIMIT[${BASH_REMATCH[1]}]:-} ]] \
                || { echo "error: --limit takes STEP=SECONDS, got $2" >&2; exit 2; }
            OVERRIDE[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}; shift 2 ;;
        -h|--help) sed -n '2,41p' "$SELF" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: unknown argument $1 (--help for usage)" >&2; exit 2 ;;
    esac
done
[[ ${#STEPS[@]} -gt 0 ]] || STEPS=("${DEFAULT_STEPS[@]}")
for step in "${STEPS[@]}"; do
    [[ " ${ALL_STEPS[*]} " == *" $step "* ]] || { echo "error: unknown step $step (steps: ${ALL_STEPS[*]})" >&2; exit 2; }
done
for dtype in ${DTYPES//,/ }; do
    [[ " ${ALL_DTYPES[*]} " == *" $dtype "* ]] || { echo "error: unknown dtype $dtype (dtypes: ${ALL_DTYPES[*]})" >&2; exit 2; }
done
if [[ $DRY_RUN == 1 ]]; then
    STATE=$STATE/dry-run DEVICE=cpu SCALE=demo SEEDS=1 EXTRA="-- --max-update 10 --save-interval-updates 2"
else
    DEVICE=cuda SCALE=multi30k-converged EXTRA=
    if [[ " ${STEPS[*]} " == *" table "* && -z $RAW_DIR ]]; then
        echo "error: the table step needs --raw-dir DIR (the six Multi30k release files; the node is offline)" >&2
        exit 2
    fi
fi
mkdir -p "$OUT_DIR" "$STATE/done"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
STATE=$(cd "$STATE" && pwd)
[[ -z $RAW_DIR ]] || RAW_DIR=$(cd "$RAW_DIR" && pwd)
export PY OUT_DIR STATE WHEELHOUSE RAW_DIR SEEDS PARALLEL DTYPES DRY_RUN DEVICE SCALE EXTRA STEP_LIMIT PYTHONUNBUFFERED=1
if [[ $DRY_RUN == 1 ]]; then  # a CPU decodes the dry run's untrained models slowly
    for step in "${ALL_STEPS[@]}"; do LIMIT[$step]=$((3 * LIMIT[$step])); done
fi
for step in "${!OVERRIDE[@]}"; do LIMIT[$step]=${OVERRIDE[$step]}; done

# Each step's box, plus what the steps before it left unused of theirs.
saved=0
install_failed=0
for step in "${STEPS[@]}"; do
    if [[ -f $STATE/done/$step ]]; then
        log "$step: finished by an earlier run (rm $STATE/done/$step to redo it)"
        continue
    fi
    if [[ $install_failed == 1 ]]; then
        log "$step: skipped: the install did not finish (OUT/install.log)"
        continue
    fi
    limit=$((LIMIT[$step] + saved))
    log "$step: started (limit $limit s)"
    start=$SECONDS
    status=0
    STEP_LIMIT=$limit timeout --kill-after=10 "$limit" bash "$SELF" __step "$step" || status=$?
    took=$((SECONDS - start))
    saved=$((limit > took ? limit - took : 0))
    next="the next steps run all the same"
    [[ $step != install ]] || next="the next steps are skipped"
    if [[ $status == 0 ]]; then
        touch "$STATE/done/$step"
        log "$step: done in $took s"
    elif [[ $status == 124 || $status == 137 ]]; then
        log "$step: timed out after $took s (limit $limit s); $next"
    else
        log "$step: failed (exit $status, after $took s); $next"
    fi
    [[ $step != install || $status == 0 ]] || install_failed=1
done
missing=()
for step in "${STEPS[@]}"; do [[ -f $STATE/done/$step ]] || missing+=("$step"); done
if [[ ${#missing[@]} -gt 0 ]]; then
    log "unfinished: ${missing[*]} (rerun to resume)"
    exit 1
fi
log "all steps finished: $OUT_DIR"
