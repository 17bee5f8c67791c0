"""The RoPE, RPE and ALiBi architectures: registered names and defaults are frozen.

Existing checkpoints store ``--arch`` and the args it filled; existing commands
name the architectures. ``architecture_defaults.json`` holds, for every
architecture of the two models, the model args after the architecture has run
on an empty command line. It was written by this module's ``__main__`` from the
hand-written architecture functions, before they became tables; rerun it only
for an intended change of defaults:

    OMP_NUM_THREADS=1 .venv/bin/python -m tests.models.test_architectures
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Dict

import pytest
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_NAME_REGISTRY, ARCH_MODEL_REGISTRY

import fairseq_rope.models  # noqa: F401  (registers the models and their architectures)
from fairseq_rope.models.architectures import Architecture, register_architectures
from fairseq_rope.models.transformer_alibi import ALIBI_ARCHITECTURES
from fairseq_rope.models.transformer_rope import ROPE_ARCHITECTURES, ROPE_OPTIONS
from fairseq_rope.models.transformer_rpe import RPE_ARCHITECTURES
from tests.conftest import parse_train_args

GOLDEN = Path(__file__).with_name("architecture_defaults.json")
MODELS = ("transformer_rope", "transformer_rpe", "transformer_alibi")


def registered_architectures() -> Dict[str, str]:
    """architecture name → model name, for the plugin's models."""
    return {arch: model for arch, model in ARCH_MODEL_NAME_REGISTRY.items() if model in MODELS}


def model_args(arch: str, *argv: str) -> argparse.Namespace:
    """The model args of ``--arch arch *argv``, built as fairseq's parse_args_and_arch
    builds them: the model's options in a group whose unset options are left out
    (argparse.SUPPRESS), then the architecture function."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    ARCH_MODEL_REGISTRY[arch].add_args(parser.add_argument_group(argument_default=argparse.SUPPRESS))
    args = parser.parse_args(list(argv))
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


def as_json(args: argparse.Namespace) -> Dict[str, str]:
    """Each value as JSON text: 1, 1.0 and true then differ, as they do in a checkpoint."""
    return {name: json.dumps(value) for name, value in sorted(vars(args).items())}


def current_defaults() -> Dict[str, Dict[str, object]]:
    return {arch: dict(sorted(vars(model_args(arch)).items())) for arch in sorted(registered_architectures())}


# --------------------------------------------------------------------- tests

REGISTERED = {  # as registered by the hand-written functions, before the tables
    "transformer_rope": "transformer_rope",
    "transformer_rope_wmt_en_de": "transformer_rope",
    "transformer_rope_wmt_en_de_big": "transformer_rope",
    "transformer_rope_iwslt_de_en": "transformer_rope",
    "transformer_rope_tiny": "transformer_rope",
    "transformer_rpe": "transformer_rpe",
    "transformer_rpe_wmt_en_de": "transformer_rpe",
    "transformer_rpe_wmt_en_de_big": "transformer_rpe",
    "transformer_rpe_tiny": "transformer_rpe",
    # ALiBi (issue 28), added after the tables
    "transformer_alibi": "transformer_alibi",
    "transformer_alibi_wmt_en_de": "transformer_alibi",
    "transformer_alibi_wmt_en_de_big": "transformer_alibi",
    "transformer_alibi_iwslt_de_en": "transformer_alibi",
    "transformer_alibi_tiny": "transformer_alibi",
}


def golden() -> Dict[str, Dict[str, object]]:
    return json.loads(GOLDEN.read_text())


def golden_json(arch: str, **changed: object) -> Dict[str, str]:
    return as_json(argparse.Namespace(**{**golden()[arch], **changed}))


def test_the_registered_architectures_are_exactly_the_frozen_ones():
    assert registered_architectures() == REGISTERED
    assert sorted(golden()) == sorted(REGISTERED)
    assert [*ROPE_ARCHITECTURES, *RPE_ARCHITECTURES, *ALIBI_ARCHITECTURES] == [*REGISTERED]  # the tables, in order


@pytest.mark.parametrize("arch", sorted(REGISTERED))
def test_defaults_of_an_empty_command_line_are_the_frozen_ones(arch):
    assert as_json(model_args(arch)) == golden_json(arch)


@pytest.mark.parametrize("arch", sorted(REGISTERED))
def test_fairseq_train_parser_gives_the_same_model_args(dict_dir, arch):
    """model_args builds args as fairseq does: check it against fairseq's whole parser."""
    args = vars(parse_train_args(dict_dir, arch))
    assert {name: json.dumps(args.get(name, "<missing>")) for name in golden()[arch]} == golden_json(arch)


