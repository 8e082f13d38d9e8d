"""Linearization: a rewritten SINK placed in execution order, each UOp in the innermost loop it depends on (loop
invariants hoisted), accumulators before their loops, RANGE/ENDRANGE and IF/ENDIF bracketing their bodies.
Imports dtype, uops and patterns."""
from __future__ import annotations
import heapq
from typing import Optional
from kernopt.dtype import dtypes
from kernopt.patterns import toposort
from kernopt.uops import UOp, UOps

_FIRST = {UOps.DEFINE_GLOBAL: 0, UOps.DEFINE_VAR: 1, UOps.DEFINE_LOCAL: 2, UOps.SPECIAL: 3, UOps.CONST: 4}

_DEFINE_GLOBAL, _DEFINE_VAR, _SPECIAL = UOps.DEFINE_GLOBAL, UOps.DEFINE_VAR, UOps.SPECIAL

def _param_key(u: UOp) -> tuple:
  if u.op is _DEFINE_GLOBAL: return (u.arg[0],)
  if u.op is _DEFINE_VAR: return (u.arg.expr,)
  if u.op is _SPECIAL: return (u.arg[1],)
  return ()

def order_uops(sink: UOp) -> list[UOp]:
  """Linearize without rewriting. Loop nesting: non-reduce RANGEs nest by axis, outermost first; the reduce
  RANGEs of an accumulator nest by axis inside all non-reduce RANGEs; a PHI's value is read after its loops."""
  topo = toposort(sink)
  pos = {u: i for i, u in enumerate(topo)}
  # enum members as locals: an attribute of an Enum class costs ~0.15 us on Python 3.11
  RANGE, DEFINE_ACC, PHI, STORE, SINK = UOps.RANGE, UOps.DEFINE_ACC, UOps.PHI, UOps.STORE, UOps.SINK
  ranges = [u for u in topo if u.op is RANGE]
  parent: dict[UOp, Optional[UOp]] = {}
  outer = sorted((u for u in ranges if not u.arg[1]), key=lambda r: r.arg[0])
  for i, r in enumerate(outer): parent[r] = outer[i - 1] if i else None
  innermost_outer = outer[-1] if outer else None
  accs = [u for u in topo if u.op is DEFINE_ACC]
  if len({a.src for a in accs}) > 1: _nest_accumulators(topo, accs, parent)
  for acc in accs:
    rs = sorted(acc.src, key=lambda r: r.arg[0])
    for i, r in enumerate(rs): parent.setdefault(r, rs[i - 1] if i else innermost_outer)
  for u in ranges: parent.setdefault(u, innermost_outer)
  depth: dict[Optional[UOp], int] = {None: 0}
  for r in sorted(parent, key=lambda r: pos[r]): _depth(r, parent, depth)

  def up_to(b: Optional[UOp], d: int) -> Optional[UOp]:
    while depth[b] > d: b = parent[b]  # type: ignore[index]
    return b

  after: dict[UOp, Optional[UOp]] = {}   # the innermost loop u's value is available in
  block: dict[UOp, Optional[UOp]] = {}   # the block u is an item of: a RANGE's parent, else the loop u runs in
  items: dict[Optional[UOp], list[UOp]] = {}
  # the items of u's block that must come before u (a list: a repeated entry counts in the in-degree as often as it
  # releases it, and the emission order depends only on the keys). Both ends of every entry are items of the same
  # block: a source in another block is replaced by the items the two are inside of in their common one.
  deps: dict[UOp, list[UOp]] = {}
  params_first = _FIRST
  # one pass in topological order: a UOp's placement needs only its sources' (and the loop tree)
  for u in topo:
    op = u.op
    if op is RANGE:
      after[u] = u
      bu = block[u] = parent[u]
    elif op is DEFINE_ACC:
      sc: Optional[UOp] = parent[min(u.src, key=depth.__getitem__)]
      # an accumulator's running value is read inside its loops (e.g. as a WMMA's C operand), its final one after
      after[u] = max(u.src, key=depth.__getitem__) if u.src else sc
      bu = block[u] = sc
    else:
      sc, d = None, 0
      for x in u.src:  # the deepest loop among the sources' (the first one on ties)
        if (ax := after[x]) is not None and (dx := depth[ax]) > d: sc, d = ax, dx
      if op is PHI:
        r = max(u.src[0].src, key=depth.__getitem__)
        if depth[r] > d: sc = r
        after[u] = parent[min(u.src[0].src, key=depth.__getitem__)]
      else: after[u] = sc
      bu = block[u] = sc
      if op is SINK: continue
    if (its := items.get(bu)) is None: items[bu] = [u]
    else: its.append(u)
    du = deps.get(u)
    if du is None: du = deps[u] = []
    if op is DEFINE_ACC: continue
    for s in u.src:
      # a parameter or constant (no sources, keys 0-4, in the outermost block) is placed before every UOp that has
      # sources anyway: no entry needed
      if s.op in params_first and not s.src: continue
      bs = block[s]
      if bs is bu:  # the same block (s can't be a loop u is inside: that RANGE is an item of an outer block)
        if s is not u: du.append(s)
        continue
      if s.op is RANGE and up_to(bu, depth[s]) is s: continue  # u is inside loop s
      # walk both positions up to their common block, then order the items there
      a, b = bu, bs
      ia, ib = u, s
      while depth[a] > depth[b]: ia, a = a, parent[a]  # type: ignore[assignment,index]
      while depth[b] > depth[a]: ib, b = b, parent[b]  # type: ignore[assignment,index]
      while a is not b: ia, a, ib, b = a, parent[a], b, parent[b]  # type: ignore[assignment,index]
      if ia is not ib:
        if (di := deps.get(ia)) is None: di = deps[ia] = [ib]
        else: di.append(ib)

  out: list[UOp] = []
  first = _FIRST
  def key(u: UOp) -> tuple:
    # parameters first, in argument order; stores last (gated ones grouped by guard, to share one IF). Every key
    # ends with pos[u], so keys are unique and a heap entry (key, u) never compares UOps
    op = u.op
    if op is STORE: return (10, pos[u.src[3]] if len(u.src) == 4 else -1, pos[u])
    if op in first: return (first[op],) + _param_key(u) + (pos[u],)
    return (9, pos[u])
  heappop, heappush = heapq.heappop, heapq.heappush
  ENDRANGE, IF, ENDIF = UOps.ENDRANGE, UOps.IF, UOps.ENDIF
  def put(u: UOp) -> None:
    op = u.op
    if op is RANGE:
      out.append(u)
      emit(u)
      out.append(UOp(ENDRANGE, None, (u,)))
    elif op is STORE and len(u.src) == 4 and u.src[3].dtype == dtypes.bool:   # (not a masked vector store's lane mask)
      cond = UOp(IF, None, (u.src[3],))
      end = UOp(ENDIF, None, (cond,))
      if out and out[-1] is end: out.insert(len(out) - 1, UOp(STORE, None, u.src[:3]))  # same guard: one IF
      else: out.extend([cond, UOp(STORE, None, u.src[:3]), end])
    else: out.append(u)
  def emit(blk: Optional[UOp]) -> None:
    """The items of blk, each after its dependencies, the smallest key first among those whose dependencies are
    out (Kahn's algorithm on a heap)."""
    mine = items.get(blk, [])
    # in key order: parameters and constants (keys 0-4), the rest in list order (9, pos: items are listed in
    # topological order), stores (10)
    params, plain, stores = [], [], []
    for u in mine:
      op = u.op
      if op is STORE: stores.append(u)
      elif op in first: params.append(u)
      else: plain.append(u)
    if params: params = [u for _, u in sorted([(key(u), u) for u in params])]
    if stores: stores = [u for _, u in sorted([(key(u), u) for u in stores])]
    ordered = params + plain + stores
    # Kahn's algorithm, smallest key first. ordered is in key order, so an item's index is its key; every released
    # item (one that waited) has a smaller index than the next unread one. Items are taken in list order while their
    # dependencies are out; one that isn't is set aside until its last dependency is placed, then enters a heap
    placed: set[UOp] = set()
    waiting: dict[int, int] = {}         # index of an item set aside -> its dependencies not placed yet
    users: dict[UOp, list[int]] = {}     # an unplaced dependency -> the indices of the items waiting on it
    ready: list[int] = []                # heap of the indices of released items
    i, n, done = 0, len(ordered), 0
    while True:
      if ready: u = ordered[heappop(ready)]
      elif i < n:
        u = ordered[i]
        i += 1
        wait = False
        for d in deps[u]:
          if d not in placed:
            wait = True
            break
        if wait:
          c = 0
          for d in deps[u]:
            if d not in placed:
              c += 1
              if (us := users.get(d)) is None: users[d] = [i - 1]
              else: us.append(i - 1)
          waiting[i - 1] = c
          continue
      else: break
      placed.add(u)
      done += 1
      put(u)
      if users and (ws := users.pop(u, None)) is not None:
        for j in ws:
          waiting[j] -= 1
          if waiting[j] == 0: heappush(ready, j)
    if done != n:  # an internal invariant: the lowerer builds no graph whose placement needs this
      raise AssertionError(f"cycle in the UOp graph while linearizing ({n - done} UOps left in a block)")
  emit(None)
  return out

