"""Deinterleaved loads: a gather of lanes two elements apart in one buffer (a stride-2 convolution's window row)
becomes two overlapping vector loads whose even and odd lanes make the vector. Imports dtype, ops, uops and passes."""
from __future__ import annotations
from typing import Optional, Sequence
from kernopt.dtype import ImageDType, dtypes
from kernopt.ops import BinaryOps, TernaryOps
from kernopt.passes.lists import define_before_use, drop_dead, replace_uops
from kernopt.passes.load_masks import lane_mask, maskable
from kernopt.passes.vectorize import base_offset
from kernopt.uops import UOp, UOps

_LOAD, _VECTORIZE, _GEP, _ALU, _GLOBAL = UOps.LOAD, UOps.VECTORIZE, UOps.GEP, UOps.ALU, UOps.DEFINE_GLOBAL
_WHERE = TernaryOps.WHERE

def stride2_lanes(u: UOp, masked: bool = False) -> Optional[tuple[UOp, UOp, Optional[tuple[UOp, ...]]]]:
  """(buffer, lane 0's index, the lanes' gates or None) when VECTORIZE u gathers n >= 4 (even) scalar loads of one
  global buffer at index i0 + 2*l for lane l: plain loads, or, where `masked`, some of them gated loads whose value is
  +0.0 where closed (load_masks.maskable); else None."""
  n = len(u.src)
  if u.op is not _VECTORIZE or n < 4 or n % 2: return None
  l0, l1 = u.src[0], u.src[1]
  if l0.op is not _LOAD or l1 is l0 or l1.op is not _LOAD: return None   # a broadcast, or not loads
  if l0.src[0].op is not _GLOBAL or isinstance(l0.src[0].dtype, ImageDType): return None
  base, off = base_offset(l0.src[1])
  gated = False
  for i, ln in enumerate(u.src):
    if ln.op is not _LOAD or ln.src[0] is not l0.src[0] or ln.dtype != l0.dtype or \
       base_offset(ln.src[1]) != (base, off + 2 * i): return None
    if len(ln.src) != 2 or (ln.src[1].op is _ALU and ln.src[1].arg is _WHERE):
      if not (masked and len(ln.src) == 4 and maskable(ln)): return None
      gated = True
  if not gated: return l0.src[0], l0.src[1], None
  i0 = l0.src[1].src[1] if l0.src[1].op is _ALU and l0.src[1].arg is _WHERE else l0.src[1]
  return l0.src[0], i0, tuple(ln.src[2] if len(ln.src) == 4 else UOp.const(dtypes.bool, True) for ln in u.src)

def deinterleave(uops: Sequence[UOp], masked: bool = False) -> list[UOp]:
  """Each stride2_lanes gather of n lanes as LOAD(buf, i0) and LOAD(buf, i0 + n - 1), n-lane vectors, and the
  VECTORIZE of lanes 0, 2, .., n-2 of the first and 1, 3, .., n-1 of the second (the renderer spells it as one
  two-vector shuffle). Both loads stay inside [i0, i0 + 2n - 2], the lanes' own span, so they read nothing the gather
  does not; the values are the same elements, so results are bit-identical. Gated lanes (a padded window, where
  `masked`) make both loads masked vector LOADs (buf, index, int32 mask: load_masks.lane_mask) that open only the
  elements the lanes read, each where its lane's gate holds: a closed element is +0.0, as the gated lane's value.
  Scalar lanes and index math nothing reads any more are dropped."""
  uops = list(uops)
  repl: dict[UOp, UOp] = {}
  before: dict[UOp, list[UOp]] = {}
  closed = UOp.const(dtypes.bool, False)
  listed: set[UOp] = set()
  for u in uops:
    if u.op is not _VECTORIZE or u in repl or (hit := stride2_lanes(u, masked)) is None: continue
    buf, i0, gates = hit
    n, vdt = len(u.src), u.dtype
    i1 = UOp(_ALU, i0.dtype, (i0, UOp.const(i0.dtype, n - 1)), BinaryOps.ADD)   # type: ignore[arg-type]
    pre: list[UOp] = [i1.src[1], i1]
    if gates is None: v0, v1 = UOp(_LOAD, vdt, (buf, i0)), UOp(_LOAD, vdt, (buf, i1))
    else:
      # element e of the first load is lane e/2's (e even), of the second lane (e + n - 1)/2's (e odd)
      m0 = lane_mask(tuple(gates[e // 2] if e % 2 == 0 else closed for e in range(n)))
      m1 = lane_mask(tuple(gates[(e + n - 1) // 2] if e % 2 else closed for e in range(n)))
      if not listed: listed.update(uops)
      pre += [x for m in (m0, m1) for x in _ops(m, listed)]
      listed.update(pre)
      v0, v1 = UOp(_LOAD, vdt, (buf, i0, m0)), UOp(_LOAD, vdt, (buf, i1, m1))
    lanes = [UOp(_GEP, u.src[0].dtype, (v0 if l < n // 2 else v1,), 2 * l if l < n // 2 else 2 * l - n + 1)
             for l in range(n)]
    repl[u] = UOp(_VECTORIZE, vdt, tuple(lanes))
    before[u] = [*pre, v0, v1, *lanes]
  if not repl: return uops
  out: list[UOp] = []
  for u in uops:   # at every place u is (the vectorize pass emits a gather again in a sibling IF block)
    if u in before: out.extend(before[u])
    out.append(u)
  return drop_dead(define_before_use(replace_uops(out, repl)))

def _ops(x: UOp, listed: set[UOp]) -> list[UOp]:
  """The UOps of x not in `listed`, sources first (a lane mask's arithmetic; its gates are listed already)."""
  ret: list[UOp] = []
  seen: set[UOp] = set()
  def walk(u: UOp) -> None:
    if u in listed or u in seen: return
    seen.add(u)
    for s in u.src: walk(s)
    ret.append(u)
  walk(x)
  return ret
