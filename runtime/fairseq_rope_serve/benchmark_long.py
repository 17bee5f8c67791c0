"""``python -m fairseq_rope_serve.benchmark_long MODEL_DIR TEXT``: what a request at the
character limit costs, by the shape of its text, against ordinary text of the same size.

Every shape has the same number of characters: as much of TEXT (ordinary sentences, a few to a
line, at most ``--max-sentences`` lines) as fits in ``--max-chars``. The shapes are those that
cost most before the source bound and the single re-scoring (issue 64): one long word (a word
of TEXT repeated without spaces), letters with no spaces (seeded random), one-letter words
("x x x …") and ``--max-sentences`` short lines of random letters. Each is sent as one request to
``fairseq-rope-serve`` (default limits but ``--max-chars``; every answer 200) and translated
offline in this process (:meth:`TextTranslator.translate`), ``--rounds`` times in a rotating
order; medians are reported, with the ratio to the ordinary text's.

Not a test: the figures depend on the machine and its load. The report (Markdown, JSON beside
it) names the command, machine, versions and date. Run with another runtime first on
``PYTHONPATH`` (the file itself, ``python runtime/fairseq_rope_serve/benchmark_long.py``), it
measures that runtime the same way (the "before" of a change).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shlex
import statistics
import string
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fairseq_rope_serve.benchmark import Server, machine, write_report

ORDINARY = "ordinary text"


def ordinary_lines(sentences: Sequence[str], max_chars: int, max_lines: int) -> List[str]:
    """Sentences of ``sentences`` (cycled), a few to a line of about ``max_chars / max_lines``
    characters, as many as fit in ``max_chars`` (newlines counted, as the server counts them)
    and ``max_lines`` lines."""
    pool = [s.strip() for s in sentences if s.strip()]
    width = -(-max_chars // max_lines) - 1  # a line's share, less its newline
    lines, k = [""], 0
    while True:
        sentence, k = pool[k % len(pool)], k + 1
        if len(lines[-1]) < width:  # this line takes one more sentence
            candidate = lines[:-1] + [f"{lines[-1]} {sentence}".strip()]
        elif len(lines) < max_lines:
            candidate = lines + [sentence]
        else:
            return lines
        if len("\n".join(candidate)) > max_chars:
            return lines
        lines = candidate


def shapes(sentences: Sequence[str], max_chars: int, max_lines: int, seed: int = 1) -> Dict[str, List[str]]:
    """name → the request's lines, each shape of the ordinary text's size in characters."""
    ordinary = ordinary_lines(sentences, max_chars, max_lines)
    size = len("\n".join(ordinary))
    rng = random.Random(seed)
    word = max((w.strip(string.punctuation) for s in sentences for w in s.split()), key=len)
    letters = "".join(rng.choice(string.ascii_lowercase) for _ in range(size))
    width = (size - (max_lines - 1)) // max_lines
    short = ["".join(rng.choice(string.ascii_lowercase + "  ") for _ in range(width)).strip() or "x"
             for _ in range(max_lines)]
    return {
        ORDINARY: ordinary,
        "one long word": [(word.lower() * size)[:size]],
        "letters, no spaces": [letters],
        "one-letter words": [("x " * size)[:size].rstrip() or "x"],
        f"{max_lines} short lines": short,
    }


def cut_lines(model, lines: Sequence[str]) -> int:
    """Lines longer than the model's source bound (0 for a runtime without one)."""
    try:
        from fairseq_rope_serve.decoding import max_source_subwords
    except ImportError:
        return 0
    bound = max_source_subwords(model.settings)
    return sum(len(s) > bound for s in model.subwords(lines))


