"""What the passes share on linearized UOp lists: which loads are masked vector loads, where each loop ends, the
kernel axis a loop walks, the tile nests, the value of index math at given loop indices, the index math a value needs,
a list with some UOps replaced, a list whose values are all defined before they are read, and one without dead values.
Imports dtype, ops and uops."""
from __future__ import annotations
from typing import Optional, Sequence
from kernopt.dtype import dtypes
from kernopt.ops import exec_alu
from kernopt.uops import UOp, UOps

_ALU, _CONST, _RANGE, _ENDRANGE, _DEFINE_VAR, _CAST = \
  UOps.ALU, UOps.CONST, UOps.RANGE, UOps.ENDRANGE, UOps.DEFINE_VAR, UOps.CAST
_LOAD, _IF, _ENDIF = UOps.LOAD, UOps.IF, UOps.ENDIF

_I32 = dtypes.int32

def masked_load(u: UOp) -> bool:
  """A masked vector LOAD(buf, index, int32 lane mask): lane t is read where bit t of the mask is set, +0.0
  elsewhere (the lowerer's load of a padded window's or PADTO'd tile's gated lanes)."""
  return u.op is _LOAD and len(u.src) == 3 and ((d := u.src[2].dtype) is _I32 or d == _I32)

def ranges_of(uops: Sequence[UOp]) -> list[int]:
  """The positions of the RANGEs, in list order."""
  return [i for i, u in enumerate(uops) if u.op is _RANGE]

def loop_ends(uops: Sequence[UOp]) -> dict[UOp, int]:
  """Each RANGE -> the position of its ENDRANGE."""
  return {u.src[0]: i for i, u in enumerate(uops) if u.op is _ENDRANGE}

def loop_axis(r: UOp) -> int:
  """The kernel axis a RANGE walks: its arg's first field, or the axis inside the tag the borders pass gives the
  interior copy's loops (("interior", axis))."""
  a = r.arg[0]
  return a[1] if isinstance(a, tuple) else a

def tile_nests(uops: Sequence[UOp]) -> list[tuple[int, int]]:
  """(position of r1, position of rk) for each non-reduce RANGE r1 inside the outermost loop whose body holds exactly
  one RANGE, rk, a reduce: the tile loops of a matmul-like kernel (one, or the interior copy's and the border's when
  the borders pass versioned the tile loop whole), in list order."""
  ranges, ends = ranges_of(uops), loop_ends(uops)
  if not ranges or uops[ranges[0]].arg[1]: return []
  outer_end = ends.get(uops[ranges[0]], -1)
  ret = []
  for j, i1 in enumerate(ranges[1:], 1):
    r1 = uops[i1]
    if r1.arg[1] or (e1 := ends.get(r1, -1)) > outer_end: continue
    inside = [i for i in ranges[j + 1:] if i < e1]
    if len(inside) == 1 and uops[inside[0]].arg[1] and ends.get(uops[inside[0]], e1) < e1: ret.append((i1, inside[0]))
  return ret

def index_value(u: UOp, env: dict[UOp, int], memo: dict[UOp, Optional[int]]) -> Optional[int]:
  """The integer value of index expression u with the loops in env (others at 0); None if it reads memory."""
  if u in memo: return memo[u]
  ret: Optional[int] = None
  if u.op is _CONST and isinstance(u.arg, int): ret = u.arg
  elif u.op is _RANGE or u.op is _DEFINE_VAR: ret = env.get(u, 0)
  # the borders pass's interior copy reads each enclosing loop's index through a CAST to its own dtype
  elif u.op is _CAST and u.dtype is not None and u.dtype == u.src[0].dtype: ret = index_value(u.src[0], env, memo)
  elif u.op is _ALU and u.dtype is not None and u.dtype.count == 1:
    vals = [index_value(s, env, memo) for s in u.src]
    if all(v is not None for v in vals): ret = exec_alu(u.arg, u.src[-1].dtype or u.dtype, tuple(vals))
  memo[u] = ret
  return ret

def reduce_stride(idx: UOp, rng: UOp, memos: Optional[dict[Optional[UOp], dict[UOp, Optional[int]]]] = None) \
    -> Optional[int]:
  """How far index idx moves when loop rng advances by one (the other loops at 0); None if it reads memory. memos:
  index_value's memo per loop advanced (None: none), shared by calls over one list's index expressions."""
  if memos is None: memos = {}
  lo = index_value(idx, {}, memos.setdefault(None, {}))
  hi = index_value(idx, {rng: 1}, memos.setdefault(rng, {}))
  return None if lo is None or hi is None else hi - lo

