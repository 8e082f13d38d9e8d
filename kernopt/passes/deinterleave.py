"""Deinterleaved loads: a gather of lanes two elements apart in one buffer (a stride-2 convolution's window row)
becomes two overlapping vector loads whose even and odd lanes make the vector. Imports dtype, ops, uops and passes."""
from __future__ import annotations
from typing import Optional, Sequence
from kernopt.dtype import ImageDType
from kernopt.ops import BinaryOps
from kernopt.passes.lists import replace_uops
from kernopt.passes.vectorize import base_offset, drop_dead
from kernopt.uops import UOp, UOps

_LOAD, _VECTORIZE, _GEP, _ALU, _GLOBAL = UOps.LOAD, UOps.VECTORIZE, UOps.GEP, UOps.ALU, UOps.DEFINE_GLOBAL

def stride2_lanes(u: UOp) -> Optional[tuple[UOp, UOp]]:
  """(buffer, lane 0's index) when VECTORIZE u gathers n >= 4 (even) plain scalar loads of one global buffer at
  index i0 + 2*l for lane l, else None."""
  n = len(u.src)
  if u.op is not _VECTORIZE or n < 4 or n % 2: return None
  l0, l1 = u.src[0], u.src[1]
  if l0.op is not _LOAD or l1 is l0 or l1.op is not _LOAD: return None   # a broadcast, or not loads
  if l0.op is not _LOAD or len(l0.src) != 2 or l0.src[0].op is not _GLOBAL or isinstance(l0.src[0].dtype, ImageDType):
    return None
  base, off = base_offset(l0.src[1])
  for i, ln in enumerate(u.src):
    if ln.op is not _LOAD or len(ln.src) != 2 or ln.src[0] is not l0.src[0] or ln.dtype != l0.dtype or \
       base_offset(ln.src[1]) != (base, off + 2 * i): return None
  return l0.src[0], l0.src[1]

def deinterleave(uops: Sequence[UOp]) -> list[UOp]:
  """Each stride2_lanes gather of n lanes as LOAD(buf, i0) and LOAD(buf, i0 + n - 1), n-lane vectors, and the
  VECTORIZE of lanes 0, 2, .., n-2 of the first and 1, 3, .., n-1 of the second (the renderer spells it as one
  two-vector shuffle). Both loads stay inside [i0, i0 + 2n - 2], the lanes' own span, so they read nothing the gather
  does not; the values are the same elements, so results are bit-identical. Scalar lanes and index math nothing
  reads any more are dropped."""
  uops = list(uops)
  repl: dict[UOp, UOp] = {}
  before: dict[UOp, list[UOp]] = {}
  for u in uops:
    if u in repl or (hit := stride2_lanes(u)) is None: continue
    buf, i0 = hit
    n, vdt = len(u.src), u.dtype
    i1 = UOp(_ALU, i0.dtype, (i0, UOp.const(i0.dtype, n - 1)), BinaryOps.ADD)   # type: ignore[arg-type]
    v0, v1 = UOp(_LOAD, vdt, (buf, i0)), UOp(_LOAD, vdt, (buf, i1))
    lanes = [UOp(_GEP, u.src[0].dtype, (v0 if l < n // 2 else v1,), 2 * l if l < n // 2 else 2 * l - n + 1)
             for l in range(n)]
    repl[u] = UOp(_VECTORIZE, vdt, tuple(lanes))
    before[u] = [i1.src[1], i1, v0, v1, *lanes]
  if not repl: return uops
  out: list[UOp] = []
  for u in uops:   # at every place u is (the vectorize pass emits a gather again in a sibling IF block)
    if u in before: out.extend(before[u])
    out.append(u)
  return drop_dead(replace_uops(out, repl))
