"""fairseq-rope: Rotary Position Embedding (RoFormer) as a fairseq plugin.

Install torch first (``pip install torch==2.13.0`` on CPU machines, or the CUDA
build you want); a bare torch requirement would otherwise resolve to the
newest CUDA build. fairseq 0.12.2 does not import on Python >= 3.11, where the
``fairseq-fixed`` fork (same ``fairseq`` import name) is used instead.
"""

from setuptools import find_packages, setup

setup(
    name="fairseq-rope",
    version="0.1.0",
    description="Rotary Position Embedding (RoFormer) for fairseq Transformer machine translation",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["fairseq_rope", "fairseq_rope.*"]),
    install_requires=[
        'fairseq-fixed==0.12.3.1; python_version >= "3.11"',
        'fairseq==0.12.2; python_version < "3.11"',
        "sacrebleu>=2.0",
        "sacremoses>=0.0.53",
        "subword-nmt>=0.3.8",
        "sentencepiece>=0.1.99",
        "pyyaml>=5.4",
        "tqdm>=4.0",
        "matplotlib>=3.5",
    ],
    extras_require={
        "test": ["pytest>=7", "tensorboardX>=2.5"],
        "tensorboard": ["tensorboardX>=2.5"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
