"""What the fused rotation compiles to for an H100/H200 (sm_90), without a GPU: Triton's own
compiler and ptxas, from the Triton wheel.

On an H200 the interleaved layout, which read each member of a pair with its own stride-2 load,
ran at 0.08 of copy speed (85 µs against 7 µs for copying q and k), while the half layout, whose
pairs are two contiguous halves, ran at copy speed once its tables were contiguous
(docs/benchmarks/triton-launch-nvidia-h200.md). So both layouts must move q and k with the same
vector loads and stores; and neither should go through shared memory (no ``ld.shared``,
``st.shared``, ``stmatrix``: the interleaved layout's split and join of each row's pairs, and its
tables, should stay in registers). Checked in fp32, fp16 and bf16, for the three launches: q and
k (``rotate_qk``), q, k and v (HAS_V: the packed projection, a decoding step) and q, k, v with
per-sentence tables and a per-sentence scale of q (HAS_ROW_SCALE: dynamic YaRN). The compile runs
in a subprocess: the test session defines the kernels for Triton's interpreter, which cannot be
compiled."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.triton

ROOT = Path(__file__).resolve().parents[2]

# Compiles the kernel as the JIT launch specializes it for contiguous (B, H, T, D) tensors (or the
# packed projection's views: the same divisibility for D = 64) and contiguous fp32 tables of
# (T_table, W) or (B, T_table, W), W = half (the half layout) or 2·half (the interleaved layout's
# member tables): 16-byte aligned pointers, strides divisible by 16, the table's unit stride and a
# contiguous row_scale's as constants; the table's row stride (W) and batch stride (0 for the shared
# tables, T_table·W) marked divisible only where they are, as
# Triton's launch marks them. Prints, per launch and layout, how many of each global load and
# store instruction the PTX holds, its shared-memory instructions and bytes.
_COMPILE = r"""
import json, re, sys
sys.path.insert(0, sys.argv[1])
from fairseq_rope import rotary_triton as rt
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

fn = rt._rotary_kernel
dtype, length, half, head_dim = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
block_t, block_half, block_tail, block_d = rt.block_sizes(length, half, head_dim)
launches = {"q, k": (False, False), "q, k, v": (True, False),
            "q, k, v, per-sentence tables and row scale": (True, True)}
result = {}
for launch, (has_v, has_row_scale) in launches.items():
    result[launch] = {}
    for layout in ("interleaved", "half"):
        width = 2 * half if layout == "interleaved" else half  # member tables: one entry per member
        table_batch_stride = length * width if has_row_scale else 0
        signature = {name: "i32" for name in fn.arg_names}
        signature.update({name: "*" + dtype for name in ("Q", "K", "V", "OUT_Q", "OUT_K", "OUT_V")})
        signature.update(COS="*fp32", SIN="*fp32", ROW_SCALE="*fp32", q_scale="fp32", sign="fp32")
        constants = dict(HEAD_DIM=head_dim, HALF=half, INTERLEAVED=layout == "interleaved", HAS_V=has_v,
                         HAS_TAIL=head_dim > 2 * half, HAS_ROW_SCALE=has_row_scale, BLOCK_T=block_t,
                         BLOCK_HALF=block_half, BLOCK_TAIL=block_tail, BLOCK_D=block_d, sc_i=1, sr_b=1)
        signature.update({name: "constexpr" for name in constants})
        aligned = ["Q", "K", "V", "OUT_Q", "OUT_K", "OUT_V", "COS", "SIN", "ROW_SCALE", "sq_b", "sq_h", "sq_t",
                   "sk_b", "sk_h", "sk_t", "sv_b", "sv_h", "sv_t", "soq_b", "soq_h", "soq_t", "sok_b", "sok_h",
                   "sok_t", "sov_b", "sov_h", "sov_t"]
        aligned += [name for name, stride in (("sc_b", table_batch_stride), ("sc_t", width)) if stride % 16 == 0]
        source = ASTSource(
            fn=fn, signature=signature,
            constexprs={(fn.arg_names.index(name),): value for name, value in constants.items()},
            attrs={(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned},
        )
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        ptx = compiled.asm["ptx"]
        ops = re.findall(r"\b((?:ld|st)\.global(?:\.v[24])?\.b(?:16|32|64))\b", ptx)
        # Any instruction on the shared state space (ld/st.shared, stmatrix/ldmatrix, cp.async ...);
        # not the .extern declaration every kernel has.
        shared = [line.split()[0] for line in ptx.splitlines()
                  if ".shared" in line and not line.lstrip().startswith(".extern")]
        result[launch][layout] = {"global": {op: ops.count(op) for op in sorted(set(ops))},
                                  "shared": {op: shared.count(op) for op in sorted(set(shared))},
                                  "shared_bytes": compiled.metadata.shared}
print(json.dumps(result))
"""


@functools.lru_cache(maxsize=None)  # both tests read one compile
def memory_instructions(dtype: str, length: int, half: int, head_dim: int) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", _COMPILE, str(ROOT), dtype, str(length), str(half), str(head_dim)],
        capture_output=True, text=True, timeout=600,
        env={name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


DTYPES = pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
ROPE_DIMS = pytest.mark.parametrize("half,head_dim", [(32, 64), (24, 64)], ids=["full", "partial"])


@DTYPES
@ROPE_DIMS
def test_interleaved_pairs_move_like_the_half_layout(dtype, half, head_dim):
    launches = memory_instructions(dtype, 256, half, head_dim)
    assert len(launches) == 3, launches
    for launch, instructions in launches.items():
        interleaved, half_layout = instructions["interleaved"]["global"], instructions["half"]["global"]

        def stores(ops):
            return {op: n for op, n in ops.items() if op.startswith("st.")}

        def scalar_loads(ops):
            return {op: n for op, n in ops.items() if op.startswith("ld.") and ".v" not in op}

        # The same vector stores, and no more loads element by element than the half layout makes
        # (the interleaved layout reads its member tables, twice as wide, with vector loads too).
        assert stores(interleaved) == stores(half_layout), (launch, instructions)
        assert all(n <= scalar_loads(half_layout).get(op, 0) for op, n in scalar_loads(interleaved).items()), (
            launch, instructions)
        assert stores(interleaved) and all(".v" in op for op in stores(interleaved)), (launch, instructions)


@DTYPES
@ROPE_DIMS
def test_no_shared_memory_round_trip(dtype, half, head_dim):
    """Every value stays in the registers of the thread that loaded it: no shared memory, no
    barrier. Both layouts, every launch."""
    launches = memory_instructions(dtype, 256, half, head_dim)
    found = {(launch, layout): (compiled["shared"], compiled["shared_bytes"])
             for launch, layouts in launches.items() for layout, compiled in layouts.items()
             if compiled["shared"] or compiled["shared_bytes"]}
    assert not found, found
