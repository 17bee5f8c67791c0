"""``python -m fairseq_rope_serve.benchmark_memory MODEL_DIR [MODEL_DIR…] --input TEXT``: the memory
one ``fairseq-rope-serve`` takes, to size replicas (docs/deploy.md, *Several replicas*).

Per export and ``--inter-threads`` N (1, 2, 4): the server started as a user starts it (one
intra thread per worker), every line of TEXT sent once as a one-sentence request from 8 clients,
then its resident memory (VmRSS) and peak (VmHWM) read from /proc. N workers share one copy of
the model (CTranslate2's ``inter_threads``); N processes hold N copies, so a replica of a
separate process costs its whole RSS again.

Not a test: the figures depend on the machine. The report (Markdown) names the command,
machine, versions and date.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from fairseq_rope_serve.benchmark import Server, load, machine

INTER_THREADS = (1, 2, 4)


def measure(model_dir: Path, lines: Sequence[str], inter_threads: int) -> Dict[str, Any]:
    server = Server(model_dir, 1, "--inter-threads", str(inter_threads))
    try:
        health = server.post("GET", "/health")
        load(server, lines, 8, health["source"], health["target"])
        status = Path(f"/proc/{server.process.pid}/status").read_text()
        mib = {key: int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM")}
    finally:
        server.stop()
    return {"inter_threads": inter_threads, "rss_mib": mib["VmRSS"], "peak_mib": mib["VmHWM"]}


def report(results: List[Dict[str, Any]], command: str, date: str, sentences: int) -> str:
    import ctranslate2

    out = ["# The memory of one fairseq-rope-serve", "",
           f"Written by `{command}` on {date} ({machine()}; Python {platform.python_version()}, CTranslate2 "
           f"{ctranslate2.__version__}). Each server after {sentences} one-sentence requests from 8 clients; "
           "RSS and peak RSS of its process. Method: `runtime/fairseq_rope_serve/benchmark_memory.py`.", "",
           "| export | model.bin MiB | --inter-threads | RSS MiB | peak RSS MiB |", "|---|---|---|---|---|"]
    for r in results:
        out.append(f"| {r['export']} | {r['model_mib']:.1f} | {r['inter_threads']} | {r['rss_mib']:.0f} | "
                   f"{r['peak_mib']:.0f} |")
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_rope_serve.benchmark_memory", description=__doc__.split("\n")[0])
    parser.add_argument("model_dirs", nargs="+", type=Path)
    parser.add_argument("--input", type=Path, required=True, help="sentences, one per line")
    parser.add_argument("--out", type=Path, required=True, help="the Markdown report")
    args = parser.parse_args(argv)
    lines = [line for line in args.input.read_text(encoding="utf-8").splitlines() if line.strip()]
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    results = []
    for model_dir in args.model_dirs:
        model_mib = (model_dir / "model.bin").stat().st_size / 2**20
        for n in INTER_THREADS:
            results.append({"export": model_dir.name, "model_mib": model_mib, **measure(model_dir, lines, n)})
            print(results[-1], file=sys.stderr)
    command = "python -m fairseq_rope_serve.benchmark_memory " + shlex.join(sys.argv[1:] if argv is None else argv)
    args.out.write_text(report(results, command, date, len(lines)), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
