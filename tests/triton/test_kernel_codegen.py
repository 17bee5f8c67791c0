"""What the fused rotation compiles to for an H100/H200 (sm_90), without a GPU: Triton's own
compiler and ptxas, from the Triton wheel.

On an H200 the interleaved layout, which read each member of a pair with its own stride-2 load,
ran at 0.08 of copy speed (85 µs against 7 µs for copying q and k), while the half layout, whose
pairs are two contiguous halves, ran at copy speed once its tables were contiguous
(docs/benchmarks/triton-launch-nvidia-h200.md). So both layouts must move q and k with the same
vector loads and stores. The compile runs in a subprocess: the test session defines the kernels
for Triton's interpreter, which cannot be compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.triton

ROOT = Path(__file__).resolve().parents[2]

# Compiles the kernel as the JIT launch specializes it for contiguous (B, H, T, D) tensors and
# the shared tables (16-byte aligned pointers, strides divisible by 16, the table's unit stride)
# and prints, per layout, how many of each global load and store instruction the PTX holds.
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
result = {}
for layout in ("interleaved", "half"):
    signature = {name: "i32" for name in fn.arg_names}
    signature.update({name: "*" + dtype for name in ("Q", "K", "V", "OUT_Q", "OUT_K", "OUT_V")})
    signature.update(COS="*fp32", SIN="*fp32", q_scale="fp32", sign="fp32")
    constants = dict(HEAD_DIM=head_dim, HALF=half, INTERLEAVED=layout == "interleaved", HAS_V=False,
                     HAS_TAIL=head_dim > 2 * half, BLOCK_T=block_t, BLOCK_HALF=block_half,
                     BLOCK_TAIL=block_tail, BLOCK_D=block_d, sc_i=1)
    signature.update({name: "constexpr" for name in constants})
    aligned = ["Q", "K", "V", "OUT_Q", "OUT_K", "OUT_V", "COS", "SIN", "sq_b", "sq_h", "sq_t", "sk_b", "sk_h",
               "sk_t", "soq_b", "soq_h", "soq_t", "sok_b", "sok_h", "sok_t", "sc_t"]
    source = ASTSource(
        fn=fn, signature=signature,
        constexprs={(fn.arg_names.index(name),): value for name, value in constants.items()},
        attrs={(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned},
    )
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    ops = re.findall(r"\b((?:ld|st)\.global(?:\.v[24])?\.b(?:16|32|64))\b", ptx)
    result[layout] = {op: ops.count(op) for op in sorted(set(ops))}
print(json.dumps(result))
"""


def global_memory_instructions(dtype: str, length: int, half: int, head_dim: int) -> dict:
    completed = subprocess.run(
        [sys.executable, "-c", _COMPILE, str(ROOT), dtype, str(length), str(half), str(head_dim)],
        capture_output=True, text=True, timeout=300,
        env={name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("half,head_dim", [(32, 64), (24, 64)], ids=["full", "partial"])
def test_interleaved_pairs_move_like_the_half_layout(dtype, half, head_dim):
    instructions = global_memory_instructions(dtype, 256, half, head_dim)
    interleaved, half_layout = instructions["interleaved"], instructions["half"]
    assert interleaved == half_layout, instructions
    # And those are vector instructions: q and k are not read element by element.
    stores = {op: n for op, n in interleaved.items() if op.startswith("st.")}
    assert stores and all(".v" in op for op in stores), instructions
