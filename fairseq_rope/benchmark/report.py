"""Targets, the markdown report, plots and the files of one benchmark run."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_rope import base
from fairseq_rope.benchmark.ops import OP_CANDIDATES
from fairseq_rope.evaluation.report import markdown_table, pyplot, save_figure

STOCK = "sinusoidal"  # fairseq's stock Transformer: the row every ratio divides by
ROPE = "rope"


# --- Targets (issue 13 for speed and memory, issue 5 for the op level)

CONTROL = "learned"  # does stock's work with other position parameters: its ratios are the noise band
SPEED_GOAL = "≥ 1.00 median over lengths, none < 0.97"


def _speed_ok(values: Sequence[float]) -> bool:
    return statistics.median(values) >= 1.0 and min(values) >= 0.97


def _target(dtype: str, what: str, goal: str, values: Dict[int, float],
            ok: Callable[[Sequence[float]], bool], higher_is_better: bool = True,
            control: Optional[Dict[int, float]] = None) -> Dict[str, Any]:
    """One target judged by ``ok`` on its values over lengths; ``control``: the same ratio of
    the learned row, reported beside it."""
    found = list(values.values())
    worst = (min(found) if higher_is_better else max(found)) if found else None
    status = "not measured" if not found else "met" if ok(found) else "not met"
    return {"dtype": dtype, "target": what, "goal": goal, "worst": worst,
            "median": statistics.median(found) if found else None,
            "by_length": {str(k): v for k, v in values.items()},
            "control": None if control is None else {str(k): v for k, v in control.items()},
            "against_control": against_control(values, control), "status": status}


def against_control(values: Dict[int, float], control: Optional[Dict[int, float]]) -> Optional[str]:
    """Where a speed ratio lies against the control's range over lengths: inside it (as far from
    1.00 as two equally fast models read apart in this run) or below it at named lengths (a cost
    this run resolves). None without a control."""
    if not values or not control:
        return None
    low, high = min(control.values()), max(control.values())
    below = {length: low - value for length, value in values.items() if value < low}
    if not below:
        return f"inside the control's range ({low:.2f}–{high:.2f}) at every length"
    lengths = ", ".join(map(str, below))
    return (f"below the control's range ({low:.2f}–{high:.2f}) at {lengths}, "
            f"by up to {max(below.values()):.3f}")


def evaluate_targets(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each target per dtype. Speed: RoPE ÷ stock at least 1.00 as the median over lengths and
    never below 0.97, beside the learned ÷ stock control; memory and the op level: every length."""
    dtypes = list(dict.fromkeys([*results.get("ops", {}), *results.get("models", {})]))
    targets = []
    for dtype in dtypes:
        models = results.get("models", {}).get(dtype, {})

        def ratio(kind: str, row: str, key: str) -> Dict[int, float]:
            return {e["length"]: e["ratios"][f"{row}_over_stock"][key] for e in models.get(kind, [])}

        ops = {e["length"]: e["ratios"] for e in results.get("ops", {}).get(dtype, [])}
        targets += [
            _target(dtype, "training tokens/s, RoPE ÷ stock", SPEED_GOAL,
                    ratio("train", ROPE, "tokens_per_s"), _speed_ok,
                    control=ratio("train", CONTROL, "tokens_per_s")),
            _target(dtype, "beam-4 decoding sentences/s, RoPE ÷ stock", SPEED_GOAL,
                    ratio("decode", ROPE, "sentences_per_s"), _speed_ok,
                    control=ratio("decode", CONTROL, "sentences_per_s")),
            _target(dtype, "peak training memory, RoPE ÷ stock", "≤ 1.05 at every length",
                    ratio("train", ROPE, "peak_bytes"), lambda vs: max(vs) <= 1.05,
                    higher_is_better=False),
            _target(dtype, "RoPE apply time ÷ naive rotate-half", "≤ 0.50 at every length",
                    {k: v["rope_over_naive"] for k, v in ops.items()}, lambda vs: max(vs) <= 0.5,
                    higher_is_better=False),
            _target(dtype, "RoPE apply bytes/s ÷ copy bytes/s", "≥ 0.50 at every length",
                    {k: v["rope_bytes_per_s_over_copy"] for k, v in ops.items()},
                    lambda vs: min(vs) >= 0.5),
        ]
    return targets


