"""The resumable step runner and the chunked worker pool."""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path
from typing import List

import pytest

from fairseq_rope.data.prepare.multiproc import imap_chunks, map_lines
from fairseq_rope.data.prepare.pipeline import Pipeline, Step
from fairseq_rope.data.prepare.text import preprocess_chunk


def _upper(src: Path, calls: List[str], tmps: List[Path]) -> None:
    calls.append(src.name)
    tmps[0].write_text(src.read_text().upper())


def make_step(tmp_path: Path, calls: List[str], **options) -> Step:
    src = tmp_path / "in.txt"
    return Step("upper", partial(_upper, src, calls), [tmp_path / "out" / "up.txt"], [src], options)


def test_rerun_skips_and_changes_redo(tmp_path):
    (tmp_path / "in.txt").write_text("abc\n")
    logs: List[str] = []
    calls: List[str] = []
    pipe = Pipeline(tmp_path, log=logs.append)
    step = make_step(tmp_path, calls, mode="x")
    assert pipe.run_step(step)
    out = tmp_path / "out" / "up.txt"
    assert out.read_text() == "ABC\n"
    mtime = out.stat().st_mtime_ns

    assert not Pipeline(tmp_path, log=logs.append).run_step(step)
    assert logs[-1] == "upper: skip (done)" and out.stat().st_mtime_ns == mtime and calls == ["in.txt"]

    assert pipe.run_step(make_step(tmp_path, calls, mode="y"))  # other options
    (tmp_path / "in.txt").write_text("def\n")  # other input
    assert pipe.run_step(make_step(tmp_path, calls, mode="y"))
    assert out.read_text() == "DEF\n"
    (tmp_path / "in.txt").write_text("def\n")  # touched, same content: nothing to redo
    assert not pipe.run_step(make_step(tmp_path, calls, mode="y"))
    out.unlink()  # a lost output
    assert pipe.run_step(make_step(tmp_path, calls, mode="y"))
    assert len(calls) == 4


def test_interrupted_step_leaves_no_output_and_is_redone(tmp_path):
    (tmp_path / "in.txt").write_text("abc\n")
    out = tmp_path / "out" / "up.txt"

    def crash(tmps: List[Path]) -> None:
        tmps[0].write_text("half")
        raise KeyboardInterrupt

    pipe = Pipeline(tmp_path, log=lambda _: None)
    with pytest.raises(KeyboardInterrupt):
        pipe.run_step(Step("upper", crash, [out], [tmp_path / "in.txt"]))
    assert not out.exists() and not (tmp_path / "out" / "up.txt.tmp").exists()
    assert not pipe.is_done(make_step(tmp_path, []))
    calls: List[str] = []
    assert pipe.run_step(make_step(tmp_path, calls))
    assert calls == ["in.txt"] and out.read_text() == "ABC\n"


def test_stale_temp_files_of_a_killed_run_are_replaced(tmp_path):
    (tmp_path / "in.txt").write_text("abc\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "up.txt.tmp").write_text("garbage from a killed run")
    Pipeline(tmp_path, log=lambda _: None).run_step(make_step(tmp_path, []))
    assert (tmp_path / "out" / "up.txt").read_text() == "ABC\n"
    assert not (tmp_path / "out" / "up.txt.tmp").exists()


def test_chunked_map_is_independent_of_workers_and_chunk_size(tmp_path):
    src = tmp_path / "in.en"
    src.write_text("".join(f"Line {i}: state-of-the-art, \"quoted\" text.\n" for i in range(103)))
    outputs = []
    for workers, chunk in [(1, 10_000), (2, 7), (3, 1)]:
        dest = tmp_path / f"out-{workers}"
        assert map_lines(partial(preprocess_chunk, lang="en"), src, dest, workers=workers, chunk_lines=chunk) == 103
        outputs.append(dest.read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0].decode().split("\n")[5] == 'Line 5 : state @-@ of @-@ the @-@ art , " quoted " text .'
    assert [len(c) for c in imap_chunks(list, src, workers=2, chunk_lines=50)] == [50, 50, 3]


def test_map_lines_rejects_functions_that_break_alignment(tmp_path):
    src = tmp_path / "in.en"
    src.write_text("a\nb\n")
    with pytest.raises(RuntimeError, match="alignment"):
        map_lines(_drop_first, src, tmp_path / "out", workers=1)


def _drop_first(lines):
    return list(lines[1:])


def test_a_second_run_on_the_same_directory_waits_for_the_first(tmp_path):
    """Parallel training runs of one scale all prepare its data first: the later ones wait
    (then find the steps done) instead of failing."""
    waiting, acquired = threading.Event(), threading.Event()

    def second() -> None:
        with Pipeline(tmp_path, log=lambda message: waiting.set() if "waiting" in message else None).lock():
            acquired.set()

    with Pipeline(tmp_path, log=lambda _: None).lock():
        thread = threading.Thread(target=second)
        thread.start()
        assert waiting.wait(timeout=60)  # the second found the lock held ...
        assert not acquired.is_set()  # ... and does not hold it while the first does
    thread.join(timeout=60)
    assert acquired.is_set()
