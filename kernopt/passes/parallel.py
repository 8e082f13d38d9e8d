"""The parallel-loop choice of a CPU kernel: the outermost loop, when it may run its iterations on several threads
and the kernel does enough work to pay for them, is marked Mark.PARALLEL for the renderer to split. Imports uops and
passes."""
from __future__ import annotations
from typing import Optional, Sequence
from kernopt.passes.lists import replace_uops
from kernopt.uops import Mark, UOp, UOps, flops_mem

def parallel_loop(uops: Sequence[UOp], min_work: int = 0) -> Optional[UOp]:
  """The outermost loop if it is a non-reduce RANGE that no accumulator outside it carries across iterations, in a
  kernel estimated at no less than min_work ALU ops + bytes moved (a symbolic estimate always is)."""
  first = next((i for i, u in enumerate(uops) if u.op is UOps.RANGE), None)
  if first is None or uops[first].arg[1]: return None
  rng = uops[first]
  if any(u.op in (UOps.DEFINE_ACC, UOps.DEFINE_LOCAL, UOps.BARRIER, UOps.SPECIAL) for u in uops[:first]): return None
  flops, mem = flops_mem(uops if isinstance(uops, list) else list(uops))
  if isinstance(flops, int) and isinstance(mem, int) and flops + mem < min_work: return None
  return rng

def parallel(uops: Sequence[UOp], min_work: int = 0) -> list[UOp]:
  """uops with `parallel_loop`'s RANGE marked Mark.PARALLEL (its arg gains the mark as its last field)."""
  rng = parallel_loop(uops, min_work)
  if rng is None: return list(uops)
  return replace_uops(uops, {rng: UOp(UOps.RANGE, rng.dtype, rng.src, rng.arg + (Mark.PARALLEL,))})
