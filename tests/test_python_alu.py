"""The PYTHON device's numpy ALU against the op-semantics table (kernopt.alu), op by op: its kernels cover exactly the
table's domain, and for every op x scalar dtype the numpy kernel and exec_alu agree on a grid of values with the edge
cases (int min / -1, zero divisors, nan, inf, -0.0, overflow, shift counts past the width, bool ops); outside the
domain both the device and every dialect refuse the op."""
import itertools
import math
import numpy as np
import pytest
from kernopt.alu import DOMAINS, KINDS, defined_on, exec_alu, operand_kind, truncate_float
from kernopt.dtype import dtypes, wrap_int
from kernopt.errors import UnsupportedError
from kernopt.lazyop import BinaryOps, TernaryOps, UnaryOps
from kernopt.runtime.python_alu import NUMPY_ALU, alu, reg_dtype

ALU_OPS = [op for group in (UnaryOps, BinaryOps, TernaryOps) for op in group if op not in (UnaryOps.CAST,
                                                                                          UnaryOps.BITCAST)]
SCALARS = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32,
           dtypes.int64, dtypes.uint64, dtypes.half, dtypes.bfloat16, dtypes.float32, dtypes.float64]
ARITY = {**{op: 1 for op in UnaryOps}, **{op: 2 for op in BinaryOps}, **{op: 3 for op in TernaryOps}}
INT_VALS = [0, 1, -1, 2, 7, -7, 100, -128, 127, 2 ** 31 - 1, -2 ** 31, 2 ** 63 - 1]
FLOAT_VALS = [0.0, -0.0, 1.0, -1.5, 2.25, 0.1, 3.0, 1e4, -1e-3, 1e-40, math.inf, -math.inf, math.nan, 60000.0]
LARGEST = {dtypes.half: 65504.0, dtypes.bfloat16: 3.3895313892515355e38, dtypes.float32: 3.4028234663852886e38,
           dtypes.float64: 1.7976931348623157e308}

def values(dt) -> list:
  """The grid for dt: the dtype's min and max (so min / -1 and min * -1 wrap) and small values for ints; signed zeros,
  a subnormal, infinities, nan and the largest finite value (whose sum overflows) for floats."""
  if dt == dtypes.bool: return [False, True]
  if dtypes.is_int(dt): return sorted({wrap_int(v, dt) for v in INT_VALS} | {dtypes.min(dt), dtypes.max(dt)})
  return [truncate_float(v, dt) for v in FLOAT_VALS + [LARGEST[dt], -LARGEST[dt]]]

def rows_for(op, dt) -> list[tuple]:
  vals = values(dt)
  if op is TernaryOps.WHERE: return [(c, a, b) for c in (False, True) for a in vals for b in vals[::3]]
  if op in (BinaryOps.SHL, BinaryOps.SHR):   # counts are taken modulo the width: past it, and negative ones
    bits = 8 * dt.itemsize
    return [(a, wrap_int(b, dt)) for a in vals for b in (0, 1, 3, 7, bits - 1, bits, bits + 1, 2 * bits + 3, -1)]
  return list(itertools.product(vals, repeat=ARITY[op]))

def same(got, want) -> bool:
  """Equal values; for floats nan equals nan and the sign of zero counts."""
  if isinstance(want, float):
    got = float(got)
    return (math.isnan(got) and math.isnan(want)) or (got == want and math.copysign(1, got) == math.copysign(1, want))
  return got == want

def test_the_numpy_kernels_cover_exactly_the_op_tables_domain():
  assert set(DOMAINS) == set(ALU_OPS)
  assert set(NUMPY_ALU) == {(op, kind) for op, kinds in DOMAINS.items() for kind in kinds}
  # what the table says of a few ops, as DESIGN.md's op semantics and the dialects have it
  assert DOMAINS[BinaryOps.SHL] == {"int"} and DOMAINS[BinaryOps.XOR] == {"int", "bool"}
  assert DOMAINS[UnaryOps.EXP2] == {"float"} and DOMAINS[BinaryOps.CMPLT] == set(KINDS)
  assert not defined_on(BinaryOps.IDIV, dtypes.bool) and defined_on(BinaryOps.IDIV, dtypes.int8.vec(4))
  assert operand_kind(dtypes.float.vec(4)) == "float" and operand_kind(dtypes.bool) == "bool"

@pytest.mark.parametrize("dt", SCALARS, ids=lambda d: d.name)
def test_every_op_agrees_with_exec_alu_or_both_refuse(dt):
  """Each op defined on dt gives exec_alu's value for every row of the grid (one numpy call over all the rows, the
  result in dt's register type); each op not defined on dt raises UnsupportedError naming the op and dtype."""
  checked = 0
  for op in ALU_OPS:
    out_dt = dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else dt
    in_dts = [dtypes.bool, dt, dt] if op is TernaryOps.WHERE else [dt] * ARITY[op]
    if not defined_on(op, dt):
      ones = tuple(np.ones(1, dtype=reg_dtype(d)) for d in in_dts)
      with pytest.raises(UnsupportedError, match=f"{op} is not defined on {dt}"): alu(op, out_dt, ones)
      continue
    rows = rows_for(op, dt)
    wants = [exec_alu(op, out_dt, row) for row in rows]
    cols = [np.array([r[k] for r in rows], dtype=reg_dtype(d)) for k, d in enumerate(in_dts)]
    got = alu(op, out_dt, tuple(cols))
    assert got.dtype == reg_dtype(out_dt) and got.shape == (len(rows),)
    bad = [(r, g, w) for r, g, w in zip(rows, got.tolist(), wants) if not same(g, w)]
    assert not bad, f"{op} on {dt}: (operands, numpy, exec_alu) {bad[:5]}"
    checked += 1
  assert checked == sum(operand_kind(dt) in DOMAINS[op] for op in ALU_OPS) > 0

def test_the_edge_cases_have_their_documented_values():
  """DESIGN.md's op semantics on the edges, for both the table and the device (the values written out here)."""
  i32, i64 = dtypes.int32, dtypes.int64
  cases = [(BinaryOps.IDIV, i32, (-2 ** 31, -1), -2 ** 31), (BinaryOps.MOD, i32, (-2 ** 31, -1), 0),
           (BinaryOps.IDIV, i64, (-2 ** 63, -1), -2 ** 63), (BinaryOps.IDIV, i32, (7, 0), 0),
           (BinaryOps.MOD, i32, (-7, 2), -1), (BinaryOps.IDIV, i32, (-7, 2), -3), (BinaryOps.SHL, i32, (1, 33), 2),
           (BinaryOps.SHR, i32, (-8, 1), -4), (BinaryOps.ADD, i32, (2 ** 31 - 1, 1), -2 ** 31),
           (BinaryOps.MAX, dtypes.float32, (math.nan, 1.0), 1.0),
           (BinaryOps.IDIV, dtypes.float32, (1.0, 0.0), math.inf), (BinaryOps.ADD, dtypes.bool, (True, True), True),
           (UnaryOps.NEG, dtypes.bool, (True,), False)]
  for op, dt, args, want in cases:
    assert same(exec_alu(op, dt, args), want), (op, dt, args)
    got = alu(op, dt, tuple(np.array([a], dtype=reg_dtype(dt)) for a in args))
    assert same(got.tolist()[0], want), (op, dt, args, got)