@pytest.mark.parametrize("arch, argv, changed", [
    ("transformer_rpe_wmt_en_de_big", ["--rpe-max-distance", "4"], {"rpe_max_distance": 4}),
    ("transformer_rpe_wmt_en_de_big", ["--no-rpe-shared-heads"], {"rpe_shared_heads": False}),
    ("transformer_rpe_wmt_en_de_big", ["--rpe-shared-heads"], {}),
    ("transformer_rpe", ["--rpe-shared-heads", "--rpe-max-distance", "8"],
     {"rpe_shared_heads": True, "rpe_max_distance": 8}),
    ("transformer_rpe_tiny", ["--no-rpe-shared-heads"], {}),
    ("transformer_rope_wmt_en_de_big", ["--rope-theta", "500", "--rope-dim", "32", "--rope-layout", "half"],
     {"rope_theta": 500.0, "rope_dim": 32, "rope_layout": "half"}),
    ("transformer_rope_tiny", ["--rope-scaling", "yarn", "--rope-scaling-factor", "4", "--rope-original-length", "64"],
     {"rope_scaling": "yarn", "rope_scaling_factor": 4.0, "rope_original_length": 64}),
    ("transformer_rope", ["--rope-scaling", "dynamic-ntk", "--rope-original-length", "50"],
     {"rope_scaling": "dynamic-ntk", "rope_original_length": 50}),
    ("transformer_rpe_wmt_en_de_big", ["--dropout", "0.2", "--encoder-layers", "3"],
     {"dropout": 0.2, "encoder_layers": 3}),  # the stock architecture's own options still win
])
def test_the_command_line_wins_over_the_table_and_changes_nothing_else(arch, argv, changed):
    assert as_json(model_args(arch, *argv)) == golden_json(arch, **changed)


@pytest.mark.parametrize("arch, argv, message", [
    ("transformer_rope_wmt_en_de_big", ["--rope-dim", "7"],
     "--rope-dim must be an even number in [2, head dim = 64], got 7"),
    ("transformer_rope_iwslt_de_en", ["--rope-dim", "256"],
     "--rope-dim must be an even number in [2, head dim = 128], got 256"),
    ("transformer_rope", ["--rope-theta", "0"], "--rope-theta must be a finite number > 0, got 0.0"),
    ("transformer_rope_tiny", ["--encoder-embed-dim", "66", "--decoder-embed-dim", "66"],
     "RoPE rotates pairs of dimensions, but the attention head dimension is 33 (odd): choose "
     "--encoder/--decoder-embed-dim and --*-attention-heads so that embed_dim / heads is even"),
    ("transformer_rope", ["--rope-scaling", "linear"],
     "--rope-scaling linear needs --rope-scaling-factor S (the scale s)"),
    ("transformer_rope_tiny", ["--rope-scaling", "dynamic-yarn"],
     "--rope-scaling dynamic-yarn needs --rope-original-length L (the training length)"),
    ("transformer_rope_iwslt_de_en", ["--rope-scaling-factor", "2"],
     "--rope-scaling-factor 2.0 is set, but --rope-scaling is 'none': choose a scaling"),
    ("transformer_rope", ["--rope-scaling", "ntk", "--rope-scaling-factor", "0.5"],
     "--rope-scaling-factor must be a finite number >= 1, got 0.5"),
    ("transformer_rope_tiny", ["--rope-scaling", "ntk", "--rope-scaling-factor", "2", "--rope-dim", "2"],
     "--rope-scaling ntk needs --rope-dim >= 4 (b·s^(d/(d-2))), got 2"),
    ("transformer_rpe_wmt_en_de_big", ["--rpe-max-distance", "0"], "--rpe-max-distance must be >= 1, got 0"),
    ("transformer_rpe", ["--rpe-max-distance", "-3"], "--rpe-max-distance must be >= 1, got -3"),
])
def test_invalid_options_fail_while_parsing_with_their_message(dict_dir, arch, argv, message):
    """Before fairseq-train creates its save dir; the messages of rotary.py / relative.py."""
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        parse_train_args(dict_dir, arch, *argv)


def test_each_architecture_is_its_own_named_function():
    tables = {**ROPE_ARCHITECTURES, **RPE_ARCHITECTURES, **ALIBI_ARCHITECTURES}
    functions = [ARCH_CONFIG_REGISTRY[arch] for arch in REGISTERED]
    assert len({id(f) for f in functions}) == len(REGISTERED)  # fairseq keeps one per name
    for arch, function in zip(REGISTERED, functions):
        assert function.__name__ == function.__qualname__ == arch
        assert function.__doc__.startswith(f"``{arch}``: fairseq's ``{tables[arch].stock.__name__}`` with ")
    big = ARCH_CONFIG_REGISTRY["transformer_rpe_wmt_en_de_big"].__doc__
    assert big.endswith("(rpe_max_distance=8, rpe_shared_heads=True).")


def test_an_override_of_an_unknown_option_is_refused_before_registering():
    row = Architecture(ROPE_ARCHITECTURES["transformer_rope"].stock, {"rope_thetta": 1.0})
    message = r"transformer_rope_typo: overrides of unknown options \['rope_thetta'\]"
    with pytest.raises(ValueError, match=message):
        register_architectures("transformer_rope", ROPE_OPTIONS, {"transformer_rope_typo": row})
    assert "transformer_rope_typo" not in ARCH_MODEL_REGISTRY


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps(current_defaults(), indent=1) + "\n")
    print(f"wrote {GOLDEN}")
