"""Lane packing, for the CPU profiles (native C, PoCL). The upcast expansion leaves W scalar lanes per op; GCC's SLP
vectorizer does not start from loop-carried accumulators, so this pass packs them itself: contiguous LOADs and
STOREs, the ALU ops between them, their accumulators and PHIs become one vector op of W lanes each, lane l computing
exactly the scalar op it replaces (same operands, same order). A lane read by an unpacked op is read back with a GEP;
scalar lanes nothing reads any more are dropped. A VECTORIZE gathering a packed load's lanes in order (how the lowerer,
kernopt.lower_vectors, leaves guarded lanes for this pass: the masked load's mask is spelled after the simplifier) is
that load's vector. Accumulators of a reduce unrolled along a vector load's run (dot lanes: lane t adds
a[k+t] * b[...]) become one vector accumulator, their other operand gathered. Works on a linearized UOp list and
returns one. Imports dtype, ops, passes.lists, passes.load_masks and uops."""
from __future__ import annotations
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps
from kernopt.passes.lists import define_before_use, drop_dead
from kernopt.passes.load_masks import maskable, masked_load_mask
from kernopt.uops import UOp, UOps

# enum members as module constants (attribute lookups on the enum classes cost ~0.1 us each in hot loops)
_ALU, _BITCAST, _CAST, _CONST = UOps.ALU, UOps.BITCAST, UOps.CAST, UOps.CONST
_DEFINE_ACC, _DEFINE_GLOBAL = UOps.DEFINE_ACC, UOps.DEFINE_GLOBAL
_ENDIF, _ENDRANGE, _GEP, _IF, _LOAD, _PHI = UOps.ENDIF, UOps.ENDRANGE, UOps.GEP, UOps.IF, UOps.LOAD, UOps.PHI
_RANGE, _STORE, _VECTORIZE = UOps.RANGE, UOps.STORE, UOps.VECTORIZE
_ADD, _MULACC, _WHERE = BinaryOps.ADD, TernaryOps.MULACC, TernaryOps.WHERE
# IDIV on float32 is IEEE division, lane by lane as the scalar op
VECTOR_ALU = frozenset((BinaryOps.ADD, BinaryOps.MUL, BinaryOps.MAX, TernaryOps.MULACC, UnaryOps.EXP2, BinaryOps.IDIV,
                        UnaryOps.NEG))
VECTOR_DTYPES = frozenset((dtypes.float32,))

def _packable(u: UOp) -> bool:
  """An ALU op lanes of which may become one vector op: never the NEG of a MULACC, which sign_bit_negate spells as a
  scalar sign flip (gcc 12 folds a NEG into the FMA, and -0.0 becomes +0.0)."""
  return u.arg in VECTOR_ALU and not (u.arg is UnaryOps.NEG and u.src[0].op is _ALU and u.src[0].arg is _MULACC)

@dataclass
class _Group:
  kind: str                       # "load" | "mload" | "gather" | "alu" | "acc" | "phi" | "store"
  members: tuple[UOp, ...]        # lane l is members[l]
  parts: tuple[Any, ...] = ()     # alu: per operand ("v", group id) | ("s", scalar uop) | ("a", acc group id)
  deps: set[int] = field(default_factory=set)
  live: bool = True

def base_offset(idx: UOp) -> tuple[Optional[UOp], int]:
  """idx as (base, constant offset); base None for a constant index. A gated load's index guarded as
  WHERE(valid, idx, 0) is looked through (such loads are only gathered, never read as a vector)."""
  if idx.op is _ALU and idx.arg is _WHERE: idx = idx.src[1]
  if idx.op is _CONST: return None, idx.arg
  if idx.op is _ALU and idx.arg is _ADD and idx.src[1].op is _CONST and \
     isinstance(idx.src[1].arg, int): return idx.src[0], idx.src[1].arg
  return idx, 0

_KEEP_LANES = ("load", "mload", "gather")   # kinds whose scalar lanes stay in the list for scalar readers

def _index_of(ld: UOp) -> UOp:
  """A load's index with a gate's WHERE(valid, idx, 0) guard looked through."""
  idx = ld.src[1]
  return idx.src[1] if idx.op is _ALU and idx.arg is _WHERE else idx