# --- Formatting


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def fmt_rate(x: float) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def fmt_mib(nbytes: float) -> str:
    return f"{nbytes / 2**20:.1f}"


def fmt_spread(stats: Dict[str, Any], value: Callable[[float], float], fmt: Callable[[float], str]) -> str:
    """The median's value, with the interquartile range in brackets (value of q3 … q1 time)."""
    lo, hi = sorted((value(stats["q3"]), value(stats["q1"])))
    return f"{fmt(value(stats['median']))} [{fmt(lo)}–{fmt(hi)}]"


# --- Markdown

TARGETS_TEXT = (
    "Speed ratios (row ÷ stock) are medians over repetitions of each repetition's ratio: every row "
    "is timed once per repetition, moments apart, so a slow phase of the machine divides out. The "
    f"`{CONTROL}` row does the stock Transformer's work with a learned position table in place of "
    "the sinusoidal one: how far its ratios stray from 1.00 is how far two equally fast models "
    "read apart here (the noise band), and the last column says where RoPE's ratios lie against it. "
    "Why a target is or is not met, and what was tried: `docs/design.md` (*Speed*); the latest "
    "figures of every size: `docs/benchmarks/README.md`."
)


def optional_ratio(value: Optional[float]) -> str:
    return "—" if value is None else f"{value:.3f}"


def _control(by_length: Optional[Dict[str, float]]) -> str:
    if not by_length:
        return "—"
    found = list(by_length.values())
    return f"median {statistics.median(found):.3f}, {min(found):.2f}–{max(found):.2f}"


def _ratio_cell(ratios: Dict[str, Any], key: str) -> str:
    """A paired speed ratio with its interquartile range over repetitions."""
    q1, q3 = ratios[f"{key}_quartiles"]
    return f"{ratios[key]:.3f} [{q1:.3f}–{q3:.3f}]"


