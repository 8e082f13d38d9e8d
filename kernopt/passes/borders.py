"""Interior/border versioning of padded loads (issue 18), the `borders` pass. A padded convolution's input loads are
gated by comparisons of affine index expressions (the validity `1 <= oy + ky < 57` of a window over a padded input);
over the interior of the output loops every such comparison holds. `interior` finds, from each loop's range and the
affine form of each comparison, the box of output-loop values where gates are provably true; `wants_interior`, the
CPU profile's rule cpu.padded_interior, decides from that plan alone whether to version; `split_borders` versions the
body of the innermost output loop: `if (inside the box) { the body with those gates folded: plain loads } if (!inside)
{ the body as it was }`. Both versions load the same values and compute the same ops in the same order, so results
are bit-identical. Imports dtype, ops, uops, uopgraph and passes."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Callable, Optional, Sequence
from kernopt.dtype import DType, dtypes
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps
from kernopt.passes.interchange import interchanged
from kernopt.passes.lists import masked_load
from kernopt.uopgraph import vmax, vmin
from kernopt.uops import UOp, UOps

_ALU, _CONST, _LOAD, _STORE, _PHI = UOps.ALU, UOps.CONST, UOps.LOAD, UOps.STORE, UOps.PHI
_RANGE, _ENDRANGE, _ACC, _IF, _ENDIF = UOps.RANGE, UOps.ENDRANGE, UOps.DEFINE_ACC, UOps.IF, UOps.ENDIF
_CAST = UOps.CAST
_ADD, _MUL, _CMPLT, _AND, _WHERE = BinaryOps.ADD, BinaryOps.MUL, BinaryOps.CMPLT, BinaryOps.AND, TernaryOps.WHERE
# what a versioned region may hold: the reduce loops, their accumulators, loads, index and value math, stores
_REGION_OPS = frozenset((_ALU, _CONST, _LOAD, _STORE, _PHI, _RANGE, _ENDRANGE, _ACC, UOps.CAST, UOps.BITCAST, _IF,
                         _ENDIF, UOps.VECTORIZE, UOps.GEP))
_INDEX_DTYPES = (dtypes.int32, dtypes.int64)

Affine = tuple[dict[UOp, int], int]

def affine(u: UOp, memo: dict[UOp, Affine]) -> Affine:
  """(coefficients, k) with u == Σ c·leaf + k: ADD, NEG and MUL by a constant of index UOps are looked through; any
  other UOp is a leaf."""
  if (hit := memo.get(u)) is not None: return hit
  ret: Affine = ({u: 1}, 0)
  if u.op is _CONST and type(u.arg) is int: ret = ({}, u.arg)
  elif u.op is _ALU and u.dtype in _INDEX_DTYPES:
    if u.arg is _ADD:
      (a, ka), (b, kb) = affine(u.src[0], memo), affine(u.src[1], memo)
      d = dict(a)
      for x, c in b.items(): d[x] = d.get(x, 0) + c
      ret = ({x: c for x, c in d.items() if c}, ka + kb)
    elif u.arg is _MUL and any(s.op is _CONST and type(s.arg) is int for s in u.src):
      m, other = (u.src[0].arg, u.src[1]) if u.src[0].op is _CONST else (u.src[1].arg, u.src[0])
      a, ka = affine(other, memo)
      ret = ({x: c * m for x, c in a.items()} if m else {}, ka * m)
    elif u.arg is UnaryOps.NEG:
      a, ka = affine(u.src[0], memo)
      ret = ({x: -c for x, c in a.items()}, -ka)
  memo[u] = ret
  return ret

def _span(form: dict[UOp, int], box: dict[UOp, tuple[int, int]]) -> tuple[int, int]:
  """min and max of Σ c·leaf, each leaf over its box entry or else its own bounds."""
  lo = hi = 0
  for x, c in form.items():
    a, b = box[x] if x in box else (vmin(x), vmax(x))
    lo, hi = lo + min(c * a, c * b), hi + max(c * a, c * b)
  return lo, hi

def _gate_atoms(g: UOp) -> list[UOp]:
  """The conjuncts of a gate (an AND tree)."""
  if g.op is _ALU and g.arg is _AND and g.dtype == dtypes.bool: return _gate_atoms(g.src[0]) + _gate_atoms(g.src[1])
  return [g]

def _store_gates(g: UOp) -> list[UOp]:
  """A guarded store's gate, or the gates a masked vector store's int32 lane mask is built of (load_masks.lane_mask:
  CAST(gate) * bits terms, a shared conjunct as a WHERE's condition)."""
  if g.dtype == dtypes.bool: return [g]
  return [x for s in g.src for x in _store_gates(s)] if g.op is _ALU or g.op is _CAST else []

def _less_form(atom: UOp, memo: dict[UOp, Affine]) -> Optional[Affine]:
  """For an index comparison a < b, the form f of a - b (the atom holds iff f <= -1); None for any other atom."""
  if atom.op is not _ALU or atom.arg is not _CMPLT or atom.src[0].dtype not in _INDEX_DTYPES: return None
  (a, ka), (b, kb) = affine(atom.src[0], memo), affine(atom.src[1], memo)
  d = dict(a)
  for x, c in b.items(): d[x] = d.get(x, 0) - c
  form = {x: c for x, c in d.items() if c}
  return None if any(vmin(x) is None for x in form) else (form, ka - kb)

@dataclass(frozen=True)
class Interior:
  """A versioning plan: the region [start, end) of the list (the reduce nest and stores inside `loop`, the innermost
  output loop, or that whole loop when the box does not narrow it), the box (RANGE, lo, hi) of output-loop values
  (lo <= RANGE <= hi) where the `folded` gate atoms all hold, how many of its `gated` loads lose their gate there, the
  box's share of those loops' iterations, and the region's UOps, stored lanes (a vector store counts its lanes, as its
  gated loads do) and accumulators."""
  loop: UOp
  start: int
  end: int
  box: tuple[tuple[UOp, int, int], ...]
  folded: frozenset[UOp]
  gated: int
  ungated: int
  fraction: float
  size: int
  stores: int
  accumulators: int

def _visible(uops: list[UOp], end: int) -> tuple[tuple[UOp, ...], list[UOp]]:
  """The RANGE/IF chain open at position end, and the UOps before it that are in scope there (their own chain is a
  prefix of it: no block holding them closed before end), with the PHIs whose accumulator is in scope: a reduce's
  value after its loops, however deep they nest (the AST fuzzer's seed 31000: a SUM hoisted out of the output loop,
  whose PHI the interior copy re-emitted as a second update of the accumulator; seed 31003: the same over two reduce
  loops)."""
  scope: list[UOp] = []
  for u in uops[:end]:
    if u.op is _ENDRANGE or u.op is _ENDIF: scope.pop()
    if u.op is _RANGE or u.op is _IF: scope.append(u)
  here = tuple(scope)
  vis: list[UOp] = []
  seen: set[UOp] = set()
  depth = ok = 0   # the open chain's depth, and how much of it is a prefix of here
  for u in uops[:end]:
    if u.op is _ENDRANGE or u.op is _ENDIF: depth, ok = depth - 1, min(ok, depth - 1)
    if ok == depth or (u.op is _PHI and u.src[0] in seen):
      vis.append(u)
      seen.add(u)
    if u.op is _RANGE or u.op is _IF:
      if ok == depth and depth < len(here) and here[depth] is u: ok += 1
      depth += 1
  return here, vis

def _const_range(r: UOp) -> bool: return all(s.op is _CONST and type(s.arg) is int for s in r.src)

def _gated(u: UOp) -> bool:
  """A gated load: LOAD(buf, index, gate, alternative), or a masked vector LOAD(buf, index, int32 lane mask)."""
  return u.op is _LOAD and (len(u.src) == 4 or masked_load(u))

def _load_gates(u: UOp) -> list[UOp]:
  """The gates of gated load u: its gate, or those its lane mask is built of."""
  return [u.src[2]] if len(u.src) == 4 else _store_gates(u.src[2])

def _lanes(u: UOp) -> int: return u.dtype.count if u.dtype is not None else 1

def interior(uops: list[UOp]) -> Optional[Interior]:
  """The versioning plan of a linearized list, or None. The list needs exactly one innermost output loop (a non-reduce
  RANGE with no other inside it) holding gated loads; its region runs from the first UOp that is or reads an
  accumulator, a reduce loop or a gated load to the loop's end, and may hold only reduce loops, accumulators, loads,
  ALU ops, stores and IF blocks whose conditions fold in the box. The box narrows each output loop with constant
  bounds by the gate atoms (of loads, stores and IFs: a PADTO'd output axis gates all three) that depend on it alone
  among them (a < b over affine index math), as far as each atom then holds for every value of its other leaves; a
  loop those atoms leave no common value (every tile of it touches a border) is not narrowed. When the box leaves the
  innermost output loop whole and only index math precedes the region in it, the region is that loop, RANGE to
  ENDRANGE."""
  # one scan: each RANGE's end, the RANGE/IF chain open at each output loop, the gated loads' positions
  ends: dict[UOp, int] = {}
  scope: tuple[UOp, ...] = ()
  outs: dict[int, tuple[UOp, ...]] = {}   # output loop position -> the chain open there
  gated_at: list[int] = []
  for i, u in enumerate(uops):
    op = u.op
    if op is _LOAD:
      if len(u.src) == 4 or masked_load(u): gated_at.append(i)
    elif op is _ENDRANGE or op is _ENDIF:
      scope = scope[:-1]
      if op is _ENDRANGE: ends[u.src[0]] = i
    elif op is _RANGE or op is _IF:
      if op is _RANGE and not u.arg[1]: outs[i] = scope
      scope = scope + (u,)
  if not gated_at: return None
  tiles = []
  pos = list(outs)
  for n, i in enumerate(pos):   # (an output loop nested in loop i is the next one listed)
    e = ends.get(uops[i], i)
    if not (n + 1 < len(pos) and pos[n + 1] < e) and any(i < g < e for g in gated_at): tiles.append(i)
  if len(tiles) != 1: return None
  li = tiles[0]
  loop, le = uops[li], ends[uops[li]]
  dep: set[UOp] = set()
  start = -1
  for i in range(li + 1, le):
    u = uops[i]
    op = u.op
    if op is _ACC or (op is _RANGE and u.arg[1]) or (op is _LOAD and (len(u.src) == 4 or masked_load(u))) or \
       any(s in dep for s in u.src):
      dep.add(u)
      if start < 0: start = i
    if start >= 0 and op not in _REGION_OPS: return None
  region = uops[start:le]
  outer = [r for r in outs[li] + (loop,) if r.op is _RANGE and not r.arg[1] and _const_range(r)]
  memo: dict[UOp, Affine] = {}
  gated = [u for u in region if _gated(u)]
  # a gated store (a PADTO'd output axis) narrows the box like a load: its gate folds in the copy too
  ifs = [u.src[0] for u in region if u.op is _IF]
  gates = [g for u in gated for g in _load_gates(u)] + [g for u in region if u.op is _STORE and len(u.src) == 4
                                       for g in _store_gates(u.src[3])] + ifs
  atoms = {a: f for g in gates for a in _gate_atoms(g) if (f := _less_form(a, memo)) is not None}
  box: dict[UOp, tuple[int, int]] = {}
  for (form, k) in atoms.values():
    cands = [x for x in form if x in outer]
    if len(cands) != 1: continue
    c, a = cands[0], form[cands[0]]
    _, rest_hi = _span({x: v for x, v in form.items() if x is not c}, {})
    bound = -1 - k - rest_hi   # a·c <= bound makes the atom hold whatever the other leaves are
    lo, hi = box.get(c, (vmin(c), vmax(c)))
    box[c] = (lo, min(hi, bound // a)) if a > 0 else (max(lo, -(-bound // a)), hi)
  # a loop whose atoms leave it no common value (every tile touches a border) is not narrowed
  box = {c: (lo, hi) for c, (lo, hi) in box.items() if lo <= hi and (lo, hi) != (vmin(c), vmax(c))}
  folded = frozenset(a for a, (form, k) in atoms.items() if _span(form, box)[1] + k <= -1)
  # an IF of the region (the lowerer's block of a PADTO'd tile's edge stores) must vanish from the copy
  if not box or not folded or any(not all(a in folded for a in _gate_atoms(c)) for c in ifs): return None
  # (a masked vector load counts its lanes, as a vector store does)
  ungated = sum(_lanes(u) for u in gated if all(a in folded for g in _load_gates(u) for a in _gate_atoms(g)))
  # a box over enclosing loops only (a PADTO'd outer axis of an interchanged matmul tile) versions the tile loop whole:
  # its IF is met once per outer iteration, and the copy's tile loop is a plain nest that reduce blocking and panel
  # packing take (matmul 1000x1000x999 at width 8: PADTO 16 on the column tiles)
  if loop not in box and _const_range(loop) and all(u.op in (_ALU, _CONST, _CAST) for u in uops[li + 1:start]):
    start, le = li, le + 1
    region = uops[start:le]
  fraction = 1.0
  for c, (lo, hi) in box.items(): fraction *= (hi - lo + 1) / (vmax(c) - vmin(c) + 1)
  order = {r: i for i, r in enumerate(outer)}
  lanes_stored = sum(u.src[2].dtype.count if u.src[2].dtype is not None else 1 for u in region if u.op is _STORE)
  return Interior(loop, start, le, tuple((c, lo, hi) for c, (lo, hi) in sorted(box.items(), key=lambda t: order[t[0]])),
                  folded, sum(_lanes(u) for u in gated), ungated, fraction, len(region), lanes_stored,
                  sum(u.op is _ACC for u in region))

# ***** the rule: cpu.padded_interior, a pure function of the plan (docs/cpu.md, "Padded interiors") *****

# conv2d 1x64x56x56 pad 1 at width 8, 1 thread: masked vector loads 9.1 ms, the same kernel with every mask made
# "all lanes" (wrong at the borders) 4.6 ms; versioned (its interior is 69% of the output loops) 1.33x the masked one
# (benchmarks/bench_borders.py). The body is copied once, so its size bounds the codegen cost
MIN_INTERIOR = 0.25
MAX_VERSIONED = 4096

def wants_interior(plan: Interior, min_interior: float = MIN_INTERIOR, max_versioned: int = MAX_VERSIONED) -> bool:
  """cpu.padded_interior: version a window's padded loads (the body accumulates, or reads at least two gated loads
  per stored lane) when every gated load of the body becomes a plain one in an interior of at least min_interior of the
  tile loops' iterations, and the body has at most max_versioned UOps. (One lane left gated keeps its vector a masked
  load: conv 8x16x32x32 pad 1 tiled by two vectors of 8 measured 1.63 -> 1.56 ms that way; an elementwise pad reads
  one gated load per stored lane and is memory-bound.)"""
  window = plan.accumulators > 0 or plan.gated >= 2 * plan.stores
  return window and plan.ungated == plan.gated and plan.fraction >= min_interior and plan.size <= max_versioned

def borders(uops: Sequence[UOp], min_interior: float = MIN_INTERIOR, max_versioned: int = MAX_VERSIONED) -> list[UOp]:
  """The pass: uops with the padded loads of their tile loop versioned when wants_interior accepts the plan; else
  the list as it is. A list with no gated load is returned after one scan."""
  uops = list(uops)
  if not any(_gated(u) for u in uops): return uops
  if (plan := interior(uops)) is None or not wants_interior(plan, min_interior, max_versioned): return uops
  return split_borders(uops, plan)

# ***** versioning *****

def _fold(u: UOp) -> UOp:
  """u with a True gate folded: x AND True, WHERE(True, a, b), a load or store whose gate is True, and a lane mask's
  CAST(True) * bits + ... folded to a constant (every lane open: a plain masked load or store)."""
  op, src = u.op, u.src
  if op is _ALU:
    arg = u.arg
    if arg is _AND:
      a, b = src
      if a.op is _CONST and a.arg is True: return b
      if b.op is _CONST and b.arg is True: return a
    elif arg is _WHERE:
      if src[0].op is _CONST and src[0].arg is True: return src[1]
    elif (arg is _ADD or arg is _MUL) and all(x.op is _CONST for x in src) and _int32(u.dtype):
      a, b = src[0].arg, src[1].arg
      return UOp.const(dtypes.int32, a + b if arg is _ADD else a * b)
  elif op is _LOAD:
    if len(src) == 4 and src[2].op is _CONST and src[2].arg is True: return UOp(_LOAD, u.dtype, src[:2])
    if len(src) == 3 and src[2].op is _CONST and u.dtype is not None and src[2].arg == (1 << u.dtype.count) - 1:
      return UOp(_LOAD, u.dtype, src[:2])
  elif op is _STORE:
    if len(src) == 4 and src[3].op is _CONST and (src[3].arg is True or src[2].dtype is not None and
                                                 src[3].arg == (1 << src[2].dtype.count) - 1):
      return UOp(_STORE, u.dtype, src[:3])
  elif op is _CAST and src[0].op is _CONST and src[0].arg is True and _int32(u.dtype):
    return UOp.const(dtypes.int32, 1)
  return u

def _int32(dt: Optional[DType]) -> bool: return dt is dtypes.int32 or dt == dtypes.int32

def _box_cond(box: Sequence[tuple[UOp, int, int]]) -> Optional[UOp]:
  """lo <= r <= hi for every (r, lo, hi) of box, as one AND of comparisons (None for an empty box)."""
  cond: Optional[UOp] = None
  for r, lo, hi in box:
    idt = r.dtype or dtypes.int32
    for lhs, rhs in ((UOp.const(idt, lo - 1), r), (r, UOp.const(idt, hi + 1))):
      c = UOp(_ALU, dtypes.bool, (lhs, rhs), _CMPLT)
      cond = c if cond is None else UOp(_ALU, dtypes.bool, (cond, c), _AND)
  return cond

def _reads(body: list[UOp], memo: dict[UOp, UOp], emitted: set[UOp], stop: Optional[UOp] = None) -> set[UOp]:
  """What the copies of body's UOps read that is not emitted yet, through their sources (up to `stop`)."""
  need = {x for u in body if u.op is not _ENDRANGE and (x := memo[u]) not in emitted}
  stack = list(need)
  while stack:
    for x in stack.pop().src:
      if x not in need and x not in emitted and x is not stop:
        need.add(x)
        stack.append(x)
  return need

def _emit_copy(body: list[UOp], fast: Callable[[UOp], UOp], emit: Callable[[UOp], None], emitted: set[UOp],
               out: list[UOp]) -> None:
  """The interior copy of body into out: every IF of the region folds to True in it; an accumulator precedes its
  loops (placed as it is, its sources later); the rest with their sources first."""
  for u in body:
    if u.op is _IF or u.op is _ENDIF: continue
    if u.op in (_ACC, _RANGE, _ENDRANGE):
      x = fast(u) if u.op is not _ENDRANGE else UOp(_ENDRANGE, None, (fast(u.src[0]),))
      emitted.add(x)
      out.append(x)
    else: emit(fast(u))

def _splits_loop(uops: list[UOp], plan: Interior) -> Optional[int]:
  """The position of plan's tile loop when the list is a loop-interchanged tile kernel (a matmul's: reduce blocking
  and panel packing take its tile nests only) whose box narrows that loop (and maybe enclosing ones) to their first
  iterations (PADTO'd axes: only the last tiles hold padding), and only index math precedes the region in the loop:
  the loop can then be split at the box. (A conv's window keeps its IFs: split so, the reference's 64x56 and 16x32
  convs and the catalogue's 8x64x32x32 measured 0.90-0.94x.)"""
  if not interchanged(uops) or all(r is not plan.loop for r, _, _ in plan.box) or not _const_range(plan.loop) or \
     any(lo != vmin(r) for r, lo, _ in plan.box): return None
  li = uops.index(plan.loop)
  if li >= plan.start or any(u.op not in (_ALU, _CONST, _CAST) for u in uops[li + 1:plan.start]): return None
  return li

def split_borders(uops: list[UOp], plan: Optional[Interior] = None, split: bool = True) -> list[UOp]:
  """Version plan's region (interior(uops) when None; uops unchanged when there is none) as `if (box) { interior copy }
  if (!box) { the region }`. The interior copy has its own reduce loops and accumulators, the folded atoms replaced by
  True and folded away, and reads each enclosing loop's index through its own CAST, so every UOp of the copy is its
  own (distinct from the region's; each renders where it is used, as in the unversioned kernel: gcc 12 gives the
  copy's loads separate pointers, spilled, when they share the outer index math that both copies use). The region's
  UOps that read no loop at all move before the IF. When the box narrows the tile loop (`_splits_loop`: a PADTO'd row
  axis of a matmul tile) and `split`, the loop is split instead: a loop over the box's rows runs the copy (behind an
  IF when the box narrows enclosing loops too), a plain tile nest that reduce blocking and panel packing take, and
  the tile loop after it runs the region outside the box only."""
  if plan is None and (plan := interior(uops)) is None: return uops
  li = _splits_loop(uops, plan) if split else None
  region = uops[plan.start:plan.end]
  here, visible = _visible(uops, plan.start)
  # the UOps before the region that it reads: only their copies can be needed
  reads = {s for u in region for s in u.src}
  stack = list(reads)
  while stack:
    for x in stack.pop().src:
      if x not in reads:
        reads.add(x)
        stack.append(x)
  visible = [u for u in visible if u in reads]
  b, true = dtypes.bool, UOp.const(dtypes.bool, True)
  ranges = {u for u in region if u.op is _RANGE}
  memo: dict[UOp, UOp] = {a: true for a in plan.folded}
  for r in here:
    if r.op is _RANGE: memo[r] = UOp(_CAST, r.dtype, (r,))
  if li is not None:   # the copy's own tile loop, over the box
    lo, hi = next((lo, hi) for r, lo, hi in plan.box if r is plan.loop)
    idt = plan.loop.dtype or dtypes.int32
    memo[plan.loop] = UOp(_RANGE, idt, (UOp.const(idt, lo), UOp.const(idt, hi + 1)),
                          (("interior", plan.loop.arg[0]), *plan.loop.arg[1:]))
  # a value a loop closed before the region made (a reduce hoisted out of the tile loop: its accumulator, its PHI and
  # whatever reads them) is read by the copy as it is: rebuilt over the folded gates, it would redo the reduce's update
  # inside the copy, over that closed loop's index (the attention softmax with a PADTO'd query axis: "ridx1 undeclared")
  pinned: set[UOp] = set()
  for u in visible:
    if u.op is _ACC or u.op is _PHI or (u.op is _RANGE and u not in here) or any(s in pinned for s in u.src):
      pinned.add(u)
      memo[u] = u
  if li is not None and pinned & set(uops[li:plan.start]): return split_borders(uops, plan, split=False)
  def fast(u: UOp) -> UOp:
    if (hit := memo.get(u)) is not None: return hit
    # the tag keeps every field of the arg: two reduces' own RANGEs of one axis differ only after the first two
    if u.op is _RANGE: ret = UOp(_RANGE, u.dtype, u.src, (("interior", u.arg[0]), *u.arg[1:])) if u in ranges else u
    elif not u.src: ret = u
    else: ret = _fold(UOp(u.op, u.dtype, tuple([fast(s) for s in u.src]), u.arg))   # interned: unchanged is u itself
    memo[u] = ret
    return ret
  for u in ranges: fast(u)
  # in list order every source is met before its reader (the region's RANGEs, which its accumulators name, are done),
  # so the recursion of fast only starts for a UOp outside both lists
  for u in visible + region:
    if u in memo or u.op is _ENDRANGE: continue
    if not u.src: memo[u] = u
    else:
      src = tuple([memo[x] if x in memo else fast(x) for x in u.src])
      memo[u] = _fold(u if src == u.src else UOp(u.op, u.dtype, src, u.arg))   # (interned: unchanged is u itself)
  if any(u.op is _ACC and fast(u) is u for u in region): return uops   # an accumulator over no loop of the region
  shared = [u for u in region if u.op is not _ENDRANGE and fast(u) is u]
  keep = set(shared)
  body = [u for u in region if u not in keep]
  if li is not None:
    outer = set(uops[:li])
    if any(x not in outer and x not in keep for u in shared for x in u.src): return split_borders(uops, plan, False)
    return _split_loop(uops, plan, li, memo, fast, shared, body, here, visible)
  cond = _box_cond(plan.box)
  assert cond is not None
  inside = UOp(UOps.IF, None, (cond,))
  outside = UOp(UOps.IF, None, (UOp(_ALU, b, (cond, true), BinaryOps.CMPNE),))
  out = uops[:plan.start] + shared
  emitted = set(visible) | keep
  def emit(x: UOp) -> None:
    if x in emitted: return
    for s in x.src:
      if s not in emitted: emit(s)
    emitted.add(x)
    out.append(x)
  emit(outside.src[0])   # both conditions before the first IF: the two blocks then touch (uops.flops_mem counts one)
  emit(inside)
  before = set(out)      # a comparison of the box may also be a gate atom of the region: it is computed once, here
  # what the copy reads from outside the region, rebuilt over the CASTs: at the top of the IF, before any loop opens
  need = _reads(body, memo, emitted)
  for u in here + tuple(visible):
    if (x := fast(u)) in need: emit(x)
  _emit_copy(body, fast, emit, emitted, out)
  out.append(UOp(_ENDIF, None, (inside,)))
  emit(outside)
  return out + [u for u in body if u not in before] + [UOp(_ENDIF, None, (outside,))] + uops[plan.end:]

def _split_loop(uops: list[UOp], plan: Interior, li: int, memo: dict[UOp, UOp], fast: Callable[[UOp], UOp],
                shared: list[UOp], body: list[UOp], here: tuple[UOp, ...], visible: list[UOp]) -> list[UOp]:
  """split_borders' loop split: the region's loop-invariant UOps (`shared`) before the loops, the copy's loop over the
  box's range of the tile loop (memo[plan.loop]; behind IF(the box of the enclosing loops) when it has one) with the
  copy of what precedes the region in the tile loop and of the region, then the tile loop as it was, its region behind
  IF(outside the box)."""
  copy_loop = memo[plan.loop]
  out = uops[:li] + shared
  emitted = set(out)
  def emit(x: UOp) -> None:
    if x in emitted: return
    for s in x.src:
      if s not in emitted: emit(s)
    emitted.add(x)
    out.append(x)
  enclosing = _box_cond([e for e in plan.box if e[0] is not plan.loop])
  if enclosing is not None:
    emit(enclosing)
    out.append(gate := UOp(UOps.IF, None, (enclosing,)))
  for c in copy_loop.src: emit(c)
  # what the copy reads from outside the region: what the loop over the box does not change before it (the enclosing
  # loops' CASTs: the passes after this one copy index math only, up to what precedes the tile loop), the rest at the
  # top of the loop, before any reduce loop opens
  need = _reads(body, memo, emitted, stop=copy_loop)
  reads = [x for u in here + tuple(visible) + tuple(uops[li + 1:plan.start]) if (x := fast(u)) in need]
  for x in reads:
    if copy_loop not in x.parents: emit(x)
  out.append(copy_loop)
  emitted.add(copy_loop)
  for x in reads: emit(x)
  _emit_copy(body, fast, emit, emitted, out)
  out.append(UOp(_ENDRANGE, None, (copy_loop,)))
  if enclosing is not None: out.append(UOp(_ENDIF, None, (gate,)))
  # the tile loop, its region only outside the box
  whole = _box_cond(plan.box)
  assert whole is not None
  outside_box = UOp(_ALU, dtypes.bool, (whole, UOp.const(dtypes.bool, True)), BinaryOps.CMPNE)
  tail = uops[li:plan.start]
  emitted = set(uops[:li]) | set(shared) | set(tail) | ({enclosing} if enclosing is not None else set())
  out += tail
  emit(outside_box)
  guard = UOp(UOps.IF, None, (outside_box,))
  out.append(guard)
  return out + [u for u in body if u not in emitted] + [UOp(_ENDIF, None, (guard,))] + uops[plan.end:]
