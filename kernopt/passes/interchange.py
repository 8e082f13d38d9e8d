"""Loop interchange: the two outermost loops of a tile kernel swap so that the operand streamed through the reduce
(matmul's B) is reused from the caches. `interchanged` tells the later passes a list went through it. Imports uops
and passes."""
from __future__ import annotations
from typing import Sequence
from kernopt.passes.lists import loop_ends, masked_load, ranges_of, reduce_stride
from kernopt.uops import UOp, UOps

_INDEX_MATH = (UOps.ALU, UOps.CONST, UOps.CAST)
_RANGE = UOps.RANGE

def interchange(uops: Sequence[UOp]) -> list[UOp]:
  """Swap the two outermost loops when both are non-reduce, perfectly nested (only index math between them: ALU ops,
  constants, and the CASTs of a lane mask's gates), and
  some load inside walks the reduce loop with a stride > 1 and depends on the inner one but not the outer one
  (matmul's B): each of its panels is then reused by every iteration of the other loop instead of being streamed
  again per tile. Every output element is still computed by the same code in the same order."""
  uops = list(uops)
  ranges, ends = ranges_of(uops), loop_ends(uops)
  if len(ranges) < 3: return uops
  i0, i1 = ranges[0], ranges[1]
  r0, r1 = uops[i0], uops[i1]
  if r0.arg[1] or r1.arg[1] or any(u.op not in _INDEX_MATH for u in uops[i0 + 1:i1]): return uops
  if r0 in r1.parents: return uops
  if r0 not in ends or r1 not in ends or ends[r0] != ends[r1] + 1: return uops
  reduces = [uops[i] for i in ranges if uops[i].arg[1]]
  memos: dict = {}   # the loads' index expressions share their subexpressions: each is evaluated once per loop
  def streamed(ld: UOp) -> bool:
    deps = ld.src[1].parents | {ld.src[1]}
    return r1 in deps and r0 not in deps and \
      any(red in deps and (st := reduce_stride(ld.src[1], red, memos)) is not None and abs(st) > 1 for red in reduces)
  load, glob = UOps.LOAD, UOps.DEFINE_GLOBAL
  if not any(u.op is load and (len(u.src) == 2 or masked_load(u)) and u.src[0].op is glob and streamed(u)
             for u in uops[i1:]): return uops
  body = uops[i1 + 1:ends[r1]]
  return uops[:i0] + [r1, r0] + uops[i0 + 1:i1] + body + [uops[ends[r0]], uops[ends[r1]]] + uops[ends[r0] + 1:]

def interchanged(uops: Sequence[UOp]) -> bool:
  """Whether the two outermost loops over kernel axes run out of axis order. The lowerer nests the non-reduce loops
  by axis, outermost first, so only `interchange` leaves a list so: reduce blocking and panel packing apply to such
  tiles only."""
  axes: list[int] = []
  for u in uops:
    if u.op is _RANGE and not u.arg[1] and isinstance(u.arg[0], int):
      axes.append(u.arg[0])
      if len(axes) == 2: return axes[0] > axes[1]
  return False
