"""Reduce blocking: the reduce loop of a loop-interchanged tile kernel is split into blocks, the block loop outside
the tile loop, so that one block of the streamed operand is reused by every tile while it is in L2. Imports dtype,
ops, uops and passes."""
from __future__ import annotations
from typing import Optional, Sequence
from kernopt.dtype import ImageDType, dtypes
from kernopt.ops import BinaryOps
from kernopt.passes.interchange import interchanged
from kernopt.passes.lists import closure, loop_ends, loop_axis, tile_nests
from kernopt.uops import ReduceBlock, UOp, UOps

def reduce_blocking(uops: Sequence[UOp], steps: int) -> list[UOp]:
  """Split the reduce of a loop-interchanged tile kernel (outer loop, tile loop, one reduce loop of K) into K/steps
  blocks, the block loop right around the tile loop: each tile's accumulators start block b > 0 from the values
  stored at the end of block b-1 (a float store and load are exact, so every sum is the same sequence of additions).
  The block RANGE's arg ends with ReduceBlock(reduce RANGE, steps): the reduce loop runs from block*steps. A K that
  steps does not divide takes the largest divisor of K in [steps/2, steps] instead (784 -> 196, 1000 -> 250). The
  first tile nest (lists.tile_nests) that is such a tile is blocked: the interior copy's when the borders pass
  versioned the tile loop whole (its border keeps gated stores). uops unchanged when none is, or K has fewer than 4
  blocks."""
  uops = list(uops)
  if not interchanged(uops): return uops
  for i1, ik in tile_nests(uops):
    if (out := _blocked(uops, i1, ik, steps)) is not None: return out
  return uops

def _blocked(uops: list[UOp], i1: int, ik: int, steps: int) -> Optional[list[UOp]]:
  """uops with tile loop uops[i1] blocked over its reduce loop uops[ik], or None when it is not such a tile."""
  r1, rk = uops[i1], uops[ik]
  if any(s.op is not UOps.CONST for s in rk.src): return None
  lo, k = rk.src[0].arg, rk.src[1].arg
  # at least 4 blocks: 1024^3 1 thread 36.5 -> 40.8 and 30.2 -> 35.2 GF/s; 512^3 in 2 blocks measured no faster
  if lo != 0 or not isinstance(k, int): return None
  # a K that steps doesn't divide: 64x784x256, 1 thread, Zen 3, 4 alternated runs: 0.38 -> 0.32 ms (blocks of 196)
  if k % steps: steps = next((d for d in range(steps, (steps + 1) // 2 - 1, -1) if k % d == 0), steps)
  if k < 4 * steps or k % steps: return None
  ends = loop_ends(uops)
  pre, post = uops[i1 + 1:ik], uops[ends[rk] + 1:ends[r1]]
  if any(u.op not in (UOps.ALU, UOps.CONST, UOps.DEFINE_ACC) for u in pre) or \
     any(u.op not in (UOps.ALU, UOps.CONST, UOps.STORE) for u in post): return None
  accs = [u for u in pre if u.op is UOps.DEFINE_ACC]
  loop = uops[ik:ends[rk] + 1]
  phis = {u.src[0]: u for u in loop if u.op is UOps.PHI}
  if len(phis) != len(accs) or sum(u.op is UOps.PHI for u in loop) != len(accs): return None
  stores = [u for u in post if u.op is UOps.STORE]
  stored = [s.src[2] for s in stores]
  # each accumulator stored as is (no conversion: its stored value must read back exactly)
  if any(len(s.src) != 3 or s.src[0].op is not UOps.DEFINE_GLOBAL or isinstance(s.src[0].dtype, ImageDType) or
         s.src[2].dtype is None or s.src[0].dtype != s.src[2].dtype.scalar() for s in stores) or \
     sorted(id(v) for v in stored) != sorted(id(phis.get(a)) for a in accs): return None
  out_bufs = {s.src[0] for s in stores}
  if any(u.op is UOps.LOAD and u.src[0] in out_bufs for u in uops): return None
  # the stores' addresses, computed before the reduce loop (they depend on the outer loops only)
  inside = set(loop)
  before = set(uops[:ik])
  moved: list[UOp] = []
  for s in stores:
    for x in closure(s.src[1], before):
      if x in inside: return None
      if x not in moved: moved.append(x)
  i32 = dtypes.int32
  zero, nblk = UOp.const(i32, 0), UOp.const(i32, k // steps)
  blk = UOp(UOps.RANGE, i32, (zero, nblk), (f"kblock{loop_axis(rk)}", False, ReduceBlock(rk, steps)))
  later = UOp(UOps.ALU, dtypes.bool, (zero, blk), BinaryOps.CMPLT)
  acc_of = {v: v.src[0] for v in stored}
  resume: list[UOp] = [later]
  for s in stores:
    a = acc_of[s.src[2]]
    resume.append(ld := UOp(UOps.LOAD, a.dtype, (s.src[0], s.src[1], later, a)))
    resume.append(UOp(UOps.PHI, a.dtype, (a, ld)))
  moved_set = set(moved)
  return uops[:i1] + [zero, nblk, blk, r1] + pre + moved + resume + loop + [u for u in post if u not in moved_set] + \
    [uops[ends[r1]], UOp(UOps.ENDRANGE, None, (blk,))] + uops[ends[r1] + 1:]
