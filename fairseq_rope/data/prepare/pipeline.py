"""Resumable steps: atomic outputs plus a completion marker keyed on the inputs.

A step writes each output to a temporary sibling (``NAME.tmp``) and renames it
into place only once the whole step has succeeded, then writes
``OUT_DIR/.done/STEP.done``. The marker holds a SHA-256 of the step's name,
options and the contents of its input files. A rerun skips a step whose marker
matches and whose outputs all exist; anything else (an interrupted run,
changed options, an edited input) runs the step again, and every step
downstream whose inputs then change. Keying on contents rather than mtimes
means archives moved to another ``--raw-dir`` or a redone step with identical
output do not trigger hours of needless work. Content hashes are cached in
``OUT_DIR/.done/hashes.json`` by path, size and mtime, so a rerun hashes only
files that changed; the cache is saved only when a step runs or a run ends,
so a refused run changes nothing. Worker counts are deliberately not part of
the key: outputs do not depend on them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence

#: Bump to invalidate every marker when what a step produces changes.
PIPELINE_VERSION = 1


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's contents."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Step:
    """One unit of work of the pipeline.

    ``run`` receives the temporary paths to write, in the order of ``outputs``
    (files, or directories it must create).
    """

    name: str
    run: Callable[[List[Path]], None]
    outputs: Sequence[Path]
    inputs: Sequence[Path] = ()
    options: Mapping[str, Any] = field(default_factory=dict)


def _tmp_path(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


class Pipeline:
    """Runs :class:`Step` objects in order inside ``out_dir``."""

    def __init__(self, out_dir: Path, log: Callable[[str], None] = print) -> None:
        self.out_dir = Path(out_dir)
        self.state_dir = self.out_dir / ".done"
        self.log = log
        self._hash_cache = self.state_dir / "hashes.json"
        self._hashes = self._load_hashes()
        self._hashes_changed = False

    def _load_hashes(self) -> Dict[str, List[Any]]:
        try:
            return json.loads(self._hash_cache.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def content_hash(self, path: Path) -> Optional[str]:
        """SHA-256 of ``path`` (None if it does not exist), cached by path, size and mtime."""
        path = Path(path).resolve()
        if not path.is_file():  # the step itself reports missing or odd inputs, clearly
            return None
        st = path.stat()
        stamp = [st.st_size, st.st_mtime_ns]
        cached = self._hashes.get(str(path))
        if cached and cached[:2] == stamp:
            return cached[2]
        try:
            digest = sha256_file(path)
        except OSError:  # unreadable: likewise for the step to report
            return None
        self._hashes[str(path)] = stamp + [digest]
        self._hashes_changed = True
        return digest

    def _save_hashes(self) -> None:
        if not self._hashes_changed:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_path(self._hash_cache)
        tmp.write_text(json.dumps(self._hashes, indent=0, sort_keys=True), encoding="utf-8")
        os.replace(tmp, self._hash_cache)
        self._hashes_changed = False

    def key(self, step: Step) -> str:
        """Fingerprint of everything a step's outputs depend on."""
        payload = {
            "version": PIPELINE_VERSION,
            "step": step.name,
            "options": dict(step.options),
            "inputs": [[Path(p).name, self.content_hash(p)] for p in step.inputs],
        }
        blob = json.dumps(payload, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()

    def _marker(self, step: Step) -> Path:
        return self.state_dir / (step.name.replace("/", "_").replace(" ", "_") + ".done")

    def _recorded_key(self, step: Step) -> Optional[str]:
        try:
            return json.loads(self._marker(step).read_text(encoding="utf-8"))["key"]
        except (OSError, ValueError, KeyError):
            return None

    def is_done(self, step: Step) -> bool:
        """Whether ``step`` finished with the current inputs and its outputs are all there."""
        recorded = self._recorded_key(step)
        if recorded is None or recorded != self.key(step):
            return False
        return all(Path(p).exists() for p in step.outputs)

    def has_finished(self, step: Step) -> bool:
        """Whether ``step`` finished once, whatever its inputs were."""
        return self._recorded_key(step) is not None

    def first_changed(self, steps: Sequence[Step]) -> Optional[Step]:
        """The first of ``steps`` that finished with other inputs or options than it has now.

        A step whose outputs were merely lost is not "changed": rerunning it is a resume.
        """
        for step in steps:
            recorded = self._recorded_key(step)
            if recorded is not None and recorded != self.key(step):
                return step
        return None

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Hold an exclusive lock on ``out_dir``: two runs would overwrite each other's temp
        files. A second run waits for the first, then finds its steps done: several training
        runs of one scale (on one GPU, or several) may all start by preparing the same data."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.state_dir / "lock", "a") as f:  # "a": a no-op rerun changes no mtime
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.log(f"waiting for another preparation in {self.out_dir} to finish")
                fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def run(self, steps: Sequence[Step]) -> None:
        """Run (or skip) ``steps`` in order; stop at the first failure."""
        for i, step in enumerate(steps, start=1):
            self.run_step(step, f"[{i}/{len(steps)}]")
        self._save_hashes()

    def run_step(self, step: Step, prefix: str = "") -> bool:
        """Run ``step`` unless it is done; return whether it ran."""
        label = f"{prefix} {step.name}".strip()
        if self.is_done(step):
            self.log(f"{label}: skip (done)")
            return False
        self.log(f"{label}: running")
        start = time.monotonic()
        # Keyed on the inputs as they were when the step read them: an input
        # modified while the step runs makes the next run redo it.
        key = self.key(step)
        self._save_hashes()
        marker = self._marker(step)
        marker.unlink(missing_ok=True)
        outputs = [Path(p) for p in step.outputs]
        tmps = [_tmp_path(p) for p in outputs]
        for path in tmps:  # leftovers of an interrupted run
            _remove(path)
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            step.run(tmps)
            for tmp, out in zip(tmps, outputs):
                if not tmp.exists():
                    raise RuntimeError(f"step {step.name!r} did not write {out}")
        except BaseException:
            for path in tmps:
                _remove(path)
            raise
        for tmp, out in zip(tmps, outputs):
            if out.is_dir():
                shutil.rmtree(out)
            os.replace(tmp, out)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        record: Dict[str, Any] = {
            "step": step.name,
            "key": key,
            "options": dict(step.options),
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        tmp_marker = _tmp_path(marker)
        tmp_marker.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp_marker, marker)
        self.log(f"{label}: done in {time.monotonic() - start:.1f}s")
        return True
