"""NEG of a fused multiply-add as a sign-bit flip. gcc 12 folds `-fmaf(a, b, c)` into one fnmsub, -(a*b) - c, which
differs from -(a*b + c) when a*b + c is an exact zero: -(+0.0) is -0.0, but -(a*b) - c gives +0.0 (docs/cpu.md,
"Known miscompiles"). A float32 NEG whose operand is a MULACC becomes BITCAST(XOR(BITCAST(m, int32), 1 << 31)),
the same value for every input, NaN included, which no compiler folds into the FMA. Imports dtype, lazyop, uops and
passes."""
from __future__ import annotations
from typing import Sequence
from kernopt.dtype import dtypes
from kernopt.lazyop import BinaryOps, TernaryOps, UnaryOps
from kernopt.passes.lists import replace_uops
from kernopt.uops import UOp, UOps

_ALU = UOps.ALU

def _is_neg_of_fma(u: UOp) -> bool:
  return u.op is _ALU and u.arg is UnaryOps.NEG and u.dtype == dtypes.float32 and u.src[0].op is _ALU and \
    u.src[0].arg is TernaryOps.MULACC

def sign_bit_negate(uops: Sequence[UOp]) -> list[UOp]:
  """uops with each float32 NEG(MULACC) replaced by a flip of the MULACC's sign bit (new UOps just before it)."""
  if not any(_is_neg_of_fma(u) for u in uops): return list(uops)
  out: list[UOp] = []
  repl: dict[UOp, UOp] = {}
  sign = UOp(UOps.CONST, dtypes.int32, (), -(1 << 31))
  for u in uops:
    if _is_neg_of_fma(u):
      bits = UOp(UOps.BITCAST, dtypes.int32, (u.src[0],))
      flipped = UOp(_ALU, dtypes.int32, (bits, sign), BinaryOps.XOR)
      out += [sign, bits, flipped]
      repl[u] = UOp(UOps.BITCAST, dtypes.float32, (flipped,))
    out.append(u)
  return replace_uops(out, repl)