def _new_index_ops(x: UOp, old: dict[UOp, int], emitted: dict[UOp, tuple], scope: tuple) -> list[UOp]:
  """The ops of mask x that are neither in the original list (`old`) nor emitted yet in this scope, sources first."""
  ret: list[UOp] = []
  def walk(u: UOp) -> None:
    if u in old or emitted.get(u) == scope: return
    for s in u.src: walk(s)
    emitted[u] = scope
    ret.append(u)
  walk(x)
  return ret

_VECTOR_NAMES = frozenset(d.name for d in VECTOR_DTYPES)
_F32 = dtypes.float32
def _vector_dtype(dt: Any) -> bool:
  return dt is _F32 or dt is not None and dt.count == 1 and dt.name in _VECTOR_NAMES and not isinstance(dt, ImageDType)

_VECS: dict[tuple[int, int], tuple[DType, DType]] = {}
def _vec(dt: DType, w: int) -> DType:
  """dt.vec(w), one object per scalar dtype object and width (DType.vec builds a new one, ~1 us)."""
  if (hit := _VECS.get((id(dt), w))) is not None and hit[0] is dt: return hit[1]
  if len(_VECS) > 256: _VECS.clear()
  ret = dt.vec(w)
  _VECS[(id(dt), w)] = (dt, ret)   # the entry keeps dt alive: its id is not reused
  return ret

def _consecutive_loads(lanes: tuple[UOp, ...], masked: bool) -> Optional[str]:
  """Loads of one plain global buffer at consecutive addresses, in lane order: "l" when none is gated (one vector
  load), "ml" when some are and `masked` allows a masked vector load of them (load_masks.maskable), else None."""
  l0 = lanes[0]
  if l0.op is not _LOAD or not _plain_global(l0.src[0]): return None
  base, off = base_offset(l0.src[1])
  plain = True
  for i, ln in enumerate(lanes):
    if ln.op is not _LOAD or ln.src[0] is not l0.src[0] or base_offset(ln.src[1]) != (base, off + i): return None
    if len(ln.src) != 2 or ln.src[1].op is _ALU and ln.src[1].arg is _WHERE:
      if not (masked and maskable(ln)): return None
      plain = False
  return "l" if plain else "ml"

def _plain_global(buf: UOp) -> bool:
  return buf.op is _DEFINE_GLOBAL and not isinstance(buf.dtype, ImageDType)