def benchmark(model_dir: Path, sentences: Sequence[str], threads: int, rounds: int, max_chars: int,
              max_lines: int) -> Dict[str, Any]:
    from fairseq_rope_serve.translator import TextTranslator

    texts = shapes(sentences, max_chars, max_lines)
    model = TextTranslator(model_dir, threads=threads)
    settings = model.settings
    # The server's defaults are 10,000 and 128 (another runtime's Server may take no options).
    limits = [] if (max_chars, max_lines) == (10_000, 128) else ["--max-chars", str(max_chars),
                                                                 "--max-sentences", str(max_lines)]
    server = Server(model_dir, threads, *limits)
    times: Dict[str, Dict[str, List[float]]] = {name: {"server": [], "offline": []} for name in texts}
    try:
        for name, lines in texts.items():  # warm both, once
            server.post("POST", "/translate", {"q": "\n".join(lines), "source": settings.source_lang,
                                               "target": settings.target_lang})
        for r in range(rounds):
            names = list(texts)
            for name in names[r % len(names):] + names[:r % len(names)]:  # rotating order
                lines = texts[name]
                start = time.perf_counter()
                server.post("POST", "/translate", {"q": "\n".join(lines), "source": settings.source_lang,
                                                   "target": settings.target_lang})
                times[name]["server"].append(time.perf_counter() - start)
                start = time.perf_counter()
                model.translate(lines)
                times[name]["offline"].append(time.perf_counter() - start)
    finally:
        server.stop()
    rows = []
    for name, lines in texts.items():
        subwords = model.subwords(lines)
        rows.append({"shape": name, "characters": len("\n".join(lines)), "lines": len(lines),
                     "subwords": sum(map(len, subwords)), "longest_line_subwords": max(map(len, subwords)),
                     "lines_cut": cut_lines(model, lines),
                     "server_s": statistics.median(times[name]["server"]),
                     "offline_s": statistics.median(times[name]["offline"])})
    base = rows[0]
    for row in rows:
        row["server_x"], row["offline_x"] = row["server_s"] / base["server_s"], row["offline_s"] / base["offline_s"]
    return {"rows": rows, "max_chars": max_chars, "max_sentences": max_lines}


TITLE = "# A request at the character limit, by the shape of its text"


def report(results: Dict[str, Any], command: str, model_dir: Path, threads: int, rounds: int,
           label: Optional[str] = None) -> str:
    out = [
        f"## {label}" if label else TITLE, "",
        f"Written by `{command}` on {results['date']} ({results['machine']}; Python {platform.python_version()}, "
        f"CTranslate2 {results['ctranslate2']}). Model: `{model_dir}`. {threads} thread(s), medians of {rounds} "
        f"rounds in a rotating order; limits {results['max_chars']} characters, {results['max_sentences']} lines. "
        "Method: `runtime/fairseq_rope_serve/benchmark_long.py`.", "",
        "| shape | characters | lines | subwords (longest line) | lines cut | server s | × ordinary | "
        "offline s | × ordinary |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        out.append(f"| {row['shape']} | {row['characters']} | {row['lines']} | {row['subwords']} "
                   f"({row['longest_line_subwords']}) | {row['lines_cut']} | {row['server_s']:.3f} | "
                   f"{row['server_x']:.2f} | {row['offline_s']:.3f} | {row['offline_x']:.2f} |")
    return "\n".join(out) + "\n"


def _invocation(argv: Sequence[str]) -> str:
    """How this run was started, for the report: the module, or this file with the runtime put
    first on PYTHONPATH (the "before" of a change)."""
    path = os.environ.get("PYTHONPATH")
    if __spec__ is None and path:  # run as a file
        return f"PYTHONPATH={shlex.quote(path)} python {shlex.quote(sys.argv[0])} {shlex.join(argv)}"
    return f"python -m fairseq_rope_serve.benchmark_long {shlex.join(argv)}"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_rope_serve.benchmark_long",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("text", type=Path, help="ordinary source text, one sentence per line")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-chars", type=int, default=10_000)
    parser.add_argument("--max-sentences", type=int, default=128)
    parser.add_argument("--out", type=Path, help="report (.md; .json beside it); default: stdout")
    parser.add_argument("--label", help="the report's heading: a section (##) of --out, added to what it holds")
    parser.add_argument("--about", help="a paragraph under the title of a new --out (how the models were made)")
    args = parser.parse_args(argv)
    sentences = args.text.read_text(encoding="utf-8").splitlines()
    results = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine(),
               **benchmark(args.model_dir, sentences, args.threads, args.rounds, args.max_chars, args.max_sentences)}
    from fairseq_rope_serve.translator import require_ctranslate2

    results["ctranslate2"] = require_ctranslate2().__version__
    command = _invocation(sys.argv[1:] if argv is None else argv)
    text = report(results, command, args.model_dir, args.threads, args.rounds, args.label)
    if args.out and args.label:  # one section more: the title once, the JSON a list of runs
        about = f"\n{args.about}\n" if args.about else ""
        before = args.out.read_text(encoding="utf-8") if args.out.exists() else f"{TITLE}\n{about}"
        args.out.write_text(f"{before}\n{text}", encoding="utf-8")
        runs = json.loads(args.out.with_suffix(".json").read_text()) if args.out.with_suffix(".json").exists() else []
        runs.append({"label": args.label, "command": command, **results})
        args.out.with_suffix(".json").write_text(json.dumps(runs, indent=2) + "\n")
    else:
        write_report(text, command, results, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