def closure(u: UOp, stop: set[UOp]) -> list[UOp]:
  """u and the ALU/CONST ops it depends on that are not in `stop`, sources first."""
  ret: list[UOp] = []
  seen: set[UOp] = set()
  def walk(x: UOp) -> None:
    if x in seen or x in stop or x.op not in (_ALU, _CONST): return
    seen.add(x)
    for s in x.src: walk(s)
    ret.append(x)
  walk(u)
  return ret

def substitute(u: UOp, repl: dict[UOp, UOp], memo: dict[UOp, UOp]) -> UOp:
  """u with every UOp in repl replaced (index math only: ALU, CONST and loop variables)."""
  if u in repl: return repl[u]
  if (ret := memo.get(u)) is not None: return ret
  ret = u if not u.src else UOp(u.op, u.dtype, tuple(substitute(s, repl, memo) for s in u.src), u.arg)
  memo[u] = ret
  return ret

def replace_uops(uops: Sequence[UOp], repl: dict[UOp, UOp]) -> list[UOp]:
  """uops with each UOp in repl replaced, and every UOp that reads a replaced one rebuilt to read its replacement.
  One pass in list order, so each replaced UOp must come before its readers: true of every UOp but a reduce RANGE,
  which its accumulators name before the loop opens."""
  out: list[UOp] = []
  new = dict(repl)
  get = new.get
  for u in uops:
    if (n := get(u)) is not None:
      out.append(n)
      continue
    for s in u.src:
      if s in new:
        n = new[u] = UOp(u.op, u.dtype, tuple([get(x, x) for x in u.src]), u.arg)
        out.append(n)
        break
    else: out.append(u)
  return out

_MOVABLE = frozenset((UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.CONST))

def define_before_use(uops: Sequence[UOp]) -> list[UOp]:
  """uops with each pure value (ALU, CAST, CONST) that a UOp reads before the value's place moved up to just before
  that first reader, its own sources first; where the moved copy is not visible at the old place (a sibling IF or loop
  block), it stays there too. A pass that builds a lane mask out of UOps already in the list (a masked load whose mask
  the lowerer also built for a masked store further down) makes such reads; the list is unchanged when it has none."""
  first: dict[UOp, int] = {}
  for i, u in enumerate(uops): first.setdefault(u, i)
  # (a reduce RANGE is named by its accumulators before the loop opens: never moved)
  if all(first[s] < i for i, u in enumerate(uops) for s in u.src if s in first and s.op is not _RANGE):
    return list(uops)
  out: list[UOp] = []
  moved: dict[UOp, tuple[UOp, ...]] = {}   # a value emitted early -> the scope it was emitted in
  done: set[UOp] = set()
  scope: tuple[UOp, ...] = ()
  def ensure(s: UOp, at: int) -> None:
    if s in done or s.op is _RANGE or first.get(s, -1) < at: return
    assert s.op in _MOVABLE, f"{s.op} read before its place"
    for x in s.src: ensure(x, at)
    out.append(s)
    done.add(s)
    moved[s] = scope
  for i, u in enumerate(uops):
    if u.op is _ENDRANGE or u.op is _ENDIF: scope = scope[:-1]
    if (sc := moved.get(u)) is not None and scope[:len(sc)] == sc: continue   # the early copy is visible here
    for s in u.src: ensure(s, i)
    out.append(u)
    done.add(u)
    if u.op is _RANGE or u.op is _IF: scope = scope + (u,)
  return out

_PURE = frozenset((UOps.LOAD, _ALU, _CONST, UOps.GEP, UOps.VECTORIZE, _CAST, UOps.BITCAST))

def drop_dead(uops: list[UOp]) -> list[UOp]:
  """uops without the pure values (loads, ALU, casts, vector lane ops) that nothing kept reads: the scalar lanes and
  index math that packed ops replaced. One backward pass (a value comes before its readers)."""
  live: set[UOp] = set()
  keep = [False] * len(uops)
  for i in range(len(uops) - 1, -1, -1):
    u = uops[i]
    if u.op not in _PURE or u in live:
      keep[i] = True
      live.update(u.src)
  return [u for u, k in zip(uops, keep) if k]