def markdown(results: Dict[str, Any], plots: Dict[str, str]) -> str:
    m, s = results["machine"], results["settings"]
    out = [f"# Benchmark: {results['name']}", "",
           "Written by `scripts/benchmark.py`; regenerate it rather than editing it. "
           "Medians over interleaved repetitions, interquartile range in brackets.", "",
           "```", results["command"], "```", "", "## Machine", ""]
    machine_rows = [("device", m["device"] + (f" ({m['gpu']}, CUDA {m['cuda']})" if "gpu" in m else "")),
                    ("CPU", f"{m['cpu']}, {m['cpu_cores_usable']} usable cores"),
                    ("torch threads", f"{m['torch_threads']} (interop {m['torch_interop_threads']})"),
                    ("torch / fairseq / Python", f"{m['torch']} / {m['fairseq']} / {m['python']}"),
                    ("platform", m["platform"]), ("date", m["date"]),
                    ("commit", str(m["git_commit"]))]
    out += markdown_table(("", ""), machine_rows)
    out += ["", "## Settings", ""]
    out += markdown_table(("setting", "value"), [
        (k, ", ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)) for k, v in s.items()])
    out += ["", "## Targets", "", TARGETS_TEXT, ""]
    target_rows = [(t["dtype"], t["target"], t["goal"], optional_ratio(t["median"]),
                    optional_ratio(t["worst"]),
                    ", ".join(f"{k}: {v:.2f}" for k, v in t["by_length"].items()) or "—",
                    _control(t["control"]), t["status"], t["against_control"] or "—")
                   for t in results["targets"]]
    out += markdown_table(("dtype", "target", "goal", "median over lengths", "worst length", "by length",
                           f"control: {CONTROL} ÷ stock", "status", "against the control"), target_rows)
    if results.get("skipped"):
        out += ["", "Not measured within `--max-seconds`: " + "; ".join(results["skipped"]) + "."]
    out += _ops_section(results, plots) + _models_section(results, plots)
    return "\n".join(out) + "\n"


OPS_TEXT = (
    "Forward only, no autograd, on q and k of shape (batch, heads, T, head_dim) with "
    "batch × T fixed (`op_tokens`). `rope`: the plugin's `RotaryEmbedding(head_dim)."
    "encode_qk(q, k, context)` (interleaved pairs, what the attention calls); `rope_half`: the "
    "same with `layout=\"half\"`; `naive`: `x*cos + rotate_half(x)*sin` for q and k with "
    "`torch.cat` and cos/sin precomputed at full head_dim; `fairseq`: fairseq's "
    "`RotaryPositionalEmbedding` cache lookup + `apply_rotary_pos_emb` in its own (T, B, H, D) "
    "layout; `sinusoidal`: adding a precomputed (T, head_dim) sinusoidal table to q and k; "
    "`copy`: `copy_` of q and k. Bytes moved per call = 4 × numel(q) × element size (read q "
    "and k, write two outputs; cos/sin tables not counted); bandwidth fraction = copy time ÷ "
    "RoPE time."
)


def _ops_section(results: Dict[str, Any], plots: Dict[str, str]) -> List[str]:
    ops = results.get("ops", {})
    if not ops:
        return ["", "## Op level", "", "Not run (`--skip-ops`)."]
    out = ["", "## Op level: applying the position encoding to q and k", "", OPS_TEXT]
    for dtype, entries in ops.items():
        header = ["T", "shape", *OP_CANDIDATES, "rope ÷ naive", "rope GB/s", "copy GB/s",
                  "rope ÷ copy bandwidth"]
        rows = []
        for e in entries:
            c, r = e["candidates"], e["ratios"]
            rows.append([
                str(e["length"]), f"{e['batch']}×{e['heads']}×{e['length']}×{e['head_dim']}",
                *(fmt_spread(c[name], lambda t: t, fmt_time) for name in OP_CANDIDATES),
                f"{r['rope_over_naive']:.2f}", f"{c['rope']['bytes_per_s'] / 1e9:.2f}",
                f"{c['copy']['bytes_per_s'] / 1e9:.2f}", f"{r['rope_bytes_per_s_over_copy']:.2f}",
            ])
        out += ["", f"### {dtype}: time per call", ""] + markdown_table(header, rows)
    if "ops" in plots:
        out += ["", f"![tokens/s vs length, op level]({plots['ops']})"]
    return out


def _row_command(row: Dict[str, Any]) -> str:
    """A row's arch and flags, and the fused rotation's switch where the row sets it."""
    switch = f" with `FAIRSEQ_ROPE_TRITON={row['rotation']}`" if row.get("rotation") is not None else ""
    return f"`{' '.join([row['arch'], *row['flags']])}`{switch}"


def _models_section(results: Dict[str, Any], plots: Dict[str, str]) -> List[str]:
    models = results.get("models", {})
    if not models:
        return ["", "## Model level", "", "Not run (`--skip-models`)."]
    out = ["", "## Model level", "",
           "Every row built as `fairseq-train` builds it (fairseq's parser, task, criterion and "
           "`Trainer`), identical dims, batches, seeds and threads; `sinusoidal` is fairseq's stock "
           "Transformer. Training: `Trainer.train_step` (forward, backward, Adam step); tokens/s "
           "counts target tokens. Decoding: `SequenceGenerator`, beam 4, lenpen 0.6, output length "
           "forced to T (min_len = max_len_b = T; random weights) so every row does the same work. "
           "Peak memory: persistent tensors (weights, buffers, optimizer state) + the most "
           "allocated during one step above what was allocated before it (CUDA: "
           "`max_memory_allocated`; CPU: `torch.profiler` allocation events summed in order)."]
    for dtype, entry in models.items():
        names = list(entry["rows"])
        others = [n for n in names if n != STOCK]
        out += ["", f"### {dtype}: parameters", ""]
        out += markdown_table(("row", "arch and flags", "parameters"),
                      [(n, _row_command(r), f"{r['params']:,}") for n, r in entry["rows"].items()])
        for kind, unit, key in (("train", "training tokens/s", "tokens_per_s"),
                                ("decode", "beam-4 decoding sentences/s", "sentences_per_s")):
            entries = entry.get(kind, [])
            if not entries:
                continue
            rows = []
            for e in entries:
                work = e["target_tokens"] if kind == "train" else e["sentences"]
                rows.append([str(e["length"]), f"{e['sentences']}×{e['length']}",
                             *(fmt_spread(e["rows"][n], lambda t, w=work: w / t, fmt_rate)
                               for n in names),
                             *(_ratio_cell(e["ratios"][f"{n}_over_stock"], key) for n in others)])
            header = ["T", "sentences×T", *names, *(f"{n} ÷ {STOCK}" for n in others)]
            out += ["", f"### {dtype}: {unit}", ""] + markdown_table(header, rows)
            mem_rows = [[str(e["length"]), *(fmt_mib(e["rows"][n]["peak_bytes"]) for n in names),
                         *(f"{e['ratios'][f'{n}_over_stock']['peak_bytes']:.3f}" for n in others)]
                        for e in entries]
            out += ["", f"### {dtype}: peak memory (MiB), {kind}", ""]
            out += markdown_table(["T", *names, *(f"{n} ÷ {STOCK}" for n in others)], mem_rows)
            launches = "launches_per_step" if kind == "train" else "launches"
            if all(launches in e["rows"][n] for e in entries for n in names):
                launch_rows = [[str(e["length"]), *(str(e["rows"][n][launches]) for n in names),
                                *(f"{e['rows'][n][launches] - e['rows'][STOCK][launches]:+d}" for n in others)]
                               for e in entries]
                what = "per training step" if kind == "train" else "per beam search"
                out += ["", f"### {dtype}: kernel launches {what} (fairseq_rope/benchmark/launches.py)", ""]
                out += markdown_table(["T", *names, *(f"{n} − {STOCK}" for n in others)], launch_rows)
    for key, title in (("train", "training tokens/s vs length"), ("decode", "decoding sentences/s vs length")):
        if key in plots:
            out += ["", f"![{title}]({plots[key]})"]
    return out


# --- Plots


def _plot(path: Path, panels: Dict[str, Dict[str, Tuple[List[int], List[float]]]],
          ylabel: str, title: str) -> None:
    """One panel per dtype, one line per series: y against length, log-log."""
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (dtype, series) in zip(axes[0], panels.items()):
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o", label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        lengths = sorted({x for xs, _ in series.values() for x in xs})
        ax.set_xticks(lengths, [str(x) for x in lengths])
        ax.minorticks_off()
        ax.set(xlabel="length T (tokens)", ylabel=ylabel, title=f"{title}, {dtype}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize="small")
    save_figure(fig, path)


def write_plots(results: Dict[str, Any], out_dir: Path, name: str) -> Dict[str, str]:
    """``<name>_ops.png``, ``<name>_train.png``, ``<name>_decode.png`` for what was run."""
    plots: Dict[str, str] = {}
    ops = results.get("ops", {})
    if ops:
        panels = {dtype: {c: ([e["length"] for e in entries],
                              [e["candidates"][c]["tokens_per_s"] for e in entries])
                          for c in OP_CANDIDATES} for dtype, entries in ops.items()}
        plots["ops"] = f"{name}_ops.png"
        _plot(out_dir / plots["ops"], panels, "positions (tokens) per second",
              "q,k position encoding")
    models = results.get("models", {})
    for kind, key, ylabel in (("train", "tokens_per_s", "target tokens per second"),
                              ("decode", "sentences_per_s", "sentences per second")):
        panels = {dtype: {n: ([e["length"] for e in entry[kind]],
                              [e["rows"][n][key] for e in entry[kind]]) for n in entry["rows"]}
                  for dtype, entry in models.items() if entry.get(kind)}
        if panels:
            plots[kind] = f"{name}_{kind}.png"
            _plot(out_dir / plots[kind], panels, ylabel,
                  "training" if kind == "train" else "beam-4 decoding")
    return plots


def write_outputs(results: Dict[str, Any], out_dir: Path) -> List[Path]:
    """Targets into ``results``; then ``<name>.json``, the plots and ``<name>.md``."""
    name = results["name"]
    results["targets"] = evaluate_targets(results)
    plots = write_plots(results, out_dir, name)
    results["plots"] = plots
    base.write_json(out_dir / f"{name}.json", results)
    base.write_text(out_dir / f"{name}.md", markdown(results, plots))
    return [out_dir / f"{name}.json", out_dir / f"{name}.md", *(out_dir / p for p in plots.values())]
