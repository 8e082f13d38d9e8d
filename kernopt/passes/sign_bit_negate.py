"""NEG of a fused multiply-add as a sign-bit flip. gcc 12 folds `-fmaf(a, b, c)` into one fnmsub, -(a*b) - c, which
differs from -(a*b + c) when a*b + c is an exact zero: -(+0.0) is -0.0, but -(a*b) - c gives +0.0 (docs/cpu.md,
"Known miscompiles"). It pushes the negation through what lies between too (`-(c ? y : fmaf(...))`, `-(-(-fmaf(...)))`,
`-(fmaf(...) - 0.0f)`), so a scalar float32 or float64 NEG whose operand reaches a MULACC through float ALU ops
becomes BITCAST(XOR(BITCAST(x, int), sign bit)), the same value for every input, NaN included, which no compiler
folds into the FMA. Imports dtype, lazyop and uops."""
from __future__ import annotations
from typing import Sequence
from kernopt.dtype import DType, dtypes
from kernopt.lazyop import BinaryOps, TernaryOps, UnaryOps
from kernopt.uops import UOp, UOps

_ALU = UOps.ALU
_BITS: dict[DType, DType] = {dtypes.float32: dtypes.int32, dtypes.float64: dtypes.int64}

def _fma_reach(uops: Sequence[UOp]) -> set[UOp]:
  """The float ALU UOps whose value comes from a MULACC through float ALU ops only (one pass: sources come first)."""
  reach: set[UOp] = set()
  for u in uops:
    if u.op is _ALU and u.dtype in _BITS and (u.arg is TernaryOps.MULACC or
                                              any(s in reach for s in u.src if s.dtype == u.dtype)):
      reach.add(u)
  return reach

def _has_alu(uops: Sequence[UOp], arg: object) -> bool:
  for u in uops:
    if u.arg is arg and u.op is _ALU: return True
  return False

def sign_bit_negate(uops: Sequence[UOp]) -> list[UOp]:
  """uops with each scalar float32/float64 NEG of a value that reaches a MULACC replaced by a flip of its sign bit
  (new UOps where the NEG was; every reader of a replaced UOp rebuilt to read its replacement, in one pass)."""
  # no MULACC, or no NEG (most kernels that accumulate): nothing to flip
  if not _has_alu(uops, TernaryOps.MULACC) or not _has_alu(uops, UnaryOps.NEG): return list(uops)
  reach = _fma_reach(uops)
  out: list[UOp] = []
  new: dict[UOp, UOp] = {}
  for u in uops:
    if any(x in new for x in u.src): n = new[u] = UOp(u.op, u.dtype, tuple(new.get(x, x) for x in u.src), u.arg)
    else: n = u
    if u.op is _ALU and u.arg is UnaryOps.NEG and u.src[0] in reach:
      assert u.dtype is not None
      it = _BITS[u.dtype]
      sign = UOp(UOps.CONST, it, (), -(1 << (8 * it.itemsize - 1)))
      bits = UOp(UOps.BITCAST, it, (n.src[0],))
      flipped = UOp(_ALU, it, (bits, sign), BinaryOps.XOR)
      n = new[u] = UOp(UOps.BITCAST, u.dtype, (flipped,))
      out += [sign, bits, flipped]
    out.append(n)
  return out
