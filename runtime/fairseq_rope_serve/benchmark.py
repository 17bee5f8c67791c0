"""``python -m fairseq_rope_serve.benchmark MODEL_DIR INPUT``: what serving an export costs on this machine.

Measured, each in its own process unless said, ``--rounds`` times in a rotating order (the
medians are reported):

* **start-up** of ``fairseq-rope-translate`` (wall time on an empty input: imports and model
  loading) and of ``fairseq-rope-serve`` (until its first ``/health`` answer);
* **translate**: wall time, peak RSS and sentences/s of the whole process on INPUT; with
  ``--control NAME=COMMAND``, the same for another command taking ``MODEL_DIR`` and stdin
  (for example an older ``fairseq-rope-translate``), its output compared line by line;
* **offline**: :meth:`TextTranslator.translate` on all of INPUT in this process (CTranslate2's
  ``translate_batch`` with the text processing), sentences/s: what the server is compared with;
  and the same in calls of 1, 8 and 32 sentences, the most a server with that many clients
  can batch;
* **server**: 1, 8 and 32 concurrent clients, each request one sentence of INPUT (every
  sentence once per level), throughput, p50 and p99 latency, every answer compared with the
  offline translation; the server's peak RSS;
* **serving floor** (the control): the same app and load with a model that answers at once
  (each line itself): what HTTP, JSON, the event loop and the queue hand-off cost per request,
  the part of the server's time that no model makes smaller.

Every process gets ``--threads`` CPU threads (``--intra-threads`` for the server, one inter
thread). The report (Markdown, and JSON beside it) names the command, machine, versions and date.
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

CLIENT_LEVELS = (1, 8, 32)


def run_process(command: Sequence[str], stdin: Path) -> Tuple[float, float, List[str]]:
    """(wall seconds, peak RSS MiB, stdout lines) of ``command`` reading ``stdin``.

    The peak is ``ru_maxrss``, which Linux starts at the forking parent's high-water mark: this
    process imports nothing heavy before its last child (the model is loaded in it afterwards),
    and the report gives its own peak at that point, the floor of these figures."""
    with open(stdin, "rb") as source, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, stdin=source, stdout=out, stderr=err)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        if process.returncode:
            raise SystemExit(f"{shlex.join(command)} failed:\n{err.read().decode()[-3000:]}")
        return seconds, usage.ru_maxrss / 1024, out.read().decode("utf-8").splitlines()


class Server:
    """``fairseq-rope-serve`` on a free loopback port, timed from its start to its first answer
    (``command``: another server that prints the same banner, the serving floor's)."""

    def __init__(self, model_dir: Path, threads: int, *options: str, command: Sequence[str] = ()) -> None:
        start = time.perf_counter()
        self.process = subprocess.Popen(
            list(command) or [*script("fairseq-rope-serve"), str(model_dir), "--port", "0", "--intra-threads",
                              str(threads), "--log-level", "warning", "--max-queued-sentences", "100000", *options],
            stderr=subprocess.PIPE, text=True)
        for line in self.process.stderr:
            found = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
            if found:
                break
        else:
            raise SystemExit("fairseq-rope-serve did not start")
        self.port = int(found.group(1))
        self.post("GET", "/health")
        self.startup = time.perf_counter() - start
        threading.Thread(target=self.process.stderr.read, daemon=True).start()

    def post(self, method: str, path: str, payload: Optional[dict] = None) -> Any:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        try:
            body = None if payload is None else json.dumps(payload).encode()
            connection.request(method, path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            reply = json.loads(response.read())
            if response.status != 200:
                raise SystemExit(f"{path}: {response.status} {reply}")
            return reply
        finally:
            connection.close()

    def peak_rss(self) -> float:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(60)


def load(server: Server, lines: Sequence[str], clients: int, source: str, target: str) -> Dict[str, Any]:
    """Every line of ``lines`` once, as a one-sentence request, from ``clients`` threads."""
    todo = list(enumerate(lines))
    lock = threading.Lock()
    latencies: List[float] = []
    answers: Dict[int, str] = {}

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                i, line = todo.pop(0)
            start = time.perf_counter()
            reply = server.post("POST", "/translate", {"q": line, "source": source, "target": target})
            with lock:
                latencies.append(time.perf_counter() - start)
                answers[i] = reply["translatedText"]

    threads = [threading.Thread(target=client) for _ in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    return {"clients": clients, "sentences_per_s": len(lines) / seconds, "p50_ms": 1000 * quantile(latencies, 0.5),
            "p99_ms": 1000 * quantile(latencies, 0.99), "answers": [answers[i] for i in range(len(lines))]}


FLOOR_SERVER = [sys.executable, "-c", "from fairseq_rope_serve.benchmark import serve_floor; serve_floor()"]


def serve_floor() -> None:
    """The serving floor's server: the app of fairseq-rope-serve (default limits) whose model
    answers each line with itself, on a free loopback port printed as fairseq-rope-serve prints it."""
    import socket
    from types import SimpleNamespace

    import uvicorn

    from fairseq_rope_serve.server.app import create_app
    from fairseq_rope_serve.translator import Translation

    class Instant:
        settings = SimpleNamespace(source_lang="en", target_lang="de")
        decoding = SimpleNamespace(beam=4)

        def translate_full(self, lines: Sequence[str], alternatives: Sequence[int] = ()) -> List[Translation]:
            return [Translation(line) for line in lines]

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    print(f"serving floor on http://127.0.0.1:{sock.getsockname()[1]}", file=sys.stderr, flush=True)
    uvicorn.Server(uvicorn.Config(create_app(Instant()), log_level="warning")).run(sockets=[sock])


def own_peak_rss() -> float:
    """This process's peak RSS (VmHWM), MiB."""
    return int(re.search(r"VmHWM:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1024


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q`` quantile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def script(name: str) -> List[str]:
    """A console script of this environment (beside the interpreter)."""
    return [str(Path(sys.executable).parent / name)]


def benchmark(model_dir: Path, input_path: Path, threads: int, rounds: int,
              controls: Dict[str, List[str]]) -> Dict[str, Any]:
    lines = input_path.read_text(encoding="utf-8").splitlines()
    empty = Path(tempfile.mkdtemp()) / "empty"
    empty.write_text("")
    commands = {"fairseq-rope-translate": script("fairseq-rope-translate"), **controls}
    runs: Dict[str, Dict[str, List[float]]] = {name: {"startup": [], "wall": [], "rss": []} for name in commands}
    outputs: Dict[str, List[str]] = {}
    for r in range(rounds):
        names = list(commands)
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotating order
            command = [*commands[name], str(model_dir), "--threads", str(threads)]
            runs[name]["startup"].append(run_process(command, empty)[0])
            wall, rss, outputs[name] = run_process(command, input_path)
            runs[name]["wall"].append(wall)
            runs[name]["rss"].append(rss)
    floor = own_peak_rss()
    from fairseq_rope_serve.translator import TextTranslator  # only now: see run_process

    model = TextTranslator(model_dir, threads=threads)
    offline_seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        offline = model.translate(lines)
        offline_seconds.append(time.perf_counter() - start)
    in_batches = {}
    for size in CLIENT_LEVELS:
        seconds = []
        for _ in range(rounds):
            start = time.perf_counter()
            for i in range(0, len(lines), size):
                model.translate(lines[i:i + size])
            seconds.append(time.perf_counter() - start)
        in_batches[size] = len(lines) / statistics.median(seconds)
    settings = model.settings
    servers = []
    for _ in range(rounds):
        server = Server(model_dir, threads)
        try:
            levels = [load(server, lines, clients, settings.source_lang, settings.target_lang)
                      for clients in CLIENT_LEVELS]
            servers.append({"startup": server.startup, "levels": levels, "peak_rss": server.peak_rss()})
        finally:
            server.stop()
    floors = []
    for _ in range(rounds):
        server = Server(model_dir, threads, command=FLOOR_SERVER)
        try:
            floors.append([load(server, lines, clients, "en", "de") for clients in CLIENT_LEVELS])
        finally:
            server.stop()
    offline_rate = len(lines) / statistics.median(offline_seconds)
    return {
        "sentences": len(lines),
        "benchmark_peak_rss_mib_at_spawns": floor,
        "translate": [{"command": name, "startup_s": statistics.median(r["startup"]),
                       "wall_s": statistics.median(r["wall"]), "peak_rss_mib": statistics.median(r["rss"]),
                       "sentences_per_s": len(lines) / statistics.median(r["wall"]),
                       "identical_to_offline": sum(a == b for a, b in zip(outputs[name], offline))}
                      for name, r in runs.items()],
        "offline_sentences_per_s": offline_rate,
        "offline_sentences_per_s_in_calls_of": in_batches,
        "server": {
            "startup_s": statistics.median(s["startup"] for s in servers),
            "peak_rss_mib": max(s["peak_rss"] for s in servers),
            "levels": [{"clients": clients,
                        **{k: statistics.median(s["levels"][i][k] for s in servers)
                           for k in ("sentences_per_s", "p50_ms", "p99_ms")},
                        "identical_to_offline": min(sum(a == b for a, b in zip(s["levels"][i]["answers"], offline))
                                                    for s in servers)}
                       for i, clients in enumerate(CLIENT_LEVELS)],
        },
        "floor": [{"clients": clients, **{k: statistics.median(f[i][k] for f in floors)
                                          for k in ("sentences_per_s", "p50_ms", "p99_ms")},
                   "echoed": min(sum(a == b for a, b in zip(f[i]["answers"], lines)) for f in floors)}
                  for i, clients in enumerate(CLIENT_LEVELS)],
    }


def machine() -> str:
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    return f"{cpu}, {len(os.sched_getaffinity(0))} usable cores, load average {os.getloadavg()[0]:.1f} at the start"


def report(results: Dict[str, Any], command: str, threads: int, rounds: int) -> str:
    n, offline = results["sentences"], results["offline_sentences_per_s"]
    out = [
        "# Serving an export: fairseq-rope-translate and fairseq-rope-serve on CPU", "",
        f"Written by `{command}` on {results['date']} ({results['machine']}; Python {platform.python_version()}, "
        f"CTranslate2 {results['ctranslate2']}). {n} sentences, {threads} thread(s), medians of {rounds} rounds "
        "in a rotating order. Method: `runtime/fairseq_rope_serve/benchmark.py`.", "",
        "## Translate (whole processes)", "",
        "| command | start-up s | wall s | peak RSS MiB | sentences/s | identical to offline |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["translate"]:
        out.append(f"| {row['command']} | {row['startup_s']:.2f} | {row['wall_s']:.2f} | {row['peak_rss_mib']:.0f} | "
                   f"{row['sentences_per_s']:.1f} | {row['identical_to_offline']}/{n} |")
    out += ["", f"Start-up: the same command on an empty input. Peak RSS: `ru_maxrss` of the process, which "
            f"starts at the benchmark process's own peak when it forks ({results['benchmark_peak_rss_mib_at_spawns']:.0f} "
            "MiB here, the floor of this column)."]
    server = results["server"]
    out += ["", f"Offline, in one process (`TextTranslator.translate`, CTranslate2's `translate_batch`): "
            f"**{offline:.1f} sentences/s**.", "",
            f"## Server (one sentence per request; start-up {server['startup_s']:.2f} s, "
            f"peak RSS {server['peak_rss_mib']:.0f} MiB)", "",
            "× offline in calls of N: against the same offline translation in calls of as many sentences as "
            "there are clients, the largest batch the server can form.", "",
            "| clients | sentences/s | × offline | × offline in calls of N | p50 ms | p99 ms | identical to offline |",
            "|---|---|---|---|---|---|---|"]
    in_calls = {int(k): v for k, v in results.get("offline_sentences_per_s_in_calls_of", {}).items()}
    for level in server["levels"]:
        rate, matched = level["sentences_per_s"], in_calls.get(level["clients"])
        against_calls = "—" if matched is None else f"{rate / matched:.2f} ({matched:.0f}/s)"
        out.append(f"| {level['clients']} | {rate:.1f} | {rate / offline:.2f} | {against_calls} | "
                   f"{level['p50_ms']:.1f} | {level['p99_ms']:.1f} | {level['identical_to_offline']}/{n} |")
    out += ["", "## Serving floor (the control)", "",
            "The same app, load and clients with a model that answers each line with itself at once: what "
            "serving costs per request whatever the model (HTTP, JSON, the event loop, the queue hand-off, "
            "the clients on the same cores).", "",
            "| clients | requests/s | ms per request | p50 ms | p99 ms | answers its own input |",
            "|---|---|---|---|---|---|"]
    for level in results.get("floor", []):
        out.append(f"| {level['clients']} | {level['sentences_per_s']:.0f} | {1000 / level['sentences_per_s']:.2f} | "
                   f"{level['p50_ms']:.2f} | {level['p99_ms']:.2f} | {level['echoed']}/{n} |")
    return "\n".join(out) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fairseq_rope_serve.benchmark", description=__doc__.split("\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("input", type=Path, help="raw source text, one sentence per line")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--control", action="append", default=[], metavar="NAME=COMMAND",
                        help="another translate command to measure the same way (repeatable)")
    parser.add_argument("--out", type=Path, help="report (.md; .json beside it); default: stdout")
    args = parser.parse_args(argv)
    controls = {c.split("=", 1)[0]: shlex.split(c.split("=", 1)[1]) for c in args.control}
    results = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"), "machine": machine(),
               **benchmark(args.model_dir, args.input, args.threads, args.rounds, controls)}
    from fairseq_rope_serve.translator import require_ctranslate2

    results["ctranslate2"] = require_ctranslate2().__version__
    command = "python -m fairseq_rope_serve.benchmark " + shlex.join(sys.argv[1:] if argv is None else argv)
    write_report(report(results, command, args.threads, args.rounds), command, results, args.out)
    return 0


def write_report(text: str, command: str, results: Dict[str, Any], out: Optional[Path]) -> None:
    """The report to OUT (.md) with its numbers and command in OUT's .json, or to stdout."""
    if out:
        out.write_text(text, encoding="utf-8")
        out.with_suffix(".json").write_text(json.dumps({"command": command, **results}, indent=2) + "\n")
    else:
        print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
