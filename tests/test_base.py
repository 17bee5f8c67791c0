"""Provenance helpers of fairseq_rope.base: the commit and CPU a result was measured with."""

from __future__ import annotations

import re
import subprocess

from fairseq_rope import base


def test_git_commit_names_the_checkout_and_says_when_it_is_modified(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "fairseq_rope").mkdir(parents=True)
    tracked = repo / "fairseq_rope" / "rotary.py"
    tracked.write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    monkeypatch.setattr(base, "PLUGIN_DIR", repo / "fairseq_rope")
    commit = base.git_commit()
    assert commit is not None and re.fullmatch(r"[0-9a-f]{40}", commit)
    (repo / "fairseq_rope" / "untracked.py").write_text("")
    assert base.git_commit() == commit  # untracked files are not the code that ran
    tracked.write_text("x = 2\n")
    assert base.git_commit() == f"{commit} (modified)"
    monkeypatch.setattr(base, "PLUGIN_DIR", tmp_path)  # no checkout (an installed wheel)
    assert base.git_commit() is None


def test_cpu_model_and_cores():
    assert base.cpu_model() and base.usable_cores() >= 1


def test_portable_writes_paths_under_the_root_relative_to_it(tmp_path):
    root = tmp_path / "checkout"
    text = (f"fairseq-train {root}/work/data-bin --save-dir '{root}/work/run' --user-dir {root} "
            f"--restore-file {tmp_path}/elsewhere/ckpt.pt --data {root}:{root}x/y")
    assert base.portable(text, root) == (
        f"fairseq-train work/data-bin --save-dir 'work/run' --user-dir . "
        f"--restore-file {tmp_path}/elsewhere/ckpt.pt --data .:{root}x/y")


def test_command_line_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert base.command_line("scripts/x.py", [str(tmp_path / "runs" / "a"), "--out", "/elsewhere/b"]) == \
        "scripts/x.py runs/a --out /elsewhere/b"
