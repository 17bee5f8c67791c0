#!/usr/bin/env python3
"""Sweep the fused rotation kernel's launch shape on a GPU: kernel µs per call (torch.profiler).

Layouts × positions per program (BLOCK_T) × warps, with the cos/sin tables as the stride-2 views
of the complex table the kernel read until 2026-11-27 ("view") or contiguous ("contiguous"), and
copy kernels (torch, Triton 1-D and 2-D tiles) as the bound; q and k of (16, 8, 256, 64), the
op benchmark's shape. Standalone (torch and triton; fairseq is not imported):

    python scripts/triton_kernel_sweep.py             # on a GPU node, about 40 s
    python scripts/triton_kernel_sweep.py --dry-run   # CPU, Triton's interpreter, every variant once
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, List, Optional

from triton_launch_cost import load_rotary


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    rotary, rt = load_rotary(interpret=args.dry_run)
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def copy2d(X, OUT, sx_t, so_t, length, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        d = tl.arange(0, BLOCK_D)
        rows = (t < length)[:, None]
        base = tl.program_id(0) * length
        x = tl.load(X + (base + t[:, None]) * sx_t + d[None, :], mask=rows)
        tl.store(OUT + (base + t[:, None]) * so_t + d[None, :], x, mask=rows)

    @triton.jit
    def copy1d(X, OUT, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(OUT + offsets, tl.load(X + offsets, mask=offsets < n), mask=offsets < n)

    device = torch.device("cpu" if args.dry_run else "cuda")
    calls = 50

    def kernel_us(fn: Callable[[], object]) -> float:
        if args.dry_run:
            fn()
            return float("nan")
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
        return sum(e.self_device_time_total for e in prof.key_averages()) / calls

    def row(name: str, fn: Callable[[], object]) -> None:
        try:
            print(f"| {name} | {kernel_us(fn):.1f} |", flush=True)
        except Exception as error:  # noqa: BLE001 (a sweep: report the variant, go on)
            print(f"| {name} | failed {type(error).__name__}: {str(error)[:120]} |", flush=True)

    shape = (2, 2, 8, 64) if args.dry_run else (16, 8, 256, 64)
    batch, heads, length, head_dim = shape
    for dtype in (torch.float32, torch.bfloat16):
        q = torch.randn(shape, device=device, dtype=dtype)
        k = torch.randn_like(q)
        out_q, out_k = torch.empty_like(q), torch.empty_like(k)
        table = rotary.cos_sin_table(head_dim, 10000.0, device, dtype, length)
        tables = {"view": torch.view_as_real(table.cis).unbind(-1)}  # stride 2
        tables["contiguous"] = tuple(x.contiguous() for x in tables["view"])
        print(f"\n## {dtype} {shape}\n\n| variant | kernel µs |\n|---|---|")
        n = q.numel()
        row("torch copy_ q and k", lambda: (out_q.copy_(q), out_k.copy_(k)))
        row("triton copy1d q and k (BLOCK 1024)", lambda: [
            copy1d[(triton.cdiv(n, 1024),)](x, out, n, BLOCK=1024) for x, out in ((q, out_q), (k, out_k))])
        row("triton copy2d q and k (32×64 tiles)", lambda: [
            copy2d[(batch * heads, triton.cdiv(length, 32))](x, out, head_dim, head_dim, length, BLOCK_T=32,
                                                             BLOCK_D=head_dim)
            for x, out in ((q, out_q), (k, out_k))])
        for interleaved in (True, False):
            for block_t in (8, 32, 64, 128):
                for warps in (1, 4, 8):
                    for kind, (cos, sin) in tables.items():
                        if kind == "contiguous" and (block_t != 32 or warps != 4):
                            continue
                        if interleaved:  # the interleaved layout reads one entry per member of a pair
                            cos, sin = rotary.member_tables(cos, sin)
                        grid = (batch * heads, triton.cdiv(length, block_t))
                        runtime = [q, k, q, out_q, out_k, out_q, cos, sin, *q.stride()[:3], *k.stride()[:3],
                                   *q.stride()[:3], *out_q.stride()[:3], *out_k.stride()[:3], *out_q.stride()[:3],
                                   0, *cos.stride(), heads, length, 0, 1.0, 1.0]
                        constants = dict(HEAD_DIM=head_dim, HALF=head_dim // 2, INTERLEAVED=interleaved,
                                         HAS_V=False, HAS_TAIL=False, BLOCK_T=block_t, BLOCK_HALF=head_dim // 2,
                                         BLOCK_TAIL=1, BLOCK_D=head_dim)
                        layout = "interleaved" if interleaved else "half"
                        row(f"rotary {layout} BLOCK_T={block_t} warps={warps} tables={kind}",
                            lambda: rt._rotary_kernel[grid](*runtime, **constants, num_warps=warps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
