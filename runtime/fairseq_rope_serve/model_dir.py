"""What an exported model directory holds besides CTranslate2's own files, and reading it back.

``fairseq-rope-export-ct2`` writes, beside CTranslate2's ``model.bin``, ``config.json`` and
vocabularies:

* ``dict.SRC.txt``, ``dict.TGT.txt``: the fairseq dictionaries the model was trained with;
* ``bpe.codes``: the subword-nmt BPE codes its data were segmented with;
* ``fairseq_rope.json``: :class:`ModelDirectory`, everything the translate command needs to
  turn raw text into the model's input and back (languages, tokenization, BPE, the name of
  ``<pad>``, length limits, the tables' decoding settings) and where the model came from.

The translate command needs nothing outside this directory.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional

from fairseq_rope_serve.common import DeployError, PathLike

CONFIG = "fairseq_rope.json"
BPE_CODES = "bpe.codes"
#: Version of :data:`CONFIG`'s layout.
FORMAT = 1


@dataclass(frozen=True)
class ModelDirectory:
    """``fairseq_rope.json`` of an exported model (paths inside the directory are relative)."""

    source_lang: str
    target_lang: str
    architecture: str
    family: str
    #: The name of fairseq's ``<pad>`` in the CTranslate2 vocabulary (never to be emitted).
    pad_token: str
    #: fairseq's EOS (decoding starts and stops with it).
    eos_token: str
    #: Positions of the model's position tables (None: positions in attention only, no limit).
    max_source_positions: Optional[int]
    max_target_positions: Optional[int]
    #: Moses processing of the raw text (fairseq_rope_serve.text), as in data preparation.
    tokenizer: Dict[str, Any]
    #: subword-nmt codes file in the directory, None if the export was given none.
    bpe_codes: Optional[str]
    bpe_separator: str
    #: beam, lenpen, max_len_a, max_len_b: the tables' decoding (fairseq_rope_serve.decoding).
    decoding: Dict[str, Any]
    quantization: Optional[str]
    provenance: Dict[str, Any] = field(default_factory=dict)
    format: int = FORMAT

    def write(self, directory: PathLike) -> None:
        """Into the exporter's temporary directory, which appears atomically as a whole."""
        text = json.dumps(asdict(self), indent=2, ensure_ascii=False) + "\n"
        (Path(directory) / CONFIG).write_text(text, encoding="utf-8")

    @classmethod
    def read(cls, directory: PathLike) -> "ModelDirectory":
        """The directory's settings; a :class:`DeployError` if it is no exported model."""
        directory = Path(directory)
        path = directory / CONFIG
        if not directory.is_dir():
            raise DeployError(f"{directory}: no such model directory")
        if not path.is_file() or not (directory / "model.bin").is_file():
            raise DeployError(f"{directory} is not a model directory written by fairseq-rope-export-ct2 "
                              f"(no {CONFIG} or model.bin)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != FORMAT:
                raise DeployError(f"{path}: format {data.get('format')!r}, this version reads {FORMAT}; "
                                  "export the model again")
            return cls(**data)
        except (ValueError, TypeError) as e:
            if isinstance(e, DeployError):
                raise
            raise DeployError(f"{path} is damaged ({e}); export the model again") from None

    def codes_path(self, directory: PathLike) -> Path:
        """The BPE codes file, or a :class:`DeployError` when the export had none."""
        if self.bpe_codes is None:
            raise DeployError(f"{directory} was exported without BPE codes, so raw text cannot be "
                              "segmented for it: export it again with --bpe-codes")
        return Path(directory) / self.bpe_codes
