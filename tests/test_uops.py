"""UOp interning (identity, float and dtype keys, the sweep of unreferenced nodes) and flops_mem (symbolic trip
counts, ignoring index arithmetic)."""
import math
import pickle
from kernopt import uops as uops_mod
from kernopt.dtype import dtypes
from kernopt.ops import BinaryOps, TernaryOps
from kernopt.shape.symbolic import Node, Variable, sym_infer
from kernopt.uops import UOp, UOps, flops_mem

I, F = dtypes.int32, dtypes.float32
def c(v, dt=I): return UOp.const(dt, v)
def alu(op, *src, dt=I): return UOp(UOps.ALU, dt, tuple(src), op)

def test_interning_is_identity():
  a = alu(BinaryOps.ADD, c(1), c(2))
  assert alu(BinaryOps.ADD, c(1), c(2)) is a
  assert UOp(UOps.ALU, I, [c(1), c(2)], BinaryOps.ADD) is a   # a list of sources is the same node
  assert alu(BinaryOps.ADD, c(2), c(1)) is not a
  assert alu(BinaryOps.MUL, c(1), c(2)) is not a
  assert pickle.loads(pickle.dumps(a)) is a

def test_const_keys_distinguish_kinds_and_float_bits():
  assert c(0.0, F) is not c(-0.0, F)
  assert c(math.nan, F) is c(float("nan"), F)
  assert c(1, I) is not c(True, dtypes.bool) and c(1, I) is not c(1.0, F)
  assert c(1, dtypes.int64) is not c(1, I)
  assert c(2 ** 31, I).arg == -2 ** 31 and c(1.5, I).arg == 1   # converted to the dtype's kind and range
  assert c(1, F).arg == 1.0 and type(c(1, F).arg) is float

def test_equal_vector_dtypes_intern_to_one_node():
  zero = c(0.0, F)
  v1 = UOp(UOps.VECTORIZE, F.vec(4), (zero,) * 4)
  v2 = UOp(UOps.VECTORIZE, F.vec(4), (zero,) * 4)   # F.vec(4) builds a new, equal DType object
  assert v1 is v2 and v1.dtype == F.vec(4)

def test_sweep_drops_only_unreferenced_nodes():
  keep = alu(BinaryOps.ADD, c(123456), c(7))
  for i in range(200): alu(BinaryOps.MUL, c(900000 + i), c(3))   # garbage
  uops_mod._sweep(full=True)
  live = set(map(id, uops_mod._interned.values()))
  assert id(keep) in live and id(keep.src[0]) in live
  assert not any(u.op is UOps.CONST and u.arg == 900000 + 5 for u in uops_mod._interned.values())
  assert alu(BinaryOps.ADD, c(123456), c(7)) is keep   # still interned after the sweep
  for i in range(200): alu(BinaryOps.MUL, c(800000 + i), c(3))
  uops_mod._sweep()   # only the nodes made since the last sweep
  assert not any(u.op is UOps.CONST and u.arg == 800000 + 5 for u in uops_mod._interned.values())
  assert alu(BinaryOps.ADD, c(123456), c(7)) is keep

# ***** flops_mem *****

def _loop_program(end, body_fn):
  """[params..., RANGE(0, end), body..., ENDRANGE]: body_fn(ridx, buf_in, buf_out) -> list of uops in order."""
  out = UOp(UOps.DEFINE_GLOBAL, F, (), (0, "data0", True))
  inp = UOp(UOps.DEFINE_GLOBAL, F, (), (1, "data1", False))
  r = UOp(UOps.RANGE, I, (c(0), end), (0, False))
  return [out, inp, r, *body_fn(r, inp, out), UOp(UOps.ENDRANGE, None, (r,))]

def test_symbolic_trip_count():
  n = Variable("n", 1, 64)
  nv = UOp(UOps.DEFINE_VAR, I, (), n)
  end = alu(BinaryOps.MUL, nv, c(16))
  def body(r, inp, out):
    ld = UOp(UOps.LOAD, F, (inp, r))
    x = alu(BinaryOps.ADD, ld, ld, dt=F)
    return [ld, x, UOp(UOps.STORE, None, (out, r, x))]
  prog = [nv, end] + _loop_program(end, body)
  flops, mem = flops_mem(prog)
  assert isinstance(flops, Node) and isinstance(mem, Node)
  for v in (1, 3, 64):
    assert sym_infer(flops, {n: v}) == 16 * v
    assert sym_infer(mem, {n: v}) == 16 * v * 8
  # (n + 2) // 2 trips
  end2 = alu(BinaryOps.IDIV, alu(BinaryOps.ADD, nv, c(2)), c(2))
  f2, _ = flops_mem([nv, end2] + _loop_program(end2, body))
  assert sym_infer(f2, {n: 7}) == 4

def test_unknown_trip_count_counts_once():
  def body(r, inp, out):
    return [UOp(UOps.STORE, None, (out, r, c(1.0, F)))]
  weird = UOp(UOps.LOAD, I, (UOp(UOps.DEFINE_GLOBAL, I, (), (2, "data2", False)), c(0)))
  assert flops_mem(_loop_program(weird, body)) == (0, 4)

def test_index_arithmetic_is_not_counted():
  def body(r, inp, out):
    idx = alu(BinaryOps.ADD, alu(BinaryOps.MUL, r, c(2)), c(1))          # address only
    valid = alu(BinaryOps.CMPLT, r, c(5), dt=dtypes.bool)                   # guard only
    gidx = alu(TernaryOps.WHERE, valid, idx, c(0))
    ld = UOp(UOps.LOAD, F, (inp, gidx, valid, c(0.0, F)))
    both = alu(BinaryOps.ADD, r, c(3))                                      # address and value
    cast = UOp(UOps.CAST, F, (both,))
    val = alu(BinaryOps.ADD, ld, cast, dt=F)
    return [idx.src[0], idx, valid, gidx, ld, both, cast, val, UOp(UOps.STORE, None, (out, both, val))]
  prog = _loop_program(c(8), body)
  assert flops_mem(prog) == (2 * 8, 8 * 8)                     # `both` and `val`
  assert flops_mem(prog, ignore_indexing=False) == (6 * 8, 8 * 8)

def test_catalogue_matmul_estimate_is_2mnk():
  import pytest
  catalogue = pytest.importorskip("catalogue")
  from kernopt.kernel import Kernel
  from kernopt.renderers import get_renderer
  prg = Kernel(catalogue.get("matmul_64").ast, opts=get_renderer("CPU")).to_program()
  assert prg.op_estimate == 2 * 64 ** 3
