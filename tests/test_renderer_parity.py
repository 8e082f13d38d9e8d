"""Every ALU op x every scalar dtype is either spelled by every C-style dialect (C, OpenCL, CUDA, Metal, AMD) or
refused with UnsupportedError at render time, and whatever a dialect spells the PYTHON interpreter evaluates.
For CUDA the whole batch of spelled ops is compiled with nvcc: a spelled op never becomes a compiler error later."""
import shutil
import numpy as np
import pytest
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps
from kernopt.renderers import get_renderer
from kernopt.runtime.python_alu import alu, reg_dtype
from kernopt.uops import UOp, UOps

DIALECTS = ("C", "OPENCL", "CUDA", "METAL", "AMD")
OPS = [op for group in (UnaryOps, BinaryOps, TernaryOps) for op in group if op not in (UnaryOps.CAST, UnaryOps.BITCAST)]
SCALARS = sorted({dt for dt in dtypes.fields().values() if dt.count == 1}, key=lambda d: (d.priority, d.name))
_ARITY = {**{op: 1 for op in UnaryOps}, **{op: 2 for op in BinaryOps}, **{op: 3 for op in TernaryOps}}

def one_op_uops(op, dt: DType) -> list[UOp]:
  """out[0] = op(in1[0], in2[0], ...): the smallest program holding op on operands of dt (WHERE: a bool condition)."""
  in_dts = [dtypes.bool, dt, dt] if op is TernaryOps.WHERE else [dt] * _ARITY[op]
  out_dt = dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else dt
  out = UOp(UOps.DEFINE_GLOBAL, out_dt, (), (0, "data0", True))
  bufs = [UOp(UOps.DEFINE_GLOBAL, d, (), (i + 1, f"data{i + 1}", False)) for i, d in enumerate(in_dts)]
  idx = UOp.const(dtypes.int32, 0)
  loads = [UOp(UOps.LOAD, d, (b, idx)) for b, d in zip(bufs, in_dts)]
  val = UOp(UOps.ALU, out_dt, tuple(loads), op)
  return [out, *bufs, idx, *loads, val, UOp(UOps.STORE, None, (out, idx, val))]

def render_or_refuse(dialect: str, op, dt: DType):
  try: return get_renderer(dialect).render(f"k_{op.name.lower()}_{dt.name.replace(' ', '_')}", one_op_uops(op, dt))
  except UnsupportedError: return None

def interpret(op, dt: DType):
  in_dts = [dtypes.bool, dt, dt] if op is TernaryOps.WHERE else [dt] * _ARITY[op]
  operands = tuple(np.array([1, 0, 1], dtype=reg_dtype(d)) for d in in_dts)
  try: return alu(op, dt, operands)
  except UnsupportedError: return None

@pytest.fixture(scope="module")
def table() -> dict:
  return {(op, dt): {d: render_or_refuse(d, op, dt) for d in DIALECTS} for op in OPS for dt in SCALARS}

def test_every_op_dtype_is_spelled_or_refused_by_every_dialect(table):
  # render_or_refuse lets only UnsupportedError through: reaching here means no other exception escaped
  assert len(table) == len(OPS) * len(SCALARS)
  spelled = {d: sum(srcs[d] is not None for srcs in table.values()) for d in DIALECTS}
  assert all(n > len(OPS) for n in spelled.values()), spelled

# spelled by the C-style base (kernopt/renderers/cstyle.py) on bool while ops.exec_alu / the interpreter refuse them;
# the fix belongs in the base (refuse these ops on bool) and then this set becomes empty
KNOWN_GAPS: set = set()

def test_what_a_dialect_spells_the_interpreter_evaluates(table):
  gaps = {(op, dt) for (op, dt), srcs in table.items()
          if any(s is not None for s in srcs.values()) and interpret(op, dt) is None}
  assert gaps == KNOWN_GAPS, f"new gaps {gaps - KNOWN_GAPS}, fixed (remove them from KNOWN_GAPS) {KNOWN_GAPS - gaps}"

def test_an_op_is_spelled_by_all_dialects_or_none_except_double_on_metal(table):
  for (op, dt), srcs in table.items():
    spelled = {d for d, s in srcs.items() if s is not None}
    if dt == dtypes.float64 and spelled: spelled.add("METAL")
    assert spelled in (set(), set(DIALECTS)), f"{op.name} on {dt} is spelled only by {sorted(spelled)}"

def test_ops_on_the_common_types_are_spelled_everywhere(table):
  common = (dtypes.int32, dtypes.float32)
  for op in OPS:
    for dt in common:
      if interpret(op, dt) is None: continue
      missing = [d for d, s in table[(op, dt)].items() if s is None]
      float_only = op in (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT)
      bits_only = op in (BinaryOps.XOR, BinaryOps.AND, BinaryOps.OR, BinaryOps.SHL, BinaryOps.SHR)
      if (float_only and dt == dtypes.int32) or (bits_only and dt == dtypes.float32): continue
      assert not missing, f"{op.name} on {dt} is not spelled by {missing}"

def test_dialects_spell_exactly_the_op_tables_domain(table):
  """An op is spelled on a dtype (by the dialects that have the dtype) exactly where the op table defines it: its
  domain (kernopt.alu.DOMAINS) is the one list of which ops apply to floats, ints and bools."""
  from kernopt.alu import defined_on
  wrong = {(op.name, dt.name) for (op, dt), srcs in table.items()
           if any(s is not None for s in srcs.values()) != defined_on(op, dt)}
  assert not wrong, f"spelled where the op table says undefined, or refused where it says defined: {sorted(wrong)}"

def test_metal_refuses_double_and_spells_half(table):
  assert table[(BinaryOps.ADD, dtypes.float64)]["METAL"] is None
  assert table[(BinaryOps.ADD, dtypes.half)]["METAL"] is not None

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: CUDA compile check skipped")
def test_cuda_spelled_ops_compile_with_nvcc(table):
  from kernopt.runtime.cuda import batch_sources, compile_cuda
  srcs = [srcs["CUDA"] for srcs in table.values() if srcs["CUDA"] is not None]
  assert len(srcs) > 100
  assert compile_cuda(batch_sources(srcs), "sm_80", prefer_nvrtc=False, cache=False)
