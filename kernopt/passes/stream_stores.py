"""Non-temporal stores: a kernel whose float32 output is bigger than the caches and written once has its stores
marked Mark.NONTEMPORAL, so they skip the read-for-ownership of every line (the renderer spells them and fences them
before the kernel returns). `stream_loop_stores` is the rule of a CPU kernel made of loops, `stream_grid_stores` that
of a loop-free grid of work-items (PoCL). Imports dtype, uops and passes."""
from __future__ import annotations
from typing import Sequence
from kernopt.dtype import dtypes
from kernopt.passes.lists import replace_uops
from kernopt.uops import Mark, UOp, UOps

# float32 elements a kernel stores before its stores become non-temporal: smaller outputs fit the caches, where the
# next kernel may read them
STREAM_MIN = 1 << 22

def _marked(uops: Sequence[UOp], stores: list[UOp]) -> list[UOp]:
  return replace_uops(uops, {s: UOp(UOps.STORE, None, s.src, Mark.NONTEMPORAL) for s in stores})

# enum members as module constants: an attribute of an Enum class costs ~0.15 us on Python 3.11
_RANGE, _CONST, _STORE, _NOT_ELEMENTWISE = UOps.RANGE, UOps.CONST, UOps.STORE, (UOps.DEFINE_ACC, UOps.DEFINE_LOCAL,
                                                                                 UOps.SPECIAL)

def loop_streams(uops: Sequence[UOp], width: int, min_elements: int = STREAM_MIN) -> bool:
  """An elementwise kernel (no reduce, no accumulator, no local memory) whose float32 outputs, stored only as
  `width`-lane vectors and never read back by it, total at least min_elements elements over constant loops."""
  trips, stored, stored_bufs = 1, 0, set()
  for u in uops:
    op = u.op
    if op is _RANGE:
      lo, hi = u.src
      if u.arg[1] or lo.op is not _CONST or hi.op is not _CONST: return False
      trips *= hi.arg - lo.arg
    elif op in _NOT_ELEMENTWISE: return False
    elif op is _STORE:
      dt = u.src[2].dtype
      if u.src[0].op is not UOps.DEFINE_GLOBAL or u.src[0].dtype != dtypes.float32 or dt is None or \
         dt.count != width or len(u.src) != 3: return False
      stored += dt.count
      stored_bufs.add(u.src[0])
  if any(u.op is UOps.LOAD and u.src[0] in stored_bufs for u in uops): return False
  return stored > 0 and trips * stored >= min_elements

def stream_loop_stores(uops: Sequence[UOp], width: int, min_elements: int = STREAM_MIN) -> list[UOp]:
  """uops with every STORE marked non-temporal when `loop_streams` holds (then every store is a width-lane float32
  vector), else unchanged."""
  if not loop_streams(uops, width, min_elements): return list(uops)
  return _marked(uops, [u for u in uops if u.op is UOps.STORE])

def grid_streams(uops: Sequence[UOp], min_elements: int = STREAM_MIN) -> bool:
  """A loop-free kernel whose work-items (constant SPECIAL sizes) store at least min_elements float32 elements in
  all."""
  if any(u.op is UOps.RANGE for u in uops): return False
  items = 1
  for u in uops:
    if u.op is UOps.SPECIAL:
      if not isinstance(u.arg[2], int): return False
      items *= u.arg[2]
  stores = sum(1 for u in uops if u.op is UOps.STORE and u.src[0].dtype == dtypes.float32)
  return stores > 0 and items * stores >= min_elements

def stream_grid_stores(uops: Sequence[UOp], min_elements: int = STREAM_MIN) -> list[UOp]:
  """uops with the stores to float32 buffers marked non-temporal when `grid_streams` holds, else unchanged. Run
  before vectorize: it counts one element per store."""
  if not grid_streams(uops, min_elements): return list(uops)
  return _marked(uops, [u for u in uops if u.op is UOps.STORE and u.src[0].dtype == dtypes.float32])
