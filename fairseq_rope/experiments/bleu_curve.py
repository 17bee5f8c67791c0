"""BLEU against training updates, to choose a training budget: ``scripts/bleu_curve.py``.

For every kept update checkpoint ``u`` of a run (``--every`` thins them), the
last ``--window`` checkpoints up to ``u`` are averaged, exactly as
``scripts/evaluate.sh`` averages the last 5 at the end of training, and the
average decodes ``--subset`` (default ``valid``: the budget is chosen without
looking at the test set) with beam 4 and length penalty 0.6. Each point is
scored in both BLEU conventions (:mod:`fairseq_rope.evaluation.scoring`). The curve's
*plateau* is its best score; every point says what fraction of it it reaches.

Writes ``OUT.json`` (the points and how they were measured), ``OUT.md`` and
``OUT.png``. A rerun reuses the points already in ``OUT.json`` for the same
run and settings, so the curve of a run still training can be extended.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fairseq_rope import base
from fairseq_rope.base import TABLE_DECODING, command_line, report_error
from fairseq_rope.evaluation.averaging import AveragingError, average_last_checkpoints, find_checkpoints
from fairseq_rope.evaluation.report import finish, markdown_table, new_axes
from fairseq_rope.evaluation.decoding import generate
from fairseq_rope.evaluation.scoring import (
    ScoringError,
    check_test_set,
    default_raw_reference,
    evaluate_translations,
    read_generate_output,
)

BEAM, LENPEN = TABLE_DECODING["beam"], TABLE_DECODING["lenpen"]


def measure_point(save_dir: Path, data_bin: Path, subset: str, update: int, window: int,
                  work: Path) -> Dict[str, Any]:
    """Average the ``window`` checkpoints up to ``update``, decode ``subset``, score it."""
    averaged = work / f"avg_{update}.pt"
    inputs = average_last_checkpoints(save_dir, averaged, window, upper_bound=update, force=True)
    generated = work / f"generate-{subset}-{update}.txt"
    try:
        generate(averaged, data_bin, generated, subset)
    finally:
        averaged.unlink(missing_ok=True)
    _, target = check_test_set(data_bin, subset)
    results = evaluate_translations(read_generate_output(generated), work / f"eval-{update}", target,
                                    raw_reference=default_raw_reference(data_bin, subset, target))
    return {"update": update, "averaged": [p.name for p in inputs],
            "bleu_tokenized": results["bleu_tokenized"], "sacrebleu": results["sacrebleu"],
            "chrf": results["chrf"]}


def with_plateau(points: List[Dict[str, Any]], key: str = "bleu_tokenized") -> Dict[str, Any]:
    """The best point of the curve, and each point's fraction of it."""
    best = max(points, key=lambda p: p[key])
    for p in points:
        p["fraction_of_best"] = p[key] / best[key] if best[key] else None
    return {"metric": key, "best_update": best["update"], "best": best[key]}


def render(report: Dict[str, Any]) -> str:
    plateau = report["plateau"]
    rows = [[str(p["update"]), f"{p['bleu_tokenized']:.2f}",
             "—" if p["sacrebleu"] is None else f"{p['sacrebleu']:.2f}",
             "—" if p["chrf"] is None else f"{p['chrf']:.2f}",
             "—" if p["fraction_of_best"] is None else f"{100 * p['fraction_of_best']:.1f} %"]
            for p in report["points"]]
    return "\n".join([
        f"# BLEU against updates: run `{Path(report['save_dir']).name}`",
        "",
        f"Each point: the average of the last {report['window']} checkpoints up to that update, "
        f"decoding `{report['subset']}` with beam {BEAM} and length penalty {LENPEN}, scored as in "
        "the tables (tokenized compound-split BLEU; sacreBLEU and chrF on detokenized output). "
        f"Plateau: the best tokenized BLEU, {plateau['best']:.2f} at update {plateau['best_update']}. "
        f"Written by `{report['command']}` on {report['date']}.",
        "",
        *markdown_table(["update", "BLEU (tok.)", "sacreBLEU", "chrF", "of the plateau"], rows),
        "",
        f"![BLEU against updates]({Path(report['plot']).name})",
        "",
    ])


def plot(report: Dict[str, Any], path: Path) -> None:
    fig, ax = new_axes()
    points = report["points"]
    for key, label in (("bleu_tokenized", "BLEU (tokenized, compound-split)"), ("sacrebleu", "sacreBLEU"),
                       ("chrf", "chrF")):
        shown = [p for p in points if p[key] is not None]
        ax.plot([p["update"] for p in shown], [p[key] for p in shown], marker="o", label=label)
    finish(fig, ax, path, bool(points), xlabel="update",
            ylabel=f"score on {report['subset']} (average of the last {report['window']} checkpoints)",
            title=f"Score against updates: {Path(report['save_dir']).name}")


def bleu_curve(save_dir: Path, data_bin: Path, out: Path, subset: str = "valid", window: int = 5,
               every: int = 1, command: str = "") -> Dict[str, Any]:
    """Measure (or extend) the curve of ``save_dir`` and write ``out`` .json, .md, .png."""
    settings = {"save_dir": str(save_dir.resolve()), "data_bin": str(data_bin.resolve()),
                "subset": subset, "window": window}
    json_path = out.with_suffix(".json")
    old: Dict[int, Dict[str, Any]] = {}
    if json_path.is_file():
        previous = json.loads(json_path.read_text(encoding="utf-8"))
        if {k: previous.get(k) for k in settings} == settings:
            old = {p["update"]: p for p in previous["points"]}
    updates = [c.number for c in find_checkpoints(save_dir, "update")][window - 1:][::-1][::every][::-1]
    if not updates:
        raise AveragingError(f"{save_dir} has fewer than {window} update checkpoints")
    points = []
    with tempfile.TemporaryDirectory(prefix="bleu_curve.") as tmp:
        for update in updates:
            point = old.get(update) or measure_point(save_dir, data_bin, subset, update, window, Path(tmp))
            points.append(point)
            print(f"update {update}: BLEU {point['bleu_tokenized']:.2f}", file=sys.stderr, flush=True)
    report = {**settings, "points": points, "plateau": with_plateau(points), "command": command,
              "plot": str(out.with_suffix(".png")),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes")}
    plot(report, out.with_suffix(".png"))
    base.write_json(json_path, report)
    base.write_text(out.with_suffix(".md"), render(report))
    return report


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/bleu_curve.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("save_dir", type=Path, help="a run's checkpoint directory (keep its checkpoints: "
                        "train with --keep-interval-updates -1)")
    parser.add_argument("data_bin", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output path without suffix")
    parser.add_argument("--subset", default="valid")
    parser.add_argument("--window", type=int, default=5, help="checkpoints averaged per point")
    parser.add_argument("--every", type=int, default=1, help="measure every N-th checkpoint (the last always)")
    args = parser.parse_args(argv)
    command = command_line("scripts/bleu_curve.py", argv)
    try:
        report = bleu_curve(args.save_dir, args.data_bin, args.out, args.subset, args.window, args.every, command)
    except (AveragingError, ScoringError, OSError) as e:
        return report_error(e)
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
