"""The shortcuts the codegen hot paths take keep their answers: float UOp interning by value, the emitter's memo of
render_const (with its preamble helpers), and order_uops placing every UOp after its sources."""
import math
import os
import sys
from dataclasses import replace
import pytest
from kernopt.dtype import dtypes
from kernopt.kernel import Kernel
from kernopt.lowerer import lower
from kernopt.renderers.cstyle import CRenderer
from kernopt.renderers.opencl import OpenCLRenderer
from kernopt.uopgraph import linearize
from kernopt.uops import UOp, UOps

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import catalogue  # noqa: E402

F, H = dtypes.float32, dtypes.half

def test_float_consts_intern_by_value_but_keep_signed_zero_and_nan():
  assert UOp.const(F, 1.5) is UOp.const(F, 1.5)
  assert UOp.const(F, 0.0) is UOp.const(F, 0.0)
  assert UOp.const(F, -0.0) is UOp.const(F, -0.0)
  assert UOp.const(F, 0.0) is not UOp.const(F, -0.0)
  assert math.copysign(1, UOp.const(F, -0.0).arg) == -1
  nan = UOp.const(F, float("nan"))
  assert nan is UOp.const(F, float("nan")) and math.isnan(nan.arg)
  assert UOp.const(F, float("inf")) is not UOp.const(F, float("-inf"))
  # a float is never the int of the same value
  assert UOp(UOps.CONST, F, (), 1.0) is not UOp(UOps.CONST, F, (), 1)

def _half_kernel() -> list[UOp]:
  buf = UOp(UOps.DEFINE_GLOBAL, H, (), (0, "data0", True))
  idx, val = UOp.const(dtypes.int32, 0), UOp.const(H, 0.5)
  return [buf, idx, val, UOp(UOps.STORE, None, (buf, idx, val))]

def test_const_memo_registers_helpers_again_on_every_render():
  r = CRenderer()
  first, second = r.render("k", _half_kernel()), r.render("k", _half_kernel())
  assert first == second == CRenderer().render("k", _half_kernel())
  assert "typedef _Float16 ko_half" in second   # the typedef the half constant's spelling registers

def test_const_memo_follows_a_rebound_attribute():
  r = OpenCLRenderer()
  before = r.render("k", _half_kernel())
  r.caps = replace(r.caps, has_fp16=True)
  r.storage_floats = frozenset((dtypes.bfloat16,))
  want = OpenCLRenderer(has_fp16=True).render("k", _half_kernel())
  assert r.render("k", _half_kernel()) == want != before

@pytest.mark.parametrize("name", ["matmul_64", "sum_axis0", "conv2d", "sym_add"])
def test_linearized_uops_follow_their_sources(name):
  names = {c.name for c in catalogue.catalogue("small")}
  if name not in names: pytest.skip(f"no catalogue case {name}")
  for r in (CRenderer(), OpenCLRenderer()):
    k = Kernel(catalogue.get(name).ast, opts=r).required_optimizations()
    k.hand_coded_optimizations()
    uops = linearize(lower(k.get_optimized_ast(), r))
    seen: set[UOp] = set()
    for u in uops:
      # an accumulator is declared before the loops it names
      if u.op is not UOps.DEFINE_ACC: assert all(s in seen for s in u.src), (name, u)
      seen.add(u)
    assert len(seen) == len(uops)