class _Packer:
  def __init__(self, uops: list[UOp], width: int, masked: bool = False):
    self.uops, self.width, self.masked = uops, width, masked
    self.pos: dict[UOp, int] = {u: i for i, u in enumerate(uops)}
    self.scope: dict[UOp, tuple[UOp, ...]] = {}
    self.users: dict[UOp, list[UOp]] = {}   # read with .get only
    self.todo: list[UOp] = []
    self.loads: list[UOp] = []    # float32 loads of plain global buffers
    self.stores: list[UOp] = []   # ungated stores to plain global buffers
    scopes, users, todo, loads, stores = self.scope, self.users, self.todo, self.loads, self.stores
    scope: tuple[UOp, ...] = ()
    ENDRANGE, ENDIF, RANGE, IF, ALU, LOAD, F32 = _ENDRANGE, _ENDIF, _RANGE, _IF, _ALU, _LOAD, _F32
    get_users = users.get
    for u in uops:
      op = u.op
      if op is ENDRANGE or op is ENDIF: scope = scope[:-1]
      scopes[u] = scope
      if op is RANGE or op is IF: scope = scope + (u,)
      for s in u.src:
        if (us := get_users(s)) is None: users[s] = [u]
        else: us.append(u)
      if op is ALU:
        if _packable(u) and (u.dtype is F32 or _vector_dtype(u.dtype)): todo.append(u)
      elif op is LOAD:
        if (len(u.src) == 2 or len(u.src) == 4) and _vector_dtype(u.dtype) and _plain_global(u.src[0]): loads.append(u)
      elif op is _PHI: todo.append(u)
      elif op is _STORE and len(u.src) == 3 and _plain_global(u.src[0]):
        todo.append(u)
        stores.append(u)
    self.reset(width)

  def reset(self, width: int) -> _Packer:
    """Forget every group, to pack at `width` (the list's analysis above is kept)."""
    self.width = width
    self.groups: list[_Group] = []
    self.of: dict[UOp, tuple[int, int]] = {}
    self.fresh: list[UOp] = []    # members packed since the last step
    self.keys: Optional[dict[UOp, tuple[Any, int]]] = None         # step's key and lane of each candidate op
    self.cands: dict[Any, dict[int, list[UOp]]] = {}                 # key -> lane -> candidate ops
    return self

  def pack(self, loads_first: bool = False) -> list[UOp]:
    """The list with the groups found at this width packed (the list itself when nothing packs). The expression trees
    of contiguous stores are seeded first, then the ops over packed loads; `loads_first` packs from the loads first
    (see `vectorize`)."""
    self.find_loads()
    if loads_first:
      while self.step(): pass
    if self.seed_stores() or not loads_first:
      while self.step(): pass
    if self.seed_dots():
      while self.step(): pass
    self.prune()
    return self.rewrite()

  def add(self, kind: str, members: tuple[UOp, ...], parts: tuple = (), deps: Optional[set[int]] = None) -> int:
    gid = len(self.groups)
    self.groups.append(_Group(kind, members, parts, deps or set()))
    for lane, m in enumerate(members): self.of[m] = (gid, lane)
    self.fresh.extend(members)
    return gid

  # ***** finding groups *****

  def contiguous(self, by_key: dict[Any, dict[int, UOp]]) -> list[tuple[UOp, ...]]:
    """Runs of W consecutive offsets, lowest first."""
    ret = []
    for offs in by_key.values():
      keys, i = sorted(offs), 0
      while i + self.width <= len(keys):
        if keys[i + self.width - 1] - keys[i] == self.width - 1:
          ret.append(tuple(offs[k] for k in keys[i:i + self.width]))
          i += self.width
        else: i += 1
    return ret

  def find_loads(self) -> None:
    """Contiguous ungated loads become one vector load; contiguous gated ones (padding) a gather of the scalars."""
    by_key: dict[Any, dict[int, UOp]] = {}
    for u in self.loads:
      base, off = base_offset(u.src[1])
      by_key.setdefault((u.src[0], base, self.scope[u]), {})[off] = u
    for members in self.contiguous(by_key):
      plain = all(len(m.src) == 2 and not (m.src[1].op is _ALU and m.src[1].arg is _WHERE) for m in members)
      self.add("load" if plain else "mload" if self.masked and all(maskable(m) for m in members) else "gather",
               members)

  def alu_key(self, u: UOp) -> Optional[tuple[Any, int]]:
    lane: Optional[int] = None
    parts: list[Any] = []
    of, accs = self.of, 0
    for s in u.src:
      if (o := of.get(s)) is not None:
        gid, ln = o
        if lane is not None and ln != lane: return None
        lane = ln
        parts.append(("v", gid))
      elif s.op is _DEFINE_ACC:
        parts.append(("a",))
        accs += 1
      else: parts.append(("s", s))
    if lane is None or accs > 1: return None
    return ("alu", u.arg, self.scope[u], tuple(parts)), lane

  def store_key(self, u: UOp) -> Optional[tuple[Any, int]]:
    if u.src[2] not in self.of: return None
    gid, lane = self.of[u.src[2]]
    base, off = base_offset(u.src[1])
    return ("store", u.src[0], base, off - lane, self.scope[u], gid, u.arg), lane

  def found(self, u: UOp) -> Optional[tuple[Any, int]]:
    """(key, lane) of an unpacked op with a packed operand: W ops of one key, one per lane, pack together."""
    of = self.of
    for s in u.src:
      if s in of: break
    else: return None
    if u.op is _ALU: return self.alu_key(u)
    if u.op is _PHI and u.src[0] in of and u.src[1] in of:
      (ga, la), (gv, lv) = of[u.src[0]], of[u.src[1]]
      return (("phi", ga, gv), la) if la == lv else None
    if u.op is _STORE: return self.store_key(u)
    return None

  def step(self) -> bool:
    """Group every op whose operands are packed (W ops of one key, one per lane); True if a group was added. The
    keys are kept between steps: only the users of lanes packed since the last step change key, and only the keys
    they leave or join are tried, in the order of their first op in the list (the order a full pass meets them), so
    a chain of n ops costs n steps of a few ops each rather than n passes over the list."""
    of, keys, cands, pos = self.of, self.keys, self.cands, self.pos
    touched: dict[Any, None] = {}
    if keys is None:
      keys = self.keys = {}
      self.todo_set = set(self.todo)
      dirty = [u for u in self.todo if u not in of]
    else:
      users, todo = self.users, self.todo_set
      dirty = [x for m in self.fresh for x in users.get(m, ()) if x in todo and x not in of]
      for m in self.fresh:
        if (old := keys.pop(m, None)) is not None:
          cands[old[0]][old[1]].remove(m)
          touched[old[0]] = None
    self.fresh = []
    for u in dirty:
      new = self.found(u)
      if (old := keys.get(u)) == new: continue
      if old is not None:
        cands[old[0]][old[1]].remove(u)
        touched[old[0]] = None
      if new is None: del keys[u]
      else:
        keys[u] = new
        cands.setdefault(new[0], {}).setdefault(new[1], []).append(u)
        touched[new[0]] = None
    ready = []
    for key in touched:
      lanes = cands[key]
      if sum(1 for v in lanes.values() if v) != self.width or any(len(v) > 1 for v in lanes.values()): continue
      ready.append((min(pos[v[0]] for v in lanes.values() if v), key))
    added = False
    for _, key in sorted(ready, key=lambda r: r[0]):
      lanes = cands[key]
      if any(not lanes.get(ln) for ln in range(self.width)): continue
      members = tuple(lanes[ln][0] for ln in range(self.width))
      if any(m in self.of for m in members): continue
      if key[0] == "alu": added |= self.add_alu(key[3], members)
      elif key[0] == "phi":
        self.add("phi", members, deps={key[1], key[2]})
        added = True
      else:
        self.add("store", members, deps={key[5]})
        added = True
    return added

  # ***** bottom-up, from contiguous stores *****

  def seed_stores(self) -> bool:
    """W contiguous stores of unpacked values: pack the values' expression trees lane by lane (for tiles whose loads
    overlap, e.g. a conv's window, so the top-down pass finds no anchor)."""
    by_key: dict[Any, dict[int, UOp]] = {}
    for u in self.stores:
      if _vector_dtype(u.src[2].dtype) and u not in self.of and u.src[2] not in self.of:
        base, off = base_offset(u.src[1])
        by_key.setdefault((u.src[0], base, self.scope[u], u.arg), {})[off] = u
    added = False
    for members in self.contiguous(by_key):
      part = self.tree(tuple(m.src[2] for m in members), 0)
      if part is not None and part[0] == "v":
        self.add("store", members, deps={part[1]})
        added = True
    return added

  def seed_dots(self) -> bool:
    """W unpacked accumulators whose updates read lanes 0..W-1 of one packed load at the same operand (a dot product
    unrolled along the load's run: a[k+t] * b[(k+t)*n + j] into accumulator t): one vector accumulator, the other
    operands packed as trees (a strided operand is gathered; panel packing later makes the gather one load). Lane t
    still computes exactly its scalar op; several such sets (one per output j) pair up by their order in the list."""
    of, groups, scope = self.of, self.groups, self.scope
    buckets: dict[Any, dict[int, list[UOp]]] = {}
    for u in self.todo:
      if u.op is not _PHI or u in of or (upd := u.src[1]).op is not _ALU or upd in of or not _packable(upd): continue
      for i, s in enumerate(upd.src):
        if (o := of.get(s)) is not None and groups[o[0]].kind == "load":
          buckets.setdefault((o[0], upd.arg, i, scope[u]), {}).setdefault(o[1], []).append(u)
          break
    added = False
    for lanes in buckets.values():
      if len(lanes) != self.width or len({len(v) for v in lanes.values()}) != 1: continue
      for j in range(len(lanes[0])):
        phis = tuple(lanes[t][j] for t in range(self.width))
        if not any(p in of for p in phis) and self.dot_operands(phis) and self.tree_phi(phis, 0) is not None:
          added = True
    return added

  def dot_operands(self, phis: tuple[UOp, ...]) -> bool:
    """Every operand of the lanes' updates but the accumulator is one value (a broadcast), packed lanes, or plain
    loads (a gather): never a gather of computed scalars, which costs more than the scalar ops it would replace."""
    upds = [p.src[1] for p in phis]
    for i in range(len(upds[0].src)):
      xs = [u.src[i] if len(u.src) > i else None for u in upds]
      if xs[0] is phis[0].src[0] or all(x is xs[0] for x in xs): continue
      if all(x in self.of for x in xs): continue
      if not all(x is not None and x.op is _LOAD and len(x.src) == 2 and _plain_global(x.src[0]) and
                 not (x.src[1].op is _ALU and x.src[1].arg is _WHERE) for x in xs): return False
    return True

  def tree(self, lanes: tuple[UOp, ...], depth: int) -> Optional[tuple]:
    """An operand for lanes: ("s", u) one scalar, ("v", group) packed lanes, ("l", lanes) a vector load of plain loads
    at consecutive addresses some of which another load group holds (a conv window's taps overlap: each tap's vector
    is one unaligned load, not a gather of scalars), ("ml", lanes) the same of gated loads as a masked vector load
    (where the renderer has them), ("g", lanes) a gather; None if the lanes can't be one vector."""
    l0 = lanes[0]
    d0, of = l0.dtype, self.of
    if not _vector_dtype(d0): return None
    # one loop for the cheap tests (generator expressions cost ~1 us each on 8-16 lanes)
    same, n_of = True, 0
    for ln in lanes:
      if ln is not l0:
        same = False
        if ln.dtype is not d0 and ln.dtype != d0: return None
      if ln in of: n_of += 1
    if same: return ("s", l0)
    if n_of == len(lanes):
      gid = of[l0][0]
      if all(of[ln] == (gid, i) for i, ln in enumerate(lanes)): return ("v", gid)
    if n_of and (kind := _consecutive_loads(lanes, self.masked)) is not None: return (kind, lanes)
    if depth > 24 or n_of or len(set(lanes)) != len(lanes): return ("g", lanes)
    scope = self.scope
    s0 = scope.get(l0)
    for ln in lanes:
      if scope.get(ln) != s0: return ("g", lanes)
    op0, arg0, n0 = l0.op, l0.arg, len(l0.src)
    if op0 is _PHI and all(ln.op is _PHI for ln in lanes): return self.tree_phi(lanes, depth)
    if op0 is _ALU and all(ln.op is _ALU and ln.arg is arg0 and len(ln.src) == n0 and _packable(ln) for ln in lanes):
      parts = [self.tree(tuple(ln.src[i] for ln in lanes), depth + 1) for i in range(len(l0.src))]
      if any(p is None for p in parts): return ("g", lanes)
      return ("v", self.add("alu", lanes, tuple(parts), {p[1] for p in parts if p is not None and p[0] == "v"}))
    if all(ln.op is _LOAD and len(ln.src) == 2 and ln.src[0] is l0.src[0] for ln in lanes) and \
       _plain_global(l0.src[0]):
      base, off = base_offset(l0.src[1])
      if all(base_offset(ln.src[1]) == (base, off + i) for i, ln in enumerate(lanes)):
        return ("v", self.add("load", lanes))
    if _consecutive_loads(lanes, self.masked) == "ml": return ("ml", lanes)
    return ("g", lanes)

  def tree_phi(self, lanes: tuple[UOp, ...], depth: int) -> Optional[tuple]:
    """PHI(acc, op(..., acc, ...)) lanes (acc + x, MULACC(a, b, acc)): one vector accumulator, op and PHI, with the
    other operands packed as trees."""
    accs, upds = tuple([ln.src[0] for ln in lanes]), tuple([ln.src[1] for ln in lanes])
    u0 = upds[0]
    if u0.op is not _ALU or u0.arg not in VECTOR_ALU or accs[0] not in u0.src: return None
    at = u0.src.index(accs[0])
    arg0, n0, of = u0.arg, len(u0.src), self.of
    for u, a in zip(upds, accs):  # every lane alike, reading its own accumulator once, none packed yet
      if u.op is not _ALU or u.arg is not arg0 or len(u.src) != n0 or u.src[at] is not a or u.src.count(a) != 1 or \
         a.op is not _DEFINE_ACC or u in of: return None
    if not self.acc_lanes(accs, upds): return None
    others = [self.tree(tuple(u.src[i] for u in upds), depth + 1) for i in range(len(u0.src)) if i != at]
    if any(p is None for p in others): return None
    acc = self.add("acc", accs)
    parts = tuple(others[:at]) + (("a", acc),) + tuple(others[at:])
    alu = self.add("alu", upds, parts, {acc} | {p[1] for p in others if p is not None and p[0] == "v"})
    self.groups[acc].deps.add(alu)
    return ("v", self.add("phi", lanes, deps={acc, alu}))

  def add_alu(self, parts: tuple, members: tuple[UOp, ...]) -> bool:
    deps = {p[1] for p in parts if p[0] == "v"}
    if ("a",) in parts:
      i = parts.index(("a",))
      accs = tuple(m.src[i] for m in members)
      if not self.acc_lanes(accs, members): return False
      acc = self.add("acc", accs)
      parts = parts[:i] + (("a", acc),) + parts[i + 1:]
      gid = self.add("alu", members, parts, deps | {acc})
      self.groups[acc].deps.add(gid)
      return True
    self.add("alu", members, parts, deps)
    return True

  def acc_lanes(self, accs: tuple[UOp, ...], members: tuple[UOp, ...]) -> bool:
    """Distinct alike accumulators, each read only by its lane's op and assigned only by PHI(acc, that op)."""
    if len(set(accs)) != len(accs): return False
    a0, of = accs[0], self.of
    d0, src0, init0 = a0.dtype, a0.src, a0.arg[0]
    for a in accs:
      if a in of or (a.dtype is not d0 and a.dtype != d0) or a.src != src0 or a.arg[0] != init0: return False
    users = self.users
    for a, m in zip(accs, members):
      for x in users.get(a, ()):
        if x is not m and not (x.op is _PHI and x.src == (a, m)): return False
    return True

  # ***** checking placement *****

  def place(self, g: _Group) -> int: return max(map(self.pos.__getitem__, g.members))

  def visible_scope(self, gid: int) -> tuple[UOp, ...]:
    g = self.groups[gid]
    if g.kind == "phi": return self.visible_scope(self.of[g.members[0].src[0]][0])
    return self.scope[g.members[0]]

  def packed(self, u: UOp) -> bool: return u in self.of and self.groups[self.of[u][0]].live

  def replaced(self, u: UOp) -> bool:
    """u is packed and dropped from the list (loads and gathers keep their scalar members for scalar readers; the
    C compiler drops the unread ones)."""
    return self.packed(u) and self.groups[self.of[u][0]].kind not in _KEEP_LANES

  def valid(self, gid: int) -> bool:
    g, groups, scope, of = self.groups[gid], self.groups, self.scope, self.of
    for d in g.deps:
      if not groups[d].live: return False
    sc = scope[g.members[0]]
    for m in g.members:
      if scope[m] is not sc and scope[m] != sc: return False
    if g.kind in _KEEP_LANES: return True
    at, vis = self.place(g), self.visible_scope(gid)
    # a scalar operand (broadcast or gathered) that is a packed lane is read back from a vector placed before
    for p in g.parts:
      for x in ((p[1],) if p[0] == "s" else p[1] if p[0] == "g" else ()):
        if self.replaced(x) and self.place(groups[of[x][0]]) >= at: return False
    pos, users, nvis, acc = self.pos, self.users, len(vis), g.kind == "acc"
    for m in g.members:
      for x in users.get(m, ()):
        if (o := of.get(x)) is not None and groups[o[0]].live: continue
        # x reads lane m as a scalar: only after the vector, where its scope is visible (never an accumulator's)
        if acc or pos[x] <= at or scope[x][:nvis] != vis: return False
    return True

  def prune(self) -> None:
    changed = True
    while changed:
      changed = False
      for gid, g in enumerate(self.groups):
        if g.live and not self.valid(gid):
          g.live, changed = False, True

  # ***** rewriting *****

  def rewrite(self) -> list[UOp]:
    groups = self.groups
    live = [gid for gid, g in enumerate(groups) if g.live]
    if not live: return self.uops
    pos = self.pos
    at: dict[int, int] = {max(map(pos.__getitem__, groups[gid].members)): gid for gid in live}
    # lanes dropped from the list (a load's or gather's lanes stay as scalar loads for scalar readers)
    rep: dict[UOp, tuple[int, int]] = {}
    for gid in live:
      if groups[gid].kind not in _KEEP_LANES:
        for lane, m in enumerate(groups[gid].members): rep[m] = (gid, lane)
    vec: dict[int, UOp] = {}
    new: dict[UOp, UOp] = {}
    gep_scope: dict[tuple[int, int], tuple] = {}
    out: list[UOp] = []
    emitted: dict[UOp, tuple] = {}

    def scalar(s: UOp, sc: tuple) -> UOp:
      """s as its reader in scope sc sees it: a packed lane is read back with a GEP, emitted again unless one emitted
      before is in scope there (a reader in a sibling IF block of the first one's: the borders pass's two copies)."""
      if (gl := rep.get(s)) is None: return new.get(s, s)
      g = UOp(_GEP, s.dtype, (vec[gl[0]],), gl[1])
      if (at := gep_scope.get(gl)) is None or sc[:len(at)] != at:
        gep_scope[gl] = sc
        out.append(g)
      return g

    for i, u in enumerate(self.uops):
      if u.op is _VECTORIZE and (packed := self.group_vector(u)) is not None:
        new[u] = vec[packed]   # the lanes of a packed load gathered in order (the lowerer's): that load's vector
        continue
      if u not in rep:
        for s in u.src:
          if s in rep or s in new:
            nu = UOp(u.op, u.dtype, tuple([scalar(x, self.scope[u]) for x in u.src]), u.arg)
            new[u] = nu
            out.append(nu)
            break
        else: out.append(u)
      if (here := at.get(i)) is not None: self.emit_group(here, vec, scalar, out, emitted)
    return out

  def group_vector(self, u: UOp) -> Optional[int]:
    """The live load group (load, mload or gather) whose lanes VECTORIZE u gathers in lane order, if any."""
    if (o := self.of.get(u.src[0])) is None or o[1] != 0: return None
    g = self.groups[o[0]]
    return o[0] if g.live and g.kind in _KEEP_LANES and g.members == u.src else None

  def emit_group(self, gid: int, vec: dict[int, UOp], scalar: Any, out: list[UOp],
                 emitted: dict[UOp, tuple]) -> None:
    g, w = self.groups[gid], self.width
    m0 = g.members[0]
    sc = self.scope[m0]
    lane = lambda s: scalar(s, sc)  # noqa: E731
    dt: DType = (m0.src[2].dtype if g.kind == "store" else m0.dtype)  # type: ignore[assignment]
    vdt = _vec(dt, w)
    if g.kind == "load": v = UOp(_LOAD, vdt, (lane(m0.src[0]), lane(m0.src[1])))
    elif g.kind == "gather": v = UOp(_VECTORIZE, vdt, tuple(lane(m) for m in g.members))
    elif g.kind == "mload":
      # LOAD(buf, lane 0's index, lane mask): bit l set where lane l's gate holds (see `masked_load_mask`)
      mask = masked_load_mask(g.members)
      out.extend(_new_index_ops(mask, self.pos, emitted, sc))
      v = UOp(_LOAD, vdt, (lane(m0.src[0]), lane(_index_of(m0)), mask))
    elif g.kind == "acc": v = UOp(_DEFINE_ACC, vdt, tuple(lane(s) for s in m0.src), m0.arg)
    elif g.kind == "phi": v = UOp(_PHI, vdt, (vec[self.of[m0.src[0]][0]], vec[self.of[m0.src[1]][0]]))
    elif g.kind == "store":
      v = UOp(_STORE, None, (lane(m0.src[0]), lane(m0.src[1]), vec[self.of[m0.src[2]][0]]), m0.arg)
    else:
      srcs = []
      for p in g.parts:
        if p[0] == "v" or p[0] == "a":
          srcs.append(vec[p[1]])
          continue
        if p[0] == "g": b = UOp(_VECTORIZE, vdt, tuple([lane(x) for x in p[1]]))
        elif p[0] == "l": b = UOp(_LOAD, vdt, (lane(p[1][0].src[0]), lane(p[1][0].src[1])))
        elif p[0] == "ml":
          mask = masked_load_mask(p[1])
          out.extend(_new_index_ops(mask, self.pos, emitted, sc))
          b = UOp(_LOAD, vdt, (lane(p[1][0].src[0]), lane(_index_of(p[1][0])), mask))
        elif p[1].op is _CONST: b = UOp(_CONST, vdt, (), p[1].arg)
        else: b = UOp(_VECTORIZE, vdt, (lane(p[1]),) * w)
        # interned: a broadcast or gather already emitted in this scope is reused
        if emitted.get(b) != sc:
          emitted[b] = sc
          out.append(b)
        srcs.append(b)
      v = UOp(_ALU, vdt, tuple(srcs), m0.arg)
    vec[gid] = v
    out.append(v)

