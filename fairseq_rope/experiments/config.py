"""Declarative experiment configs (YAML) → ``fairseq-train`` command lines.

Config format
-------------
One YAML file per experiment, in ``configs/`` (named by its file stem, e.g.
``rope_base``) or anywhere (named by its path)::

    description: what the experiment is, in a sentence or two   # required
    extends: base/wmt14_en_de   # optional: inherit another config's options
    train:                      # fairseq-train options
      arch: transformer_rope_wmt_en_de   # scalar -> --arch transformer_rope_wmt_en_de
      share-all-embeddings: true         # true   -> bare flag --share-all-embeddings
      no-epoch-checkpoints: false        # false or null -> omitted
      some-list-option: [a, b]           # list   -> --some-list-option a b

Keys are fairseq flag names without the leading dashes, spelled as on the
command line (``max-tokens``, not ``max_tokens``). fairseq's own list-valued
options (``--lr``, ``--update-freq``) take one comma-separated value
(``lr: "0.1,0.05"``), not a YAML list; ``adam-betas: "(0.9, 0.98)"`` is a
single string. Note that YAML 1.1 reads ``5e-4`` (no dot) as a *string*; it
reaches fairseq unchanged, so either spelling works.

``extends`` names another config file relative to the extending file's
directory (``.yaml`` optional). The child's ``train`` options override the
parent's key by key (new keys are appended); setting a key to ``false``/null
drops the parent's option. ``description`` is always the child's own.

``save-dir`` and ``user-dir`` are not allowed in configs: the training entry
point (``scripts/train.sh``) sets them.

Command line
------------
``python -m fairseq_rope.experiments.config CONFIG`` prints the config's fairseq-train
arguments one per line (``-0``: NUL-terminated, for ``mapfile -d ''``). With
``--data DATA --save-dir DIR [-- EXTRA...]`` it prints the complete argument
list of ``fairseq-train`` (program name excluded): data, plugin dir, save dir,
config options, then EXTRA, last so that they override the config (argparse
keeps the last occurrence of an option). ``--list`` lists the configs.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import yaml

from fairseq_rope.base import FairseqRopeError, PathLike, PLUGIN_DIR, report_error, split_passthrough

CONFIG_SUFFIX = ".yaml"
DEFAULT_CONFIG_DIR = Path(__file__).resolve().parent / "configs"
TOP_LEVEL_KEYS = frozenset({"description", "extends", "train"})
# Set by the entry point from its own arguments; a config must not redirect them.
RESERVED_OPTIONS = frozenset({"save-dir", "user-dir"})
OPTION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

Scalar = Union[str, int, float]


class ConfigError(FairseqRopeError, ValueError):
    """A config that cannot be found, read or turned into fairseq arguments."""


@dataclass(frozen=True)
class Experiment:
    """A resolved config: ``train`` holds the merged options, in argv order."""

    name: str
    path: Path
    description: str
    train: Dict[str, Any] = field(default_factory=dict)

    def argv(self) -> List[str]:
        """The config's fairseq-train options as command-line arguments."""
        return options_to_argv(self.train)


def available_configs(config_dir: Optional[PathLike] = None) -> List[str]:
    """Names of the experiment configs in ``config_dir`` (shared recipes in subdirectories excluded)."""
    directory = Path(config_dir) if config_dir is not None else DEFAULT_CONFIG_DIR
    return sorted(p.stem for p in directory.glob(f"*{CONFIG_SUFFIX}") if p.is_file())


def _find_config(directory: Path, name: PathLike) -> Optional[Path]:
    """``directory/name.yaml`` or ``directory/name``, if either is a file."""
    named = directory / name
    for path in (named.with_name(named.name + CONFIG_SUFFIX), named):
        if path.is_file():
            return path.resolve()
    return None


def resolve_config(name_or_path: PathLike, config_dir: Optional[PathLike] = None) -> Path:
    """Path of a config given as a file path or as a name in ``config_dir``."""
    if Path(name_or_path).is_file():
        return Path(name_or_path).resolve()
    directory = Path(config_dir) if config_dir is not None else DEFAULT_CONFIG_DIR
    found = _find_config(directory, name_or_path)
    if found is not None:
        return found
    available = ", ".join(available_configs(directory)) or "none"
    raise ConfigError(
        f"unknown config {str(name_or_path)!r}: not a file, nor a config in {directory} "
        f"(available configs: {available})"
    )


def load_experiment(name_or_path: PathLike, config_dir: Optional[PathLike] = None) -> Experiment:
    """Read a config, following its ``extends`` chain."""
    path = resolve_config(name_or_path, config_dir)
    raw = _read_config(path)
    return Experiment(
        name=path.stem,
        path=path,
        description=raw["description"],
        train=_merged_options(path, raw, chain=(path,)),
    )


