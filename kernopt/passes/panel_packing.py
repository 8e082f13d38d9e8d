"""Panel packing: the streamed operand's panel of a loop-interchanged tile kernel (matmul's B) is copied into a
contiguous stack buffer once per outer iteration and read from there. Imports dtype, ops, uops and passes."""
from __future__ import annotations
from typing import Optional, Sequence
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.ops import BinaryOps
from kernopt.passes.interchange import interchanged
from kernopt.passes.lists import (closure, drop_dead, loop_axis, loop_ends, ranges_of, reduce_stride, substitute,
                                  tile_nests)
from kernopt.uops import ReduceBlock, UOp, UOps, loop_mark

def _block_of(uops: list[UOp], ranges: list[int], rk: UOp) -> Optional[tuple[UOp, int]]:
  """(block RANGE, steps) of reduce loop rk when reduce blocking split it, else None."""
  for i in ranges:
    if isinstance(m := loop_mark(uops[i]), ReduceBlock) and m.of is rk: return uops[i], m.steps
  return None

def panel_packing(uops: Sequence[UOp], max_elements: int) -> list[UOp]:
  """Copy the streamed operand's panel (matmul's B: the loads inside the reduce loop that walk it with a stride > 1
  and depend on the outer loop but not on the tile loop) into a contiguous stack buffer before the tile loop, and
  read it from there. B's rows are N floats apart, so for a power-of-two N the rows of a panel share a handful of
  cache sets and evict one another; packed, the panel is streamed once per outer iteration and then read
  sequentially. Values are copied exactly, so results are unchanged. When reduce blocking split the reduce loop the
  panel holds one block. A gather (VECTORIZE) of loads copied to consecutive panel offsets, the vectorize pass's dot
  lanes, becomes one vector load of the panel. uops unchanged when the kernel isn't a loop-interchanged tile or its
  panel has more than max_elements elements."""
  uops = list(uops)
  if not interchanged(uops): return uops
  ranges = ranges_of(uops)
  nests = tile_nests(uops)
  # the blocked nest when reduce blocking split one (the interior copy's, in a list the borders pass versioned)
  blocked = [n for n in nests if _block_of(uops, ranges, uops[n[1]]) is not None]
  if not (blocked or nests): return uops
  i1, ik = (blocked or nests)[0]
  r1, rk = uops[i1], uops[ik]
  ends = loop_ends(uops)
  if any(s.op is not UOps.CONST or not isinstance(s.arg, int) for s in rk.src): return uops
  block = _block_of(uops, ranges, rk)
  blk, steps = block if block is not None else (None, rk.src[1].arg - rk.src[0].arg)
  allowed = {u for u in (uops[i] for i in ranges) if u is not r1}
  loads: dict[UOp, DType] = {}
  memos: dict = {}   # index_value's, shared by the loads' reduce_stride calls
  LOAD, GLOBAL, RANGE = UOps.LOAD, UOps.DEFINE_GLOBAL, UOps.RANGE   # (an Enum class attribute costs ~0.1 us)
  for u in uops[ik + 1:ends[rk]]:
    if u.op is not LOAD or len(u.src) != 2 or u.src[0].op is not GLOBAL or u in loads: continue
    if isinstance(u.src[0].dtype, ImageDType) or u.dtype is None: continue
    deps = u.src[1].parents | {u.src[1]}
    if rk not in deps or not {d for d in deps if d.op is RANGE} <= allowed: continue
    if (stride := reduce_stride(u.src[1], rk, memos)) is None or abs(stride) <= 1: continue
    loads[u] = u.dtype
  row = sum(dt.count for dt in loads.values())
  if not loads or steps * row > max_elements or len({dt.scalar() for dt in loads.values()}) != 1: return uops
  i32 = dtypes.int32
  c = lambda v: UOp.const(i32, v)  # noqa: E731
  alu = lambda op, a, b: UOp(UOps.ALU, i32, (a, b), op)  # noqa: E731
  panel = UOp(UOps.DEFINE_LOCAL, next(iter(loads.values())).scalar(), (), (f"panel{loop_axis(rk)}", steps * row))
  kk = UOp(UOps.RANGE, i32, (c(0), c(steps)), (f"panel{loop_axis(rk)}", False))
  start: UOp = alu(BinaryOps.MUL, blk, c(steps)) if blk is not None else rk.src[0]
  before = set(uops[:i1])
  copy: list[UOp] = [panel, *[x for x in (c(0), c(steps)) if x not in before], kk]
  memo: dict[UOp, UOp] = {}
  k_at = alu(BinaryOps.ADD, start, kk) if blk is not None or rk.src[0].arg else kk
  rel: UOp = alu(BinaryOps.ADD, rk, alu(BinaryOps.MUL, blk, c(-steps))) if blk is not None else \
    alu(BinaryOps.ADD, rk, c(-rk.src[0].arg)) if rk.src[0].arg else rk
  repl: dict[UOp, list[UOp]] = {}
  offs: dict[UOp, int] = {}   # a scalar load -> its row offset in the panel
  placed = before | set(uops[i1:ik + 1])
  off = 0
  def at_row(i: UOp, o: int) -> UOp:
    return alu(BinaryOps.ADD, alu(BinaryOps.MUL, i, c(row)), c(o)) if o else alu(BinaryOps.MUL, i, c(row))
  for ld, dt in loads.items():
    dst = at_row(kk, off)
    src = substitute(ld.src[1], {rk: k_at}, memo)
    val = UOp(UOps.LOAD, dt, (ld.src[0], src))
    st = UOp(UOps.STORE, None, (panel, dst, val))
    for x in closure(src, before) + closure(dst, before) + [val, st]:
      if x not in copy: copy.append(x)
    at = at_row(rel, off)
    new = UOp(UOps.LOAD, dt, (panel, at))
    repl[ld] = [*closure(at, placed), new]
    placed.update(repl[ld])
    if dt.count == 1: offs[ld] = off
    off += dt.count
  copy.append(UOp(UOps.ENDRANGE, None, (kk,)))
  out = uops[:i1] + copy
  swap: dict[UOp, UOp] = {}
  merged = False
  swapped, get = swap.keys(), swap.get
  for u in uops[i1:]:
    if u in repl:
      out.extend(repl[u])
      swap[u] = repl[u][-1]
      continue
    if not swapped.isdisjoint(u.src):
      if u.op is UOps.VECTORIZE and _consecutive(u.src, offs):
        # the lanes of a gather (the vectorize pass's, of a strided operand) are next to each other in the panel
        swap[u] = u = UOp(LOAD, u.dtype, (panel, swap[u.src[0]].src[1]))
        merged = True
      else: swap[u] = u = UOp(u.op, u.dtype, tuple([get(s, s) for s in u.src]), u.arg)
    out.append(u)
  return drop_dead(out) if merged else out   # without the gathers' scalar panel loads

def _consecutive(lanes: tuple[UOp, ...], offs: dict[UOp, int]) -> bool:
  """Scalar loads copied into the panel at consecutive offsets, in lane order."""
  o0 = offs.get(lanes[0])
  return o0 is not None and all(offs.get(ln) == o0 + t for t, ln in enumerate(lanes))
