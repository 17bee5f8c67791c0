#!/usr/bin/env bash
# How long the README's commands take a newcomer (issue 65, docs/install.md): a fresh clone of
# HEAD, a new venv and an empty pip cache, then `make test` (and with --demo, `make demo`
# after it), every command of the install timed apart. Run it on an otherwise idle machine
# (pause any training: kill -STOP); it writes docs/benchmarks/fresh-setup.md.
#
#   scripts/time_fresh_setup.sh [--demo] [--keep DIR]
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
demo=0 keep=""
while [[ $# -gt 0 ]]; do
    case $1 in
        --demo) demo=1 ;;
        --keep) keep=$2; shift ;;
        *) echo "usage: $0 [--demo] [--keep DIR]" >&2; exit 2 ;;
    esac
    shift
done
root=${keep:-$(mktemp -d)}
mkdir -p "$root"
[[ -z $keep ]] && trap 'rm -rf "$root"' EXIT
clone=$root/clone
rm -rf "$clone" "$root/cache"
git clone -q "$repo" "$clone"
commit=$(git -C "$clone" rev-parse --short HEAD)
# An empty pip cache of the run's own (pip fills it as a newcomer's would fill theirs).
export XDG_CACHE_HOME=$root/cache PIP_CACHE_DIR=$root/cache/pip
log=$root/timed.log
: > "$log"

# Each line make prints, stamped (make echoes every command before it runs it, so a command
# lasts from its line to the next one's); the report computes the differences.
stamped() {
    local line
    while IFS= read -r line; do
        printf '%s\t%s\n' "$EPOCHREALTIME" "$line" >> "$log"
        printf '%s\n' "$line"
    done
}
timed() {  # timed LABEL COMMAND...
    local label=$1
    shift
    printf '== %s\t%s\n' "$label" "$EPOCHREALTIME" >> "$log"
    "$@" 2>&1 | stamped
    local rc=${PIPESTATUS[0]}
    printf '== end\t%s\n' "$EPOCHREALTIME" >> "$log"
    return "$rc"
}
cd "$clone"
timed "make test" make test
[[ $demo == 1 ]] && timed "make demo" make demo

out=$repo/docs/benchmarks/fresh-setup.md
python3 - "$log" "$root" "$commit" "$demo" > "$out" <<'PY'
"""The report: each command make echoed, from its line to the next command's (pytest's output
belongs to pytest); before the first, the venv and torch (make runs those silently)."""
import os, platform, re, sys, time
from pathlib import Path

log, root, commit, demo = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
section, lines, ends = None, {}, {}
for raw in Path(log).read_bytes().decode().split("\n")[:-1]:  # progress bars hold \r: no universal newlines
    stamp, _, text = raw.partition("\t")
    if stamp == "== end":
        ends[section] = float(text) - start
    elif stamp.startswith("== "):
        section, start = stamp[3:], float(text)
        lines[section] = []
    else:
        lines[section].append((float(stamp) - start, text))
COMMAND = re.compile(r"^(\.venv/bin/|printf |rm |source |PYTHON=)")
cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
print("# A newcomer's minutes: `make test` on a fresh clone\n")
print(f"Written by `scripts/time_fresh_setup.sh{' --demo' if demo else ''}`; regenerate it rather than "
      f"editing it. A fresh clone of {commit}, a new `.venv`, an empty pip cache (`PIP_CACHE_DIR` a new "
      "directory), nothing else running. The method: [install.md](../install.md).\n")
print(f"| | |\n|---|---|\n| date | {time.strftime('%Y-%m-%dT%H:%M:%S%z')} |\n| CPU | {cpu}, {os.cpu_count()} cores |")
print(f"| Python | {platform.python_version()} |\n")
print("| command | wall |\n|---|---|")
for label in lines:
    seconds = ends[label]
    print(f"| `{label}` | {seconds:.0f} s ({seconds / 60:.1f} min) |")
for label, stamped in lines.items():
    end = ends[label]
    commands = [(t, text) for t, text in stamped if COMMAND.match(text)]
    print(f"\n`{label}`, command by command:\n\n| seconds | command |\n|---|---|")
    if commands and commands[0][0] > 1:
        print(f"| {commands[0][0]:.0f} | (make's silent steps before the first command: the venv, torch) |")
    for (t, text), (t_next, _) in zip(commands, commands[1:] + [(end, "")]):
        print(f"| {t_next - t:.0f} | `{text}` |")
    summary = [text for _, text in stamped if re.search(r"\d+ (passed|failed)", text)]
    if summary:
        print(f"\npytest: `{summary[-1].strip('= ')}`")
    scores = [text for _, text in stamped if text.startswith(("BLEU (tokenized", "sacreBLEU (detokenized"))]
    if scores:
        print("\nThe demo's scores:\n\n" + "\n".join(f"    {text}" for text in scores))
PY
echo "wrote $out"