def _read_config(path: Path) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: invalid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a mapping with 'description' and 'train'")
    unknown = sorted(set(raw) - TOP_LEVEL_KEYS)
    if unknown:
        raise ConfigError(
            f"{path}: unknown top-level key(s) {unknown}; allowed: {sorted(TOP_LEVEL_KEYS)}"
        )
    if not isinstance(raw.get("description"), str) or not raw["description"].strip():
        raise ConfigError(f"{path}: 'description' (a non-empty string) is required")
    train = raw.get("train") or {}
    if not isinstance(train, dict):
        raise ConfigError(f"{path}: 'train' must be a mapping of fairseq-train options")
    for key, value in train.items():
        _check_option(path, key, value)
    return {**raw, "train": train}


def _check_option(path: Path, key: Any, value: Any) -> None:
    if not isinstance(key, str) or not OPTION_NAME.fullmatch(key):
        hint = " (write flag names without the leading dashes)" if str(key).startswith("-") else ""
        raise ConfigError(f"{path}: invalid option name {key!r}{hint}")
    if key in RESERVED_OPTIONS:
        raise ConfigError(f"{path}: '{key}' is set by the training entry point, not by configs")
    if isinstance(value, list):
        if not value or not all(_is_scalar(v) for v in value):
            raise ConfigError(f"{path}: '{key}': a list must hold one or more scalars")
    elif value is not None and not isinstance(value, bool) and not _is_scalar(value):
        raise ConfigError(f"{path}: '{key}': expected a scalar, a boolean or a list, got {value!r}")


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _merged_options(path: Path, raw: Mapping[str, Any], chain: Sequence[Path]) -> Dict[str, Any]:
    """The parent's options (recursively) updated with this config's."""
    parent = raw.get("extends")
    if parent is None:
        return dict(raw["train"])
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'extends' must name one config")
    parent_path = _find_config(path.parent, parent)
    if parent_path is None:
        raise ConfigError(f"{path}: extends {parent!r}, which is not a config in {path.parent}")
    if parent_path in chain:
        cycle = " -> ".join(str(p) for p in (*chain, parent_path))
        raise ConfigError(f"{path}: 'extends' cycle: {cycle}")
    options = _merged_options(parent_path, _read_config(parent_path), (*chain, parent_path))
    options.update(raw["train"])
    return options


def options_to_argv(options: Mapping[str, Any]) -> List[str]:
    """fairseq-train arguments for a mapping of options (see the module docstring)."""
    argv: List[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        argv.append(f"--{key}")
        if value is True:
            continue
        values = value if isinstance(value, list) else [value]
        argv.extend(_format_value(v) for v in values)
    return argv


def _format_value(value: Scalar) -> str:
    # repr gives the shortest round-tripping float (1e-07, 0.0005); str is the same on 3.x.
    return repr(value) if isinstance(value, float) else str(value)


def training_argv(
    experiment: Experiment,
    data: PathLike,
    save_dir: PathLike,
    extra: Sequence[str] = (),
) -> List[str]:
    """Complete ``fairseq-train`` arguments; ``extra`` comes last so it overrides the config."""
    return [
        str(data),
        "--user-dir", str(PLUGIN_DIR),
        "--save-dir", str(save_dir),
        *experiment.argv(),
        *extra,
    ]



def main(argv: Optional[Sequence[str]] = None) -> int:
    own, extra = split_passthrough(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m fairseq_rope.experiments.config",
        description="Print the fairseq-train arguments of an experiment config.",
        epilog="Arguments after '--' are appended to the fairseq-train arguments.",
    )
    parser.add_argument("config", nargs="?", help="config name (see --list) or path to a YAML file")
    parser.add_argument("--config-dir", default=str(DEFAULT_CONFIG_DIR), help="where named configs live")
    parser.add_argument("--data", help="data-bin directory: print the full fairseq-train arguments")
    parser.add_argument("--save-dir", help="checkpoint directory (with --data)")
    parser.add_argument("-0", "--null", action="store_true",
                        help="NUL-terminate arguments instead of newlines")
    parser.add_argument("--list", action="store_true", help="list the available configs and exit")
    args = parser.parse_args(own)

    if args.list:
        for name in available_configs(args.config_dir):
            print(name)
        return 0
    if args.config is None:
        parser.error("a config is required")
    if (args.data is None) != (args.save_dir is None):
        parser.error("--data and --save-dir go together")
    if extra and args.data is None:
        parser.error("extra fairseq-train arguments need --data and --save-dir")
    try:
        experiment = load_experiment(args.config, args.config_dir)
    except ConfigError as e:
        return report_error(e, 2)

    if args.data is None:
        out = experiment.argv()
    else:
        out = training_argv(experiment, args.data, args.save_dir, extra)
    end = "\0" if args.null else "\n"
    sys.stdout.write("".join(a + end for a in out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
