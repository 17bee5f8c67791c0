#!/usr/bin/env python3
"""Where the fused rotation's time goes on a GPU: the host's launch cost or the kernel.

The base-size benchmark (docs/benchmarks/nvidia-h200.md) times RoPE's rotation of q and k at
85-97 µs a call against 12-16 µs for copying the same tensors, and beam search at 0.89-0.92 of
stock. This script separates, per call:

* ``host µs``: what the Python caller spends enqueuing it (N calls, then one synchronize;
  the queue never fills for kernels shorter than the host's work, so this is the host's cost);
* ``kernel µs``: the GPU time of the kernels it launched (torch.profiler's device time ÷ N).

Candidates: ``copy_`` of q and k (the bound); the rotation kernel launched through Triton's JIT
(what ``rotary_triton.rotate`` does) and through the same kernel compiled without specialization
(``do_not_specialize``); an empty Triton kernel with 1 and with 40 arguments (Triton's launch cost alone);
the plugin's ``encode_qk``, fused and PyTorch, and a decoding step's ``encode_step`` (PyTorch on
every device since the H200 run of 2026-11-27 measured it cheaper on the host than the kernel's launch).

``--host-only`` measures, on the CPU, the plugin's own host cost of a fused call: the kernel's
launch is replaced by a no-op, so what remains is the Python and tensor bookkeeping around it
(Triton's launch itself is the ``empty Triton kernel`` rows, on a GPU).

Standalone (torch and triton; fairseq is not imported), so it runs on a bare GPU node:

    python scripts/triton_launch_cost.py --out docs/benchmarks/triton-launch-<gpu>.md
    python scripts/triton_launch_cost.py --dry-run     # CPU, Triton's interpreter: every path once
    python scripts/triton_launch_cost.py --host-only   # CPU: the plugin's host cost, launch stubbed
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import sys
import time
import types
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent


def load_rotary(interpret: bool):
    """fairseq_rope.rotary and rotary_triton without the package's __init__ (which imports fairseq)."""
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    package = types.ModuleType("fairseq_rope")
    package.__path__ = [str(ROOT / "fairseq_rope")]
    sys.modules["fairseq_rope"] = package
    rotary = importlib.import_module("fairseq_rope.rotary")
    rotary_triton = importlib.import_module("fairseq_rope.rotary_triton")
    return rotary, rotary_triton


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU tensors, Triton's interpreter, few calls")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--out", type=Path, help="markdown report (default: stdout only)")
    parser.add_argument("--host-only", action="store_true", help="CPU, the kernel's launch stubbed")
    args = parser.parse_args(argv)
    if args.host_only:
        return host_only(args.calls)

    rotary, rt = load_rotary(args.dry_run)
    import torch
    import triton

    device = torch.device("cpu" if args.dry_run else "cuda")
    calls = 3 if args.dry_run else args.calls
    on_gpu = device.type == "cuda"
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

    @triton.jit
    def _empty1(X):
        pass

    @triton.jit
    def _empty40(X, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18,
                 a19, a20, a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31, a32, a33, a34, a35,
                 a36, a37, a38, a39):
        pass

    kernel_fn = rt._rotary_kernel.fn
    names = rt._rotary_kernel.arg_names
    constexpr_names = ("HEAD_DIM", "HALF", "INTERLEAVED", "HAS_V", "HAS_TAIL", "BLOCK_T", "BLOCK_HALF",
                       "BLOCK_TAIL", "BLOCK_D")
    runtime_names = [n for n in names if n not in constexpr_names]
    try:
        generic = triton.jit(do_not_specialize=runtime_names, do_not_specialize_on_alignment=runtime_names)(kernel_fn)
    except TypeError:  # an older Triton without alignment control
        generic = triton.jit(do_not_specialize=runtime_names)(kernel_fn)

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    def host_us(fn: Callable[[], object]) -> float:
        for _ in range(min(calls, 20)):
            fn()
        sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        host = time.perf_counter() - start
        sync()
        return host / calls * 1e6

    def kernel_us(fn: Callable[[], object]) -> Optional[float]:
        if not on_gpu:
            return None
        n = min(calls, 100)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                fn()
            sync()
        total = sum(e.self_device_time_total for e in prof.key_averages())
        return total / n

    lines: List[str] = []

    def emit(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    emit(f"# Triton launch cost against kernel time: {torch.cuda.get_device_name() if on_gpu else 'cpu (dry run)'}")
    emit()
    emit(f"`{' '.join(['scripts/triton_launch_cost.py'] + (argv if argv is not None else sys.argv[1:]))}`, "
         f"{datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}, torch {torch.__version__}, "
         f"triton {triton.__version__}, Python {platform.python_version()}, CPU {platform.processor() or platform.machine()}, "
         f"{calls} calls per host figure, {min(calls, 100)} per kernel figure.")
    emit()
    emit("| dtype | shape | candidate | host µs/call | kernel µs/call | check |")
    emit("|---|---|---|---|---|---|")

    for dtype_name in args.dtypes.split(","):
        dtype = dtypes[dtype_name]
        # The op benchmark's shape (B, H, T, D) and a beam-search step's (32 sentences × beam 4).
        for batch, heads, length, head_dim in ((2, 2, 8, 16), (3, 2, 5, 16)) if args.dry_run else (
                (16, 8, 256, 64), (128, 8, 32, 64)):
            torch.manual_seed(0)
            q = torch.randn(batch, heads, length, head_dim, device=device, dtype=dtype)
            k = torch.randn_like(q)
            out_q, out_k = torch.empty_like(q), torch.empty_like(k)
            rope = rotary.RotaryEmbedding(head_dim)
            table = rotary.cos_sin_table(head_dim, rope.theta, device, dtype, length)
            cos, sin = table.members()  # the interleaved layout's tables, one entry per member of a pair
            shape = f"{batch}×{heads}×{length}×{head_dim}"

            # The kernel's arguments as rotary_triton.rotate passes them (no v: q stands in, unused).
            block_t, block_half, block_tail, block_d = rt.block_sizes(length, head_dim // 2, head_dim)
            grid = (batch * heads, triton.cdiv(length, block_t))
            runtime = [q, k, q, out_q, out_k, out_q, cos, sin,
                       *q.stride()[:3], *k.stride()[:3], *q.stride()[:3],
                       *out_q.stride()[:3], *out_k.stride()[:3], *out_q.stride()[:3],
                       0, *cos.stride(), heads, length, 0, 1.0, 1.0]
            const = dict(HEAD_DIM=head_dim, HALF=head_dim // 2, INTERLEAVED=True, HAS_V=False,
                         HAS_TAIL=False, BLOCK_T=block_t, BLOCK_HALF=block_half, BLOCK_TAIL=block_tail,
                         BLOCK_D=block_d)

            def check() -> str:
                sync()
                want_q, _ = rotary.RotaryEmbedding(head_dim).encode_qk(q.double(), k.double(), rotary.PositionContext(0))
                err = (out_q.double() - want_q).abs().max().item()
                out_q.zero_()
                return f"max err {err:.1e}"

            cases: Dict[str, Tuple[Callable[[], object], Optional[Callable[[], str]]]] = {}
            cases["copy_ of q and k"] = (lambda: (out_q.copy_(q), out_k.copy_(k)), None)
            cases["rotary kernel, Triton JIT launch"] = (lambda: rt._rotary_kernel[grid](*runtime, **const), check)
            cases["rotary kernel, unspecialized JIT"] = (lambda: generic[grid](*runtime, **const), check)
            cases["empty Triton kernel, 1 argument"] = (lambda: _empty1[(1,)](q), None)
            cases["empty Triton kernel, 40 arguments"] = (lambda: _empty40[(1,)](q, *range(1, 40)), None)
            cases["encode_qk, fused"] = (lambda: rope.encode_qk(q, k, rotary.PositionContext(0)), None)
            cases["encode_qk, PyTorch"] = (lambda: rope.encode_qk(q, k, rotary.PositionContext(0)), None)
            qkv = torch.randn(batch, 3, heads, head_dim, device=device, dtype=dtype)
            step_offset = length - 1
            step_context = rotary.PositionContext(step_offset)  # one per step, shared by its layers
            cases["encode_step (decoding step), PyTorch"] = (lambda: rope.encode_step(qkv, step_context, 0.125), None)

            for name, (fn, verify) in cases.items():
                setting = "0" if name.endswith("PyTorch") else ("interpret" if args.dry_run else "auto")
                with torch.no_grad(), rotary.fused_rotation(setting):
                    try:
                        host = host_us(fn)
                        kern = kernel_us(fn)
                        note = verify() if verify is not None else ""
                    except Exception as error:  # noqa: BLE001
                        emit(f"| {dtype_name} | {shape} | {name} | failed: {type(error).__name__}: {error} | | |")
                        continue
                kern_text = "—" if kern is None else f"{kern:.1f}"
                emit(f"| {dtype_name} | {shape} | {name} | {host:.1f} | {kern_text} | {note} |")

    emit()
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}")
    return 0


def host_only(calls: int) -> int:
    """Host µs per call of the fused paths with the launch a no-op (CPU tensors, one thread)."""
    rotary, rt = load_rotary(interpret=False)
    import torch

    class NoLaunch:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    rt._rotary_kernel = NoLaunch()
    rotary._fused = (rt, frozenset(("cpu",)))  # route CPU tensors to the (stubbed) kernel
    torch.set_num_threads(1)
    rope = rotary.RotaryEmbedding(64)
    q = torch.randn(16, 8, 256, 64)
    k = torch.randn_like(q)
    qkv_step = torch.randn(128, 3, 8, 64)
    qkv_packed = torch.randn(64, 64, 3, 8, 64)
    step_context = rotary.PositionContext(31)  # one per step, shared by its layers
    cases = {
        "encode_qk (16×8×256×64)": lambda: rope.encode_qk(q, k, rotary.PositionContext(0)),
        "encode_qkv (packed, 64×64 tokens)": lambda: rope.encode_qkv(qkv_packed, rotary.PositionContext(0)),
        "encode_step (128 hypotheses, PyTorch)": lambda: rope.encode_step(qkv_step, step_context, 0.125),
    }
    print(f"host µs per call, launch stubbed, {calls} calls, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    with torch.no_grad():
        for name, fn in cases.items():
            for _ in range(100):
                fn()
            times = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                times.append((time.perf_counter() - start) / calls * 1e6)
            print(f"  {name}: median {sorted(times)[2]:.1f} µs (min {min(times):.1f}, max {max(times):.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
