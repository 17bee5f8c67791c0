"""fairseq-train command lines read as argparse reads them: the harness's one parser."""

from __future__ import annotations

import pytest

from fairseq_rope.experiments.command import option_value, parse_command, read_command


def test_options_are_read_as_argparse_reads_them():
    argv = ["data-bin", "--arch=a", "--lr", "1e-3", "--adam-betas", "(0.9,", "0.98)", "--cpu",
            "--arch", "b", "--patience=3"]
    positional, options = parse_command(argv)
    assert positional == ["data-bin"]
    assert options["adam-betas"] == ("(0.9,", "0.98)") and options["cpu"] == ()
    assert options["arch"] == ("b",) and option_value(argv, "arch") == "b"  # the last one wins, either spelling
    assert option_value(argv, "patience") == "3" and option_value(argv, "cpu") is None
    assert option_value(argv, "max-update") is None


def test_read_command_takes_the_recorded_fairseq_train_line(tmp_path):
    (tmp_path / "command.txt").write_text("cd '/a dir'\nfairseq-train bin --arch 'x y'\n")
    assert read_command(tmp_path) == ("/a dir", ["bin", "--arch", "x y"])
    (tmp_path / "command.txt").write_text("cd /a\npython train.py bin\n")
    with pytest.raises(ValueError, match="not a 'cd DIR' line followed by a fairseq-train command"):
        read_command(tmp_path)
