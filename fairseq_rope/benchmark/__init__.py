"""Benchmark suite of issue 5: RoPE vs fairseq's stock Transformer, side by side in one process.

* :mod:`.timing`  — interleaved repetitions, medians and spread;
* :mod:`.ops`     — applying a position encoding to q and k (plugin, naive rotate-half,
  fairseq's RotaryPositionalEmbedding, sinusoidal addition, the copy bound);
* :mod:`.models`  — training tokens/s, beam-4 decoding sentences/s of whole models;
* :mod:`.memory`  — peak memory of one step, in process, on CPU and CUDA;
* :mod:`.launches` — kernel launches per step (``scripts/count_launches.py``), also reported
  beside the model-level times;
* :mod:`.profile` — operator profiles of a training step and a beam search (``scripts/profile_step.py``);
* :mod:`.machine`, :mod:`.report`, :mod:`.cli` — environment, targets, files, command line.

Run ``scripts/benchmark.py --help`` (or ``python -m fairseq_rope.benchmark``).
"""
