"""Training runs: ``scripts/train.sh`` / ``fairseq-rope-train``.

``fairseq-rope-train [--force] CONFIG DATA_BIN SAVE_DIR [EXTRA...]`` checks
everything that can be checked before fairseq starts, and only then writes
``SAVE_DIR/command.txt`` and a header and a provenance line in ``SAVE_DIR/train.log``, runs
fairseq-train with the config's options followed by EXTRA (so EXTRA overrides
them) and appends fairseq's log to ``train.log`` while showing it. A failed
check exits with status 2 and an ``error:`` line naming the culprit, having
created or changed nothing:

- CONFIG must be a config (see :mod:`fairseq_rope.experiments.config`);
- DATA_BIN must be a readable fairseq-preprocess directory: ``dict.*.txt`` and
  the binarized training and validation splits (``SPLIT.*.idx`` + ``.bin``);
- SAVE_DIR must not hold checkpoints of a *different* run.

Same run
--------
Rerunning ``train.sh`` unchanged resumes from ``SAVE_DIR/checkpoint_last.pt``
(fairseq restores model, optimizer, lr schedule, data iterator position and
RNG seeds). A run is identified by its resolved fairseq-train command, recorded
in ``command.txt``: the same data-bin (as a resolved path) and the same options
after the config is expanded, except the options that only say how long to
train and how often to validate, save and log (:data:`SCHEDULE_OPTIONS`), so
that e.g. ``--max-update 200000`` continues a finished run. Editing a config's
comments changes nothing; changing one of its options does. When the
difference is intended (resuming with another ``--update-freq`` on other
hardware, say), ``--force`` continues from the checkpoints with the new
arguments, which become the recorded command. A SAVE_DIR with checkpoints but
no ``command.txt`` (made by fairseq-train directly) needs ``--force`` too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from fairseq_rope import base
from fairseq_rope.base import FairseqRopeError, report_error, split_passthrough
from fairseq_rope.experiments.config import DEFAULT_CONFIG_DIR, ConfigError, load_experiment, training_argv
from fairseq_rope.experiments.command import COMMAND_FILE, last_value, parse_command, read_command
from fairseq_rope.experiments.convergence import StopAtConvergence, describe
from fairseq_rope.experiments.train_log import HEADER_PREFIX, LOG_FILE, PROGRAM, PROVENANCE_KEYS, PROVENANCE_PREFIX

# Options that may differ between the runs of one SAVE_DIR: when to stop, and
# how often to validate, save and log. None of them changes the model, the
# data or the update rule, so a run continued with other values is the same run.
SCHEDULE_OPTIONS = frozenset({
    "max-update", "max-epoch", "stop-time-hours", "stop-min-lr", "patience",
    "save-interval", "save-interval-updates", "keep-interval-updates", "keep-last-epochs",
    "keep-best-checkpoints", "no-epoch-checkpoints", "validate-interval",
    "validate-interval-updates", "log-interval", "log-format", "log-file",
    "tensorboard-logdir", "wandb-project", "no-progress-bar", "num-workers",
})
# Set by train.sh from its own arguments; the plugin's path moves with the repository;
# how processes find each other (docs/distributed.md) changes with every job; a run
# preempted on one device may resume on another (its record names the device).
UNCOMPARED_OPTIONS = frozenset({
    "save-dir", "user-dir", "distributed-port", "distributed-init-method",
    "distributed-rank", "device-id", "distributed-no-spawn", "cpu",
})
HINT = ("use another SAVE_DIR for a new run, rerun with the recorded command (SAVE_DIR/command.txt) "
        "to resume this one, or pass --force to continue from its checkpoints with the new arguments")

class TrainingError(FairseqRopeError, ValueError):
    """Bad input to train.sh, reported before anything is written."""


# --- DATA_BIN


def check_data_bin(data: str, argv: Sequence[str]) -> None:
    """Raise unless every ``:``-separated path of ``data`` is a readable, complete data-bin."""
    _, options = parse_command(argv)
    subsets = [last_value(options, "train-subset", "train")]
    if "disable-validation" not in options:
        subsets += last_value(options, "valid-subset", "valid").split(",")
    for path in map(Path, data.split(":")):  # fairseq's sharded data: one data-bin per epoch
        _check_one_data_bin(path, subsets)


def _check_one_data_bin(path: Path, subsets: Sequence[str]) -> None:
    fix = "(DATA_BIN is the data-bin/ directory written by scripts/prepare_parallel.sh or " \
          "scripts/prepare_wmt14_en_de.sh)"
    if not path.is_dir():
        what = "not a directory" if path.exists() else "no such directory"
        raise TrainingError(f"DATA_BIN {path}: {what} {fix}")
    if not os.access(path, os.R_OK | os.X_OK):
        raise TrainingError(f"DATA_BIN {path}: not readable (check its permissions)")
    if not list(path.glob("dict.*.txt")):
        raise TrainingError(f"DATA_BIN {path}: no dictionary (dict.*.txt); not a fairseq-preprocess output? {fix}")
    for subset in subsets:
        indexes = list(path.glob(f"{subset}.*.idx"))
        missing = [p.with_suffix(".bin").name for p in indexes if not p.with_suffix(".bin").is_file()]
        if not indexes or missing:
            detail = f"{', '.join(missing)} missing" if missing else f"no {subset}.*.idx/.bin files"
            raise TrainingError(f"DATA_BIN {path}: the binarized {subset!r} split is incomplete "
                                f"({detail}); rerun the preparation that wrote it {fix}")
        unreadable = [p.name for p in indexes if not os.access(p, os.R_OK)
                      or not os.access(p.with_suffix(".bin"), os.R_OK)]
        if unreadable:
            raise TrainingError(f"DATA_BIN {path}: {', '.join(unreadable)} not readable (check permissions)")


def check_options(argv: Sequence[str]) -> None:
    """Parse ``argv`` as fairseq-train will, architecture defaults and the plugin's option
    checks included, so that a misspelt or invalid option fails before SAVE_DIR exists."""
    from fairseq import options

    try:
        options.parse_args_and_arch(options.get_training_parser(), input_args=list(argv))
    except SystemExit:  # argparse has printed the usage and what is wrong
        raise TrainingError("fairseq-train does not accept these options (see the message above)") from None
    except ValueError as e:
        raise TrainingError(f"invalid option: {e}") from None


# --- SAVE_DIR: same run or not


def _resolved_data(data: str, cwd: str) -> str:
    return ":".join(os.path.realpath(os.path.join(cwd, part)) for part in data.split(":"))


def run_differences(recorded: Sequence[str], recorded_cwd: str, new: Sequence[str], new_cwd: str) -> List[str]:
    """What makes ``new`` another run than ``recorded`` (fairseq-train arguments), one line each."""
    (old_pos, old_opts), (new_pos, new_opts) = parse_command(recorded), parse_command(new)
    old_pos = [_resolved_data(old_pos[0], recorded_cwd), *old_pos[1:]] if old_pos else []
    new_pos = [_resolved_data(new_pos[0], new_cwd), *new_pos[1:]] if new_pos else []
    diffs = [] if old_pos == new_pos else [f"data: {' '.join(old_pos)} -> {' '.join(new_pos)}"]
    for name in sorted((set(old_opts) | set(new_opts)) - SCHEDULE_OPTIONS - UNCOMPARED_OPTIONS):
        before, after = old_opts.get(name), new_opts.get(name)
        if before != after:
            diffs.append(f"--{name}: {_show(before)} -> {_show(after)}")
    return diffs


def _show(values: Optional[Tuple[str, ...]]) -> str:
    if values is None:
        return "(not given)"
    return " ".join(shlex.quote(v) for v in values) if values else "(flag set)"


def check_save_dir(save_dir: Path, argv: Sequence[str], cwd: str, force: bool) -> None:
    """Raise if ``save_dir`` cannot be written, or holds checkpoints of another run (unless ``force``)."""
    if save_dir.exists() and not save_dir.is_dir():
        raise TrainingError(f"SAVE_DIR {save_dir}: exists and is not a directory")
    existing = save_dir if save_dir.exists() else next(p for p in save_dir.parents if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise TrainingError(f"SAVE_DIR {save_dir}: {existing} is not writable")
    checkpoints = sorted(p.name for p in save_dir.glob("checkpoint*.pt")) if save_dir.is_dir() else []
    if not checkpoints or force:
        return
    try:
        recorded_cwd, recorded = read_command(save_dir)
    except (OSError, IndexError, ValueError) as e:
        raise TrainingError(
            f"SAVE_DIR {save_dir} holds checkpoints ({checkpoints[0]}, ...) but no readable "
            f"{COMMAND_FILE} ({e}), so it cannot tell whether they are of this run; {HINT}") from None
    diffs = run_differences(recorded, recorded_cwd, argv, cwd)
    if diffs:
        raise TrainingError(
            f"SAVE_DIR {save_dir} holds checkpoints of a different run (recorded in "
            f"{save_dir / COMMAND_FILE}); it differs in:\n  " + "\n  ".join(diffs) + f"\n{HINT}")


def training_provenance(argv: Sequence[str]) -> Dict[str, Any]:
    """What this invocation's speed and numbers depend on beyond its command (keys:
    :data:`PROVENANCE_KEYS`): fairseq-train inherits this process's threads
    (OMP_NUM_THREADS) and visible GPUs, and runs the plugin it imports, so they are its own."""
    import torch

    _, options = parse_command(argv)
    on_gpu = "cpu" not in options and torch.cuda.is_available()  # else fairseq trains on the CPU
    return dict(zip(PROVENANCE_KEYS, (
        torch.get_num_threads(), base.cpu_model(), base.git_commit(),
        torch.cuda.get_device_name(0) if on_gpu else "cpu")))


def record_run(save_dir: Path, argv: Sequence[str], cwd: str) -> None:
    """Write ``command.txt`` (the latest run's command), and a header line and a provenance
    line (:func:`training_provenance`, JSON) for this invocation in ``train.log``: a run
    resumed across sessions and machines keeps what each of its invocations trained with."""
    command = shlex.join([PROGRAM, *argv])
    base.write_text(save_dir / COMMAND_FILE, f"{shlex.join(['cd', cwd])}\n{command}\n")
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    provenance = json.dumps(training_provenance(argv), sort_keys=True)
    with open(save_dir / LOG_FILE, "a", encoding="utf-8") as log:
        log.write(f"{HEADER_PREFIX}{stamp} {socket.gethostname()} in {cwd}: {command}\n")
        log.write(f"{PROVENANCE_PREFIX}{provenance}\n")


USAGE = "[--force] [--config-dir DIR] CONFIG DATA_BIN SAVE_DIR [extra fairseq-train args...]"


def parse_command_line(argv: Sequence[str]) -> Tuple[argparse.Namespace, List[str]]:
    """``[--force] [--config-dir DIR] CONFIG DATA_BIN SAVE_DIR [--] [EXTRA...]``: (own, extra).

    Everything after the three positionals goes to fairseq-train, as the shell
    script always took it (a ``--`` before it is optional).
    """
    own, extra = split_passthrough(argv)
    if not extra:
        i = 0
        while i < len(own) and own[i] in ("--force", "--config-dir"):
            i += 1 if own[i] == "--force" else 2
        own, extra = own[:i + 3], own[i + 3:]
    parser = argparse.ArgumentParser(
        prog="fairseq-rope-train", usage=f"%(prog)s {USAGE}",
        description="Train an experiment config with fairseq-train; rerun unchanged to resume.",
    )
    parser.add_argument("--force", action="store_true",
                        help="continue from SAVE_DIR's checkpoints even if they are of a different run")
    parser.add_argument("--config-dir", default=str(DEFAULT_CONFIG_DIR), help="where named configs live")
    parser.add_argument("config")
    parser.add_argument("data_bin")
    parser.add_argument("save_dir")
    return parser.parse_args(own), extra


def check_run(args: argparse.Namespace, extra: Sequence[str]) -> List[str]:
    """Check everything that can be checked before fairseq starts; returns the fairseq-train
    arguments. Nothing is written if a check fails (SAVE_DIR is created if they all pass)."""
    if "--force" in extra:  # fairseq-train would reject it, after the checks said "different run"
        raise TrainingError("--force goes before CONFIG: train.sh --force CONFIG DATA_BIN SAVE_DIR ...")
    cwd = os.getcwd()
    train_argv = training_argv(load_experiment(args.config, args.config_dir), args.data_bin, args.save_dir, extra)
    check_data_bin(args.data_bin, train_argv)
    check_options(train_argv)
    check_save_dir(Path(args.save_dir), train_argv, cwd, args.force)
    Path(args.save_dir).mkdir(parents=True, exist_ok=True)
    return train_argv


def run_logged(command: Sequence[str], log: Path, stop: Optional[StopAtConvergence] = None) -> int:
    """Run ``command``, showing its output and appending it to ``log`` (like ``| tee -a``);
    ``stop``: end it (status 0) where the run's convergence rule stops it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # progress as it happens, despite the pipe
    with open(log, "ab") as f, subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                env=env) as process:
        for line in process.stdout:
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            f.write(line)
            f.flush()
            converged = stop.after(line.decode("utf-8", "replace")) if stop is not None else None
            if converged is not None:
                message = f"train.sh stopped {PROGRAM}: {describe(converged, stop.rule)}\n"
                sys.stdout.write(message)
                f.write(message.encode())
                process.terminate()
                process.wait()
                return 0
    return process.returncode