def _scalar_accumulators(uops: list[UOp]) -> int:
  """The float32 accumulators a packed list still holds as scalars."""
  return sum(u.op is _DEFINE_ACC and u.dtype is _F32 for u in uops)

def _has_run(uops: list[UOp], w: int) -> bool:
  """Whether w scalar float loads, or w scalar float stores, of one global buffer and index base sit at consecutive
  offsets: every group the packer finds grows from such a run (find_loads, seed_stores), so without one the list
  has nothing to pack (a list the lowerer built as vectors: its scalar loads are broadcasts and strided weights)."""
  offsets: dict[tuple[UOps, UOp, Optional[UOp]], set[int]] = {}
  for u in uops:
    op, src = u.op, u.src
    if op is _LOAD:
      if len(src) == 3 or not _vector_dtype(u.dtype) or not _plain_global(src[0]): continue
    elif op is not _STORE or len(src) != 3 or not _vector_dtype(src[2].dtype) or not _plain_global(src[0]): continue
    base, off = base_offset(src[1])
    offsets.setdefault((op, src[0], base), set()).add(off)
  for offs in offsets.values():
    if len(offs) < w: continue
    ks = sorted(offs)
    if any(ks[i + w - 1] - ks[i] == w - 1 for i in range(len(ks) - w + 1)): return True
  return False

