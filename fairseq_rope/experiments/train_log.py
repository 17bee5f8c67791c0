"""A run's ``train.log``: what ``scripts/train.sh`` and fairseq-train (``--log-format
simple``) wrote there over all of the run's invocations, read back.

Each invocation of train.sh appends two lines of its own, then fairseq's log:

- ``# DATE HOST in CWD: fairseq-train ARGS`` (:data:`HEADER_PREFIX`);
- ``# provenance {JSON}`` (:data:`PROVENANCE_PREFIX`, from 2026-11-25 on): what it trained with,
  :data:`PROVENANCE_KEYS`, the keys a run's ``run.json`` keeps them under.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional

PROGRAM = "fairseq-train"
LOG_FILE = "train.log"
HEADER_PREFIX = "# "
PROVENANCE_PREFIX = "# provenance "
PROVENANCE_KEYS = ("train_threads", "train_cpu", "code_commit", "train_device")
LOG_RECORD = re.compile(r"\| (train|valid) \| epoch \d+ \| (.*)$")
DONE_TRAINING = re.compile(r"\| done training in ([\d.]+) seconds")
# fairseq's line after it saved (and copied) a checkpoint: the update it holds.
SAVED_CHECKPOINT = re.compile(r"\| Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates")


@dataclass
class TrainLog:
    """What fairseq-train's log (``--log-format simple``) says about a run."""

    epoch_wps: Dict[int, float] = field(default_factory=dict)  # num_updates -> an epoch summary's wps
    # fairseq-train's "done training in X seconds", one per completed invocation.
    # (Its `wall` field restarts at 0 when a run resumes, so it is not used.)
    training_seconds: List[float] = field(default_factory=list)
    num_updates: Optional[int] = None
    valid_loss: Dict[int, float] = field(default_factory=dict)  # num_updates -> loss
    valid_bleu: Dict[int, float] = field(default_factory=dict)  # num_updates -> --eval-bleu's BLEU
    # One per train.sh invocation (its header line): PROVENANCE_KEYS as far as it recorded them.
    invocations: List[Dict[str, Any]] = field(default_factory=list)

    def full_epoch_wps(self, upto: Optional[int] = None) -> List[float]:
        """The epoch summaries' wps to update ``upto``, without epochs cut short.

        An epoch of fewer than half the updates of the longest (a run stopping at ``--max-update``
        a few updates into one) is timed mostly on what every epoch pays once, its validation
        and checkpoint among them: the demo's last epoch of 3 updates reads 13,725 wps, its 21
        full epochs 27,018-29,856 (sinusoidal seed 1, 2026-11-26).
        """
        ends = sorted(end for end in self.epoch_wps if upto is None or end <= upto)
        updates = {end: end - start for start, end in zip([0] + ends, ends)}
        longest = max(updates.values(), default=0)
        return [self.epoch_wps[end] for end in ends if 2 * updates[end] >= longest]


def read_train_log(save_dir: Path) -> TrainLog:
    return parse_train_log((save_dir / LOG_FILE).read_text(encoding="utf-8").splitlines())


def parse_train_log(lines: Iterable[str]) -> TrainLog:
    """Epoch summaries and validations of a fairseq-train log (appended to across resumes).

    ``train | epoch ...`` lines give wps and num_updates; ``valid | epoch
    ... | valid on 'valid' subset | loss X | ... | num_updates N`` lines the
    validation loss at update N, and with ``--eval-bleu`` its valid BLEU (a later
    line for the same update wins);
    ``done training in X seconds`` the training time of each invocation; train.sh's header
    line and provenance line (written by :func:`fairseq_rope.experiments.training.record_run`) what
    each invocation trained with (the device alone, from ``--cpu``, for headers older than
    provenance lines).
    """
    log = TrainLog()
    for line in lines:
        if line.startswith(PROVENANCE_PREFIX) and log.invocations:
            log.invocations[-1].update(json.loads(line[len(PROVENANCE_PREFIX):]))
            continue
        if line.startswith(HEADER_PREFIX):
            command = line.partition(f": {PROGRAM} ")[2].split()
            log.invocations.append({"train_device": "cpu"} if "--cpu" in command else {})
            continue
        done = DONE_TRAINING.search(line)
        if done is not None:
            log.training_seconds.append(float(done.group(1)))
        m = LOG_RECORD.search(line.rstrip("\n"))
        if m is None:
            continue
        fields = dict(part.split(" ", 1) for part in m.group(2).split(" | ") if " " in part)
        if "num_updates" not in fields:
            continue
        updates = int(fields["num_updates"])
        log.num_updates = max(updates, log.num_updates or 0)
        if m.group(1) == "train":
            if "wps" in fields:
                log.epoch_wps[updates] = float(fields["wps"])
        elif fields.get("valid") in (None, "on 'valid' subset") and "loss" in fields:
            log.valid_loss[updates] = float(fields["loss"])
            if "bleu" in fields:
                log.valid_bleu[updates] = float(fields["bleu"])
    return log


def logged_provenance(log: TrainLog) -> Dict[str, Any]:
    """What the run's training invocations trained with (PROVENANCE_KEYS): per key, the value of
    every invocation that recorded it, or their distinct values joined by " + " where they
    differ (a run resumed on other hardware or code), None where none did; and how many of its
    invocations recorded all of them, of how many."""
    merged: Dict[str, Any] = {}
    for key in PROVENANCE_KEYS:
        distinct = list(dict.fromkeys(i[key] for i in log.invocations if i.get(key) is not None))
        merged[key] = None if not distinct else distinct[0] if len(distinct) == 1 else " + ".join(map(str, distinct))
    merged["train_invocations"] = len(log.invocations)
    merged["train_invocations_recorded"] = sum(
        all(i.get(key) is not None for key in PROVENANCE_KEYS) for i in log.invocations)
    return merged