def checked(argv: Sequence[str]) -> Tuple[argparse.Namespace, Optional[List[str]]]:
    """Parse, check and record: (arguments, fairseq-train arguments), the latter None
    (the error shown) when a check failed."""
    args, extra = parse_command_line(argv)
    try:
        train_argv = check_run(args, extra)
    except (ConfigError, TrainingError) as e:
        report_error(e)
        return args, None
    record_run(Path(args.save_dir), train_argv, os.getcwd())
    return args, train_argv


def check(argv: Sequence[str]) -> int:
    """What :func:`main` does before fairseq-train starts, and no more: the fairseq-train
    arguments are printed NUL-terminated instead (for a script that runs fairseq-train itself)."""
    _, train_argv = checked(argv)
    if train_argv is None:
        return 2
    sys.stdout.write("".join(a + "\0" for a in train_argv))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``scripts/train.sh`` / ``fairseq-rope-train``: check, record, then run fairseq-train.

    ``$LAUNCHER``, if set, runs fairseq-train under a launcher, split on whitespace, e.g.
    ``LAUNCHER="torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d ..."``
    (torchrun takes the script's path, not a command name; see docs/distributed.md).
    """
    args, extra = parse_command_line(sys.argv[1:] if argv is None else argv)
    try:
        train_argv = check_run(args, extra)
    except (ConfigError, TrainingError) as e:
        report_error(e)
        return 2
    save_dir = Path(args.save_dir)
    stop = StopAtConvergence.of_run(save_dir, train_argv)
    converged = stop.converged()
    if converged is not None:
        print(f"{save_dir}: {describe(converged, stop.rule)}; nothing to train", file=sys.stderr)
        return 0
    record_run(save_dir, train_argv, os.getcwd())
    launcher = shlex.split(os.environ.get("LAUNCHER", ""))
    return run_logged([*launcher, *base.fairseq_command(PROGRAM), *train_argv], save_dir / LOG_FILE, stop)


if __name__ == "__main__":
    sys.exit(main())