def _nest_accumulators(topo: list[UOp], accs: list[UOp], parent: dict[UOp, Optional[UOp]]) -> None:
  """Accumulators over different loops (several reduces, nested ones): each accumulator's loops nest in the deepest
  loop its update reads besides its own, so a reduce that reads another's loop index runs (and restarts) inside it,
  and one that reads no output loop's index is computed once, before those loops."""
  rdeps: dict[UOp, frozenset] = {}
  for u in topo:
    if u.op is UOps.RANGE: rdeps[u] = frozenset((u,))
    elif u.op is UOps.DEFINE_ACC: rdeps[u] = frozenset()
    elif u.op is UOps.PHI: rdeps[u] = rdeps[u.src[1]] - set(u.src[0].src)
    else: rdeps[u] = frozenset().union(*(rdeps[s] for s in u.src)) if u.src else frozenset()
  update = {u.src[0]: u.src[1] for u in topo if u.op is UOps.PHI}
  # accumulators over the same loops (the lanes of one reduce, sibling reduces) share them: the deepest need wins
  needs: dict[tuple[UOp, ...], frozenset] = {}
  for a in accs:
    rs = tuple(sorted(a.src, key=lambda r: r.arg[0]))
    needs[rs] = needs.get(rs, frozenset()) | (rdeps[update[a]] - set(rs) if a in update else frozenset())
  def depth(r: Optional[UOp]) -> int: return 0 if r is None else 1 + depth(parent[r])
  pending = list(needs)
  while pending:
    ready = [rs for rs in pending if all(r in parent for r in needs[rs])] or pending[:1]
    for rs in ready:
      placed = [r for r in needs[rs] if r in parent]
      enclosing = max(placed, key=depth) if placed else None
      for i, r in enumerate(rs):
        want = rs[i - 1] if i else enclosing
        if parent.setdefault(r, want) is not want:
          raise AssertionError(f"loop {r.arg} of two accumulators nested differently")
      pending.remove(rs)

def _depth(r: Optional[UOp], parent: dict[UOp, Optional[UOp]], depth: dict[Optional[UOp], int]) -> int:
  if r not in depth: depth[r] = _depth(parent[r], parent, depth) + 1  # type: ignore[index]
  return depth[r]
