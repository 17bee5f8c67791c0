"""Architectures and options of a position-encoding model family, as data.

A family (RoPE, RPE) declares its command-line options once, as a tuple of
:class:`Option` with an :class:`EncodingOptions` that also names the family's
validation; :func:`add_options` turns them into arguments and
:func:`fill_defaults` fills the ones left unset.

Its architectures are one table, architecture name → :class:`Architecture`:
the stock fairseq architecture function it mirrors (so the dimensions, dropout
and everything else are fairseq's) and the family's option values that differ
from the defaults for that architecture. :func:`register_architectures`
(through :func:`register_family`, which also registers the model) registers each row with fairseq as a generated function that

1. fills the family's options the command line left unset (None): the row's
   override, else the option's default — the command line always wins;
2. calls the stock architecture;
3. validates, so that a bad option fails while fairseq-train parses its
   arguments, before it creates its save dir.

The names and defaults registered are frozen by
tests/models/test_architectures.py: checkpoints store ``--arch`` and its args.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Optional, Tuple

from fairseq.models import register_model, register_model_architecture

from fairseq_rope.models.positional_transformer import refuse_xformers

ArchitectureFunction = Callable[[Namespace], None]


@dataclass(frozen=True)
class Option:
    """One option of a family: ``--rope-theta`` is ``Option("rope_theta", …)``."""

    name: str  # attribute in args; the flag is --name-with-dashes
    default: Any  # for architectures that do not override it
    help: str
    shown_default: str = ""  # how --help shows the default, when not str(default)
    argparse: Mapping[str, Any] = field(default_factory=dict)  # type, metavar, choices
    negation_help: Optional[str] = None  # a boolean switch: also --no-<flag>, with this help

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def negation(self) -> str:
        return "--no-" + self.name.replace("_", "-")


@dataclass(frozen=True)
class EncodingOptions:
    """A family's options and the check of their values (run on complete args)."""

    title: str  # argument group in --help
    options: Tuple[Option, ...]
    validate: ArchitectureFunction

    def names(self) -> Tuple[str, ...]:
        return tuple(option.name for option in self.options)


@dataclass(frozen=True)
class Architecture:
    """A row of a family's table: the stock fairseq architecture it mirrors and the
    family's option values (by option name) that differ from the defaults."""

    stock: ArchitectureFunction
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Read-only copy: a table row must not change after registration.
        object.__setattr__(self, "overrides", MappingProxyType(dict(self.overrides)))


ArchitectureTable = Mapping[str, Architecture]


def defaults_help(option: Option, table: ArchitectureTable) -> str:
    """``(default X; Y for arch)``: the default, and where the table overrides it."""
    show = (lambda value: ("on" if value else "off")) if option.negation_help else str
    notes = [option.shown_default or show(option.default)]
    notes += [f"{show(arch.overrides[option.name])} for {name}"
              for name, arch in table.items() if option.name in arch.overrides]
    return f"(default {'; '.join(notes)})"


def add_options(parser, family: EncodingOptions, table: ArchitectureTable) -> None:
    """The family's arguments, all without a value: left unset, the architecture fills them."""
    group = parser.add_argument_group(family.title)
    for option in family.options:
        text = f"{option.help} {defaults_help(option, table)}"
        if option.negation_help is None:
            group.add_argument(option.flag, **option.argparse, help=text)
            continue
        # default=None explicitly: store_true would default to False, hiding an unset switch.
        group.add_argument(option.flag, action="store_true", default=None, help=text)
        group.add_argument(option.negation, dest=option.name, action="store_false", default=None,
                           help=option.negation_help)


def fill_defaults(args: Namespace, family: EncodingOptions, overrides: Mapping[str, Any]) -> None:
    """Set each option the command line left unset (None) to the override, else the default."""
    for option in family.options:
        if getattr(args, option.name, None) is None:
            setattr(args, option.name, overrides.get(option.name, option.default))


def architecture_function(name: str, family: EncodingOptions, arch: Architecture) -> ArchitectureFunction:
    """What fairseq runs for ``--arch name``: the family's defaults, the stock architecture, checks."""

    def configure(args: Namespace) -> None:
        fill_defaults(args, family, arch.overrides)
        arch.stock(args)
        family.validate(args)
        for side in ("encoder", "decoder"):
            refuse_xformers(side, getattr(args, f"{side}_xformers_att_config", None))

    # fairseq maps each name to its own callable (ARCH_CONFIG_REGISTRY): name it after the
    # architecture, for tracebacks and introspection, instead of a row of "configure"s.
    configure.__name__ = configure.__qualname__ = name
    overrides = ", ".join(f"{key}={value!r}" for key, value in arch.overrides.items())
    configure.__doc__ = (f"``{name}``: fairseq's ``{arch.stock.__name__}`` with {family.title}"
                         + (f" ({overrides})." if overrides else "."))
    return configure


def register_architectures(model_name: str, family: EncodingOptions, table: ArchitectureTable) -> None:
    """Register every row of ``table`` as an architecture of ``model_name``."""
    for name, arch in table.items():
        unknown = set(arch.overrides) - set(family.names())
        if unknown:  # a typo would otherwise be a silently ignored override
            raise ValueError(f"{name}: overrides of unknown options {sorted(unknown)}")
        register_model_architecture(model_name, name)(architecture_function(name, family, arch))


def register_family(model_name: str, family: EncodingOptions, table: ArchitectureTable):
    """Class decorator: register a model class as fairseq model ``model_name``, with the
    family's options on its command line, and every architecture of ``table``."""

    def register(cls: type) -> type:
        @classmethod
        def add_args(model: type, parser) -> None:
            super(cls, model).add_args(parser)
            add_options(parser, family, table)

        cls.add_args = add_args
        register_model(model_name)(cls)
        register_architectures(model_name, family, table)
        return cls

    return register
