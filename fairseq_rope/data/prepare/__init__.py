"""Data preparation for fairseq-rope: WMT14 En→De and any raw parallel corpus.

The pipeline follows fairseq's ``examples/translation/prepare-wmt14en2de.sh``
(Vaswani et al., 2017; the setup the RoFormer paper follows), with News
Commentary v9 and the full newstest2014 (3003 segments):

1. ``extract`` / ``import``: verify the archives (full read, expected members)
   and unwrap them, or validate user files, into ``OUT_DIR/raw``;
2. ``tokenize``: Moses punctuation normalization, removal of non-printing
   characters, Moses tokenization with aggressive hyphen splitting →
   ``OUT_DIR/tok``;
3. ``learn-bpe``: joint subword-nmt BPE (or a SentencePiece BPE model) →
   ``OUT_DIR/bpe``;
4. ``apply-bpe`` → ``OUT_DIR/bpe/{split}.{lang}``;
5. ``clean``: training pairs with 1–250 tokens per side and length ratio ≤ 1.5;
6. ``binarize``: ``fairseq-preprocess --joined-dictionary`` → ``OUT_DIR/data-bin``.

Every step is resumable (see :mod:`fairseq_rope.data.prepare.pipeline`). Entry
points: ``scripts/prepare_wmt14_en_de.sh``, ``scripts/prepare_parallel.sh`` and
``python -m fairseq_rope.data.prepare.cli {wmt14,parallel}``.
"""

from fairseq_rope.data.prepare.files import PrepareError

__all__ = ["PrepareError"]
