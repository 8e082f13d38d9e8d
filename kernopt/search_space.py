"""The search's action space: the Opts tried on a kernel, the children one Opt away that stay within the device's
and the search's limits, and the order a round builds them in. Imports errors, helpers, kernel, ops, search_config
and shape_opts."""
from __future__ import annotations
from typing import Any, Optional
from kernopt.errors import KernoptError
from kernopt.helpers import getconfig, prod
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import ast_digest
from kernopt.search_config import SearchConfig, SearchStats
from kernopt.shape_opts import group_buffer_bytes

# the action space: amounts tried for each kind of Opt (0: the whole axis)
UPCAST_AMTS = (0, 2, 3, 4, 5, 7, 8, 16)
UNROLL_AMTS = (0, 2, 3, 4, 5, 7, 8, 16)
LOCAL_AMTS = (2, 3, 4, 8, 13, 16, 29)
GROUP_AMTS = (0, 4, 8, 16)
PADTO_AMTS = (32,)
TC_AXES = 9
# the TC_OPT level of the search's tensor-core actions and of its standard-protocol baseline, whatever the knob: 2
# tries every match, padded ones included
TC_OPT_LEVEL = 2

def actions(k: Kernel, tc_opt: Optional[int] = None) -> list[Opt]:
  """Every Opt the search tries on k: upcasts, unrolls, locals, groups, pads, NOLOCALS and tensor cores (at level
  tc_opt, default the TC_OPT knob) over k's axes. Many are refused by apply_opt; that is how validity is decided."""
  n, r = k.shape_len, max(k.shape_len - k.first_reduce, 0)
  ret = [Opt(OptOps.UPCAST, ax, amt) for amt in UPCAST_AMTS for ax in range(k.first_reduce)]
  ret += [Opt(OptOps.UNROLL, ax, amt) for amt in UNROLL_AMTS for ax in range(r)]
  if k.opts.caps.has_local:
    ret += [Opt(OptOps.LOCAL, ax, amt) for amt in LOCAL_AMTS for ax in range(k.first_reduce)]
    if k.opts.caps.has_shared:
      ret += [Opt(op, ax, amt) for op in (OptOps.GROUP, OptOps.GROUPTOP) for amt in GROUP_AMTS for ax in range(r)]
    ret.append(Opt(OptOps.NOLOCALS))
  ret += [Opt(OptOps.PADTO, ax, amt) for amt in PADTO_AMTS for ax in range(n)]
  if k.opts.caps.tensor_cores and not k.applied_opts:
    level = getconfig().TC_OPT if tc_opt is None else tc_opt
    ret += [Opt(OptOps.TC, ax, level) for ax in range(TC_AXES)]
  return ret

def _upcast_size(k: Kernel) -> int:
  return prod(s for s in k.full_shape[k.shape_len - k.upcasted:] if isinstance(s, int))

def _local_size(k: Kernel) -> int:
  fr = k.first_reduce
  return prod(s for s in k.full_shape[fr - k.local_dims:fr + k.group_for_reduces] if isinstance(s, int))

def _shared_bytes(k: Kernel) -> Any:
  """The shared memory k's GROUP reduce takes (0 without one): the Kernel's own measure of it."""
  return group_buffer_bytes(k) if k.group_for_reduces else 0

def _over_limits(k: Kernel, cfg: SearchConfig, parent_upcast: int = 0) -> bool:
  """Past the device's limits, or past the search's upcast limit (raised to the parent's: a start beyond it, such as
  a device profile's hand-coded tile, still has children that don't grow the tile)."""
  c, shared = k.opts.caps, _shared_bytes(k)
  return _upcast_size(k) > max(cfg.max_upcast_size, parent_upcast) or \
    _local_size(k) > min(cfg.max_local_size, c.max_local_size) or not isinstance(shared, int) or shared > c.shared_max

def expand(k: Kernel, cfg: SearchConfig, seen: set[str], stats: SearchStats) -> list[tuple[str, Kernel]]:
  """The kernels one action away from k that are valid, within the device's limits and not in `seen` (optimized-AST
  digests, updated in place), with their digests."""
  ret = []
  parent_upcast = _upcast_size(k)
  for a in actions(k, TC_OPT_LEVEL):
    if a.amt not in (None, 0) and a.axis is not None:
      real = k.real_axis(a)
      if real < k.shape_len and k.full_shape[real] == a.amt: continue  # the same as amt=0
    k2 = k.copy()
    try:
      k2.apply_opt(a)
      ast = k2.get_optimized_ast()
    except KernoptError: continue
    digest = ast_digest(ast)
    if digest in seen: continue
    seen.add(digest)
    if _over_limits(k2, cfg, parent_upcast):
      stats.pruned += 1
      continue
    ret.append((digest, k2))
  return ret

def _likely(c: Any) -> tuple[int, int]:
  """A cheap guess at how promising a candidate is (lower first): a power-of-two amount of 2-16 before odd ones."""
  o = c.kernel.applied_opts[-1] if c.kernel.applied_opts else None
  amt = o.amt if o is not None and isinstance(o.amt, int) else 0
  return (0 if amt in (4, 2, 8, 16) else 1, (4, 2, 8, 16).index(amt) if amt in (4, 2, 8, 16) else 0)

def _interleave(per_parent: list[list[Any]]) -> list[Any]:
  """The round's candidates in the order to build them, so a budget that ends mid-round has built the likeliest:
  the best parent's first; within a parent, one of each kind of Opt in turn, the likeliest amount of each first."""
  ret = []
  for cands in per_parent:
    kinds: dict[Any, list[Any]] = {}
    for c in cands: kinds.setdefault(c.kernel.applied_opts[-1].op if c.kernel.applied_opts else None, []).append(c)
    queues = [sorted(q, key=_likely) for q in kinds.values()]
    for i in range(max((len(q) for q in queues), default=0)): ret += [q[i] for q in queues if i < len(q)]
  return ret
