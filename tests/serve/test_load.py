"""fairseq-rope-serve under load on loopback: 32 concurrent clients × 20 requests of mixed
sizes and shapes, a bad one among every few, against the installed command with two batches
translated at once. Every good response is fairseq's translation of its own text (none lost,
none mixed up with a batch-mate's), every bad one gets its own error, the server's memory
stays bounded and it is still up, idle, afterwards."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Dict, List, Tuple

from tests.serve.conftest import TIMEOUT, post, request

CLIENTS, REQUESTS = 32, 20
LIMITS = ("--max-sentences", "8", "--max-chars", "600")
#: Peak resident memory the server may reach (measured: 79 MiB on this toy model, 68 before
#: the load; the Python runtime and CTranslate2 are most of it). Queues, batches and connections
#: are bounded, so more is a leak or an unbounded buffer.
PEAK_RSS_MIB = 200
GOOD = {"source": "en", "target": "de"}


def bad_request(rng: random.Random, sentence: str) -> Tuple[Any, int, str]:
    """A bad request of some kind: (payload, status, error)."""
    return rng.choice([
        (b'{"q": "' + sentence.encode() + b'", "source": "en"', 400, "the body is not valid JSON"),
        ({**GOOD, "q": sentence, "source": "fr"}, 400, "this server translates en to de, not fr to de (GET /languages)"),
        ({**GOOD, "q": ""}, 400, "q is empty: nothing to translate"),
        ({**GOOD, "q": [sentence, 7]}, 400, "q must be a string or a list of strings"),
        ({**GOOD, "q": "\n".join([sentence] * 9)}, 413, "q has 9 lines (sentences), more than this server's limit of 8"),
        ({**GOOD, "q": "x" * 601}, 413, "q has 601 characters, more than this server's limit of 600"),
    ])


def good_request(rng: random.Random, pool: List[str], reference: Dict[str, str]) -> Tuple[Any, Any]:
    """A good request of 1 to 8 sentences, q a string (lines, a blank one sometimes) or a
    list (of one or two lines each): (payload, expected translatedText)."""
    def text() -> List[str]:
        return [rng.choice(pool) for _ in range(rng.randint(1, 2))]

    if rng.random() < 0.5:
        lines = [rng.choice(pool + [""]) for _ in range(rng.randint(1, 8))]
        if not any(lines):
            lines[0] = pool[0]
        return {**GOOD, "q": "\n".join(lines)}, "\n".join(reference[s] for s in lines)
    texts = [text() for _ in range(rng.randint(1, 4))]
    return {**GOOD, "q": ["\n".join(t) for t in texts]}, ["\n".join(reference[s] for s in t) for t in texts]


def client(port: int, seed: int, pool: List[str], reference: Dict[str, str], failures: List[str],
           answered: List[int]) -> None:
    rng = random.Random(seed)
    for i in range(REQUESTS):
        if rng.random() < 0.25:
            payload, status, error = bad_request(rng, rng.choice(pool))
            expected = (status, {"error": error})
        else:
            payload, translated = good_request(rng, pool, reference)
            expected = (200, {"translatedText": translated})
        try:
            reply = post(port, payload)
            got = (reply.status, reply.body)
        except Exception as e:  # a lost request: recorded, the client goes on
            got = ("no answer", repr(e))
        if got != expected:
            failures.append(f"client {seed} request {i}: {payload!r:.200} -> {got!r:.300}, expected {expected!r:.300}")
        answered.append(1)


def test_32_clients_with_bad_requests_among_good_ones(serve, raw_test_set, reference):
    server = serve("--inter-threads", "2", *LIMITS)
    assert post(server.port, {**GOOD, "q": raw_test_set[0]}).status == 200  # warm
    rss_before = server.rss_kib()
    failures: List[str] = []
    answered: List[int] = []
    threads = [threading.Thread(target=client, args=(server.port, seed, raw_test_set, reference, failures, answered))
               for seed in range(CLIENTS)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT * REQUESTS)
    seconds = time.monotonic() - start
    assert not any(thread.is_alive() for thread in threads)
    assert not failures, f"{len(failures)} wrong answers, e.g.\n" + "\n".join(failures[:5])
    assert len(answered) == CLIENTS * REQUESTS
    health = request(server.port, "GET", "/health")
    assert (health.status, health.body["in_flight"], health.body["queued_sentences"]) == (200, 0, 0)
    good = health.body["batched_requests"] - 1  # the warm-up's
    assert good > CLIENTS * REQUESTS / 2 and health.body["batches"] < good  # requests went together
    peak, rss_after = server.rss_kib("VmHWM") / 1024, server.rss_kib() / 1024
    print(f"{CLIENTS * REQUESTS} requests in {seconds:.1f} s, {good} good ones in {health.body['batches'] - 1} "
          f"batches; RSS {rss_before / 1024:.0f} -> {rss_after:.0f} MiB, peak {peak:.0f} MiB")
    assert peak < PEAK_RSS_MIB
    status, log = server.stop()
    assert status == 0, log