def half_width(width: int) -> int:
  """The narrower vectors a target of `width` lanes also has (an AVX-512 target's 8-lane ymm vectors), else 0:
  passes_for gives them to vectorize as its fallback, and the CPU heuristics tile a 56-wide conv row with them."""
  return width // 2 if width >= 16 else 0

def vectorize(uops: Sequence[UOp], width: int, masked: bool = False, fallback: int = 0) -> list[UOp]:
  """uops with groups of `width` scalar lanes packed into vector ops (see the module docstring), without the dead
  scalar lanes they leave behind; groups of `fallback` lanes when none of `width` packs (0: none). `masked`:
  contiguous gated loads (padding) become one masked vector LOAD (buf, lane 0's index, int32 lane mask) instead of a
  gather; the renderer must know that form."""
  uops = list(uops)
  if width < 2 or not _has_run(uops, min(width, fallback) if fallback >= 2 else width): return uops
  p = _Packer(uops, width, masked)
  out = p.pack()
  # stores split between scopes (a PADTO'd tile's last lanes stored under an IF, its first ones not: matmul
  # 1000x1000x999 on PoCL at width 16, lanes 0-6 and 7-31) seed packs that straddle the loads' runs and leave most
  # accumulators scalar; packing from the loads first then keeps every accumulator a vector (that kernel 71 -> 20 ms)
  if out is not uops and (left := _scalar_accumulators(out)) > width:
    alt = _Packer(uops, width, masked).pack(loads_first=True)
    if _scalar_accumulators(alt) < left: out = alt
  if out is uops and fallback >= 2: out = p.reset(fallback).pack()
  return out if out is uops else drop_dead(define_before_use(out))
