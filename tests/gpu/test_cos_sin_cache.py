"""The shared cos/sin cache (``rotary.cos_sin``, ``rotary._table``) keeps one table per
(rope_dim, θ, device, dtype): a table lives on its device in its dtype, tables of
the CPU and of the device are distinct, and a lookup never hands out another
device's or dtype's tensors (also through the memo of the last lookup, which the
layers of one pass share)."""

from __future__ import annotations

import pytest
import torch

from fairseq_rope.position_context import PositionContext
from fairseq_rope import rotary_tables
from fairseq_rope.rotary import RotaryEmbedding, cos_sin
from tests.rope_reference import unit_roundoff

pytestmark = pytest.mark.gpu

ROPE_DIM, THETA = 8, 10000.0
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture
def empty_cache():
    rotary_tables.clear_cos_sin_cache()
    yield
    rotary_tables.clear_cos_sin_cache()


def reference(positions: range, dtype: torch.dtype):
    """cos and sin of m·θ_i in fp64, and the bound on a cached value's error: rounding to
    the dtype (u) plus fp32 angles (2u₃₂·|mθ_i|) and fp32 cos/sin (2u₃₂)."""
    theta = torch.tensor([THETA ** (-2 * i / ROPE_DIM) for i in range(ROPE_DIM // 2)], dtype=torch.float64)
    angles = torch.tensor(list(positions), dtype=torch.float64)[:, None] * theta
    u32 = unit_roundoff(torch.float32)
    return angles.cos(), angles.sin(), 2 * (unit_roundoff(dtype) + 2 * u32 * (1 + angles.abs()))


def test_one_table_per_device_and_dtype_each_on_its_device_in_its_dtype(device, empty_cache):
    cpu = torch.device("cpu")
    wanted = [(cpu, torch.float32), *((device, dtype) for dtype in DTYPES)]
    for _ in range(2):  # the second round is served by the tables of the first
        for where, dtype in wanted:
            cos, sin = cos_sin(5, ROPE_DIM, THETA, where, dtype, offset=300)
            assert (cos.device, cos.dtype, sin.device, sin.dtype) == (where, dtype, where, dtype)
            expected_cos, expected_sin, bound = reference(range(300, 305), dtype)
            assert ((cos.cpu().double() - expected_cos).abs() <= bound).all()
            assert ((sin.cpu().double() - expected_sin).abs() <= bound).all()
    assert set(rotary_tables._TABLES) == {(ROPE_DIM, THETA, where, dtype, None) for where, dtype in wanted}
    assert len({id(table) for table in rotary_tables._TABLES.values()}) == len(rotary_tables._TABLES)
    for (_, _, where, dtype, _), table in rotary_tables._TABLES.items():
        assert (table.cos.device, table.cos.dtype, table.sin.device, table.sin.dtype) == (where, dtype, where, dtype)
        # e^{imθ} in the angles' precision (fp32) whatever the dtype: the interleaved rotation's.
        assert table.cis.device == where and table.cis.dtype == torch.complex64


def test_alternating_devices_and_dtypes_get_their_own_tables_through_the_encoding(device, empty_cache):
    """Every layer of a pass asks for the same positions, so a lookup may be answered from
    the last one: it must not be when the device or dtype changed in between."""
    encoding = RotaryEmbedding(ROPE_DIM)
    cpu = torch.device("cpu")
    for where, dtype in [(device, torch.float16), (cpu, torch.float32), (device, torch.float16),
                         (device, torch.bfloat16), (device, torch.float32), (cpu, torch.float32)]:
        x = torch.ones(1, 1, 3, ROPE_DIM, dtype=dtype, device=where)
        q, k = encoding.encode_qk(x, x, PositionContext(4))
        assert (q.device, q.dtype, k.device, k.dtype) == (where, dtype, where, dtype)
        with torch.inference_mode():  # a decoding step: the per-table step multipliers
            step = encoding.encode_step(torch.ones(2, 3, 1, ROPE_DIM, dtype=dtype, device=where), PositionContext(4), 0.5)
        assert {(t.device, t.dtype) for t in step} == {(where, dtype)}
    tables = {(key[2], key[3]) for key in rotary_tables._TABLES}
    assert tables == {(cpu, torch.float32), (device, torch.float16), (device, torch.bfloat16), (device, torch.float32)}
