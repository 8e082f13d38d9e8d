"""View: one affine window onto a buffer. Element x of a view of `shape` lives at offset + Σ x[i]*strides[i] when
x lies inside `mask` (a half-open box), and reads as invalid outside it. Movement ops return new Views; a reshape
that one view cannot express returns None, and two stacked views merge into one when possible (`merge_views`).
Imports only kernopt.errors, kernopt.helpers and kernopt.shape.symbolic."""
from __future__ import annotations
import functools, operator
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, TypeGuard, cast
from kernopt.errors import ShapeError
from kernopt.helpers import prod
from kernopt.shape.symbolic import MulNode, Node, NumNode, SumNode, Variable, sint, sym_infer

Mask = tuple[tuple[sint, sint], ...]

# ***** helpers on sints: ints compare directly, Nodes only by what their bounds prove *****

def _canon(x: sint) -> sint: return x.b if type(x) is NumNode else x
def _is_int(x: Any) -> TypeGuard[int]: return type(x) is int
def _same(a: sint, b: sint) -> bool: return a == b if type(a) is type(b) else False

def _le(a: sint, b: sint) -> bool:
  """a <= b is provable."""
  if type(a) is int and type(b) is int: return a <= b
  if _same(a, b): return True
  d = b - a
  return (d.min if isinstance(d, Node) else d) >= 0

def _lt(a: sint, b: sint) -> bool:
  """a < b is provable."""
  if type(a) is int and type(b) is int: return a < b
  d = b - a
  return (d.min if isinstance(d, Node) else d) > 0

def _smax(a: sint, b: sint) -> sint:
  if _le(b, a): return a
  if _le(a, b): return b
  raise ShapeError(f"symbolic: cannot decide max({a}, {b})")

def _smin(a: sint, b: sint) -> sint:
  if _le(a, b): return a
  if _le(b, a): return b
  raise ShapeError(f"symbolic: cannot decide min({a}, {b})")

# ***** caching: a bound Variable equals its unbound self, so a cache must not serve one for the other *****

def _bound_in(x: Any) -> bool:
  t = type(x)
  if t is tuple:
    for y in x:   # (a View, the common argument, keeps its answer)
      if type(y) is not int and ((b := y.__dict__.get("_has_bound") if type(y) is View else None) or
                                 (b is None and _bound_in(y))): return True
    return False
  if t is int or x is None: return False
  if isinstance(x, Node): return any(v.val is not None for v in x.vars())
  has_bound = getattr(x, "has_bound", None)
  return bool(has_bound()) if has_bound is not None else False

_CACHES: list[Any] = []

def clear_caches() -> None:
  """Empty every cache of the shape layer (for cold-start measurements)."""
  for c in _CACHES: c.cache_clear()

def cache(fn: Callable) -> Callable:
  """functools.lru_cache for pure functions of Views, shapes and trackers; bypassed when an argument holds a bound
  Variable."""
  cached = functools.lru_cache(maxsize=None)(fn)
  _CACHES.append(cached)
  @functools.wraps(fn)
  def wrapper(*args: Any, **kwargs: Any) -> Any:
    if _bound_in(args) or (kwargs and _bound_in(tuple(kwargs.values()))): return fn(*args, **kwargs)
    return cached(*args, **kwargs)
  return wrapper

# ***** argument checking: every public movement op funnels its argument through one of these *****

def _dim(x: Any, op: str, where: Any) -> sint:
  if type(x) is int:
    if 0 <= x < 1 << 63: return x
  elif isinstance(x, Node):
    if x.min >= 0: return _canon(x)
  elif not isinstance(x, bool) and hasattr(type(x), "__index__"):
    return _dim(operator.index(x), op, where)
  raise ShapeError(f"{op}: dimension {x!r} in {where} must be a non-negative int (int64) or Node")

_LIMIT = 1 << 63   # every int of a view (sizes, strides, offsets, mask bounds) fits an int64

def _int_or_node(x: Any, what: str, where: Any) -> sint:
  if type(x) is int:
    if -_LIMIT <= x < _LIMIT: return x
  elif isinstance(x, Node): return _canon(x)
  elif not isinstance(x, bool) and hasattr(type(x), "__index__"): return _int_or_node(operator.index(x), what, where)
  raise ShapeError(f"View.create: {what} {x!r} in {where!r} must be an int (int64) or Node")

def _ints_or_nodes(xs: Any, what: str, shape: tuple[sint, ...]) -> tuple[sint, ...]:
  if type(xs) is not tuple or not all(type(x) is int and -_LIMIT <= x < _LIMIT for x in xs):
    xs = tuple(_int_or_node(x, what, xs) for x in _as_tuple(xs, f"View.create {what}", shape))
  if len(xs) != len(shape): raise ShapeError(f"View.create: {what} {xs} need one entry per axis of shape {shape}")
  return xs

def _check_mask(mask: Any, shape: tuple[sint, ...]) -> Mask:
  pairs = tuple(_as_tuple(m, "View.create mask", shape) for m in _as_tuple(mask, "View.create mask", shape))
  if len(pairs) != len(shape) or any(len(p) != 2 for p in pairs):
    raise ShapeError(f"View.create: mask {pairs!r} needs one (begin, end) pair per axis of shape {shape}")
  ret = tuple((_int_or_node(b, "mask bound", pairs), _int_or_node(e, "mask bound", pairs)) for b, e in pairs)
  for (b, e), s in zip(ret, shape):
    if any(type(x) is int and not (0 <= x and (type(s) is not int or x <= s)) for x in (b, e)):
      raise ShapeError(f"View.create: mask {ret} is outside shape {shape} (each bound in [0, size])")
  return ret

def _as_tuple(arg: Any, op: str, shape: tuple[sint, ...]) -> tuple:
  try: return tuple(arg)
  except TypeError: raise ShapeError(f"{op}: argument {arg!r} for shape {shape} is not a sequence") from None

def _as_ints(arg: Any, op: str, shape: tuple[sint, ...]) -> tuple[int, ...]:
  """arg as a tuple of ints (numpy integers become ints; bools, floats and Nodes are refused before any cache)."""
  ret = _as_tuple(arg, op, shape)
  if all(type(x) is int for x in ret): return ret
  if any(isinstance(x, bool) or not hasattr(type(x), "__index__") for x in ret):
    raise ShapeError(f"{op}: argument {arg!r} for shape {shape} must hold ints")
  return tuple(operator.index(x) for x in ret)

def _as_shape(arg: Any, op: str, shape: tuple[sint, ...]) -> tuple[sint, ...]:
  if type(arg) is tuple and all(type(x) is int and 0 <= x < _LIMIT for x in arg): return arg   # (the common case)
  return tuple(_dim(x, op, arg) for x in _as_tuple(arg, op, shape))

def _as_pairs(arg: Any, op: str, shape: tuple[sint, ...]) -> tuple[tuple[sint, sint], ...]:
  pairs = tuple(_as_tuple(p, op, shape) for p in _as_tuple(arg, op, shape))
  if len(pairs) != len(shape) or any(len(p) != 2 for p in pairs):
    raise ShapeError(f"{op}: argument {arg!r} needs one (begin, end) pair per axis of shape {shape}")
  return tuple((_dim(b, op, arg), _dim(e, op, arg)) for b, e in pairs)

# ***** pure functions of shapes *****

@cache
def strides_for_shape(shape: tuple[sint, ...]) -> tuple[sint, ...]:
  """C-contiguous strides of shape, with 0 for each size-1 axis."""
  acc: sint = 1
  ret: list[sint] = []
  for s in reversed(shape):
    ret.append(0 if _same(s, 1) else acc)
    acc = _canon(acc * s)
  return tuple(reversed(ret))

def un1d(shape: tuple[int, ...], offs: int) -> list[int]:
  """The coordinates of flat position offs in a C-contiguous shape (the outermost one absorbs any overflow)."""
  ret = []
  for st in strides_for_shape(shape):
    here = offs // st if st else 0
    ret.append(here)
    offs -= here * st
  return ret

@cache
def _merge_dims(shape: tuple[sint, ...], strides: tuple[sint, ...], mask: Optional[Mask]) -> tuple[tuple, ...]:
  """Groups of adjacent axes that act as one: (size, innermost stride, real size). An outer axis joins when its
  stride is size*stride of the group, or when it is zero-strided with one valid position (`pinned`); the real size
  is then the part of the group under the pinned prefix, the only part that moves through memory."""
  ret: list[list] = []
  pinned = False
  for i, (sh, st) in enumerate(zip(shape, strides)):
    if _same(sh, 1) and ret: continue
    if ret and (pinned or _same(ret[-1][1], _canon(sh * st))):
      size, _, real = ret[-1]
      ret[-1] = [_canon(size * sh), st, (sh if pinned else _canon(real * sh)) if not _same(st, 0) else 0]
    else: ret.append([sh, st, sh if not _same(st, 0) else 0])
    m = mask[i] if mask is not None else (0, sh)
    pinned = _same(st, 0) and _same(_canon(m[1] - m[0]), 1)
  return tuple(tuple(g) for g in ret)

def _reshape_strides(groups: tuple[tuple, ...], new_shape: tuple[sint, ...]) -> Optional[list[sint]]:
  """Strides for new_shape when each merged group is split into whole new axes, else None."""
  strides: list[sint] = []
  r_new = list(reversed(new_shape))
  pos = 0
  for size, stride, real in reversed(groups):
    acc: sint = 1
    while not _same(acc, size):
      if pos == len(r_new): return None
      nd = r_new[pos]
      pos += 1
      strides.append(stride)
      if _same(nd, 1): continue
      acc = _canon(acc * nd)
      if not _same(acc, size) and not _lt(acc, size): return None
      stride = _canon(stride * nd) if _same(real, size) or _lt(acc, real) else 0
  if any(not _same(s, 1) for s in r_new[pos:]): return None
  strides += [0] * (len(new_shape) - len(strides))
  return strides[::-1]

def _flat_interval(shape: Sequence[int], mask: Sequence[tuple[int, int]]) -> Optional[tuple[int, int]]:
  """The mask box of an axis group as one flat interval [lo, hi), or None when the box is not contiguous."""
  lo, hi, span = 0, 1, 1
  for s, (b, e) in zip(reversed(shape), reversed(mask)):
    if lo == 0 and hi == span: lo, hi = b * span, e * span
    elif e - b == 1: lo, hi = lo + b * span, hi + b * span
    else: return None
    span *= s
  return lo, hi

def _split_interval(shape: Sequence[int], lo: int, hi: int) -> Optional[list[tuple[int, int]]]:
  """The flat interval [lo, hi) of a group as a box over shape (full inside, one partial axis, pinned outside)."""
  inner = [1] * len(shape)
  for i in range(len(shape) - 2, -1, -1): inner[i] = inner[i + 1] * shape[i + 1]
  for k in range(len(shape) - 1, -1, -1):
    cs, n = inner[k], shape[k]
    if lo % cs or hi % cs: return None
    if lo // (cs * n) == (hi - 1) // (cs * n):
      return [(lo // inner[i] % shape[i], lo // inner[i] % shape[i] + 1) if i < k else
              (lo // cs % n, (hi - 1) // cs % n + 1) if i == k else (0, shape[i]) for i in range(len(shape))]
  return None

def _reshape_mask(shape: tuple[sint, ...], mask: Mask, new_shape: tuple[sint, ...]) -> Optional[Mask]:
  """mask (not empty) expressed over new_shape, or None when the valid box does not stay a box."""
  if not all(_is_int(x) for x in shape + new_shape) or not all(_is_int(x) for m in mask for x in m): return None
  return _reshape_int_mask(cast(tuple[int, ...], shape), cast(tuple[tuple[int, int], ...], mask),
                           cast(tuple[int, ...], new_shape))

def _reshape_int_mask(shape: tuple[int, ...], mask: tuple[tuple[int, int], ...],
                      new_shape: tuple[int, ...]) -> Optional[Mask]:
  old = [(s, m) for s, m in zip(shape, mask) if s != 1]
  new = [i for i, s in enumerate(new_shape) if s != 1]
  ret: list[tuple[int, int]] = [(0, 1)] * len(new_shape)
  i = j = 0
  while i < len(old):
    gi, gj, po, pn = [old[i]], [new[j]], old[i][0], new_shape[new[j]]
    i, j = i + 1, j + 1
    while po != pn:
      if po < pn: gi.append(old[i]); po *= old[i][0]; i += 1
      else: gj.append(new[j]); pn *= new_shape[new[j]]; j += 1
    interval = _flat_interval([s for s, _ in gi], [m for _, m in gi])
    if interval is None: return None
    box = _split_interval([new_shape[k] for k in gj], *interval)
    if box is None: return None
    for k, m in zip(gj, box): ret[k] = m
  return tuple(ret)

# ***** View *****

@dataclass(frozen=True)
class View:
  """shape, strides, offset, mask (None: all valid) and contiguous (offset 0, C strides, no mask; or no elements).
  Build only with View.create, which canonicalises so that equal index maps compare equal as often as possible.
  `contiguous` is derived from the other fields: a value passed to the constructor is ignored."""
  shape: tuple[sint, ...]
  strides: tuple[sint, ...]
  offset: sint
  mask: Optional[Mask]
  contiguous: bool = False

  def __post_init__(self) -> None:
    object.__setattr__(self, "contiguous", _is_contiguous(self.shape, self.strides, self.offset, self.mask))

  @staticmethod
  def create(shape: Sequence[sint], strides: Optional[Sequence[sint]] = None, offset: sint = 0,
             mask: Optional[Sequence[tuple[sint, sint]]] = None) -> View:
    """The canonical View: stride 0 on size-1 axes and on axes with one valid position, no mask when it covers
    everything, and one all-masked form for a mask that selects nothing."""
    # checked before the cache: 4.0 == 4 and True == 1 hash alike, so a cache hit would accept them
    if type(shape) is not tuple or not all(type(s) is int and 0 <= s < _LIMIT for s in shape):
      shape = _as_shape(shape, "View.create", ())
    if strides is not None: strides = _ints_or_nodes(strides, "strides", shape)
    if type(offset) is not int or not -_LIMIT <= offset < _LIMIT: offset = _int_or_node(offset, "offset", offset)
    if mask is not None: mask = _check_mask(mask, shape)
    return _create(shape, strides, offset, mask)

  def __hash__(self) -> int:
    h = self.__dict__.get("_hash")
    if h is None: object.__setattr__(self, "_hash", h := hash((self.shape, self.strides, self.offset, self.mask)))
    return h

  def has_bound(self) -> bool:
    """Whether any field holds a bound Variable."""
    b = self.__dict__.get("_has_bound")
    if b is None:
      b = _bound_in((self.shape, self.strides, self.offset, self.mask))
      object.__setattr__(self, "_has_bound", b)
    return b

  def size(self) -> sint: return _canon(prod(self.shape))

  def vars(self) -> set[Variable]:
    flat = self.shape + self.strides + (self.offset,) + (tuple(x for m in self.mask for x in m) if self.mask else ())
    return set().union(*[x.vars() for x in flat if isinstance(x, Node)])

  def unbind(self) -> tuple[View, dict[Variable, int]]:
    """This view with every bound Variable replaced by its unbound self, and the values they were bound to."""
    vals = {v.unbind()[0]: v.val for v in self.vars() if v.val is not None}
    if not vals: return self, {}
    # a bound Variable equals its unbound self, so the caches cannot tell the two apart: build the View directly
    sub: dict[Variable, Any] = {v: v for v in vals}
    f = lambda x: x.substitute(sub) if isinstance(x, Node) else x
    mask = tuple((f(b), f(e)) for b, e in self.mask) if self.mask is not None else None
    return View(tuple(map(f, self.shape)), tuple(map(f, self.strides)), f(self.offset), mask), vals

  def all_masked(self) -> bool:
    """Every position is invalid (the canonical empty mask)."""
    return self.mask is not None and any(_is_int(b) and _is_int(e) and b >= e for b, e in self.mask)

  def expr(self, idxs: Sequence[Node], valid: Optional[Node] = None) -> tuple[Node, Node]:
    """(offset + Σ idxs[i]*strides[i], valid ∧ every idxs[i] inside mask[i])."""
    idx, conds = self.expr_conds(idxs)
    return idx, valid_node(conds, valid)

  def expr_conds(self, idxs: Sequence[Node]) -> tuple[Node, list[tuple[Node, sint, sint]]]:
    """The index expression and the mask conditions (x, b, e), each meaning b <= x < e, that are not always true."""
    iexpr: list[sint] = [self.offset]
    conds: list[tuple[Node, sint, sint]] = []
    for i, (idx, sh, st) in enumerate(zip(idxs, self.shape, self.strides)):
      if not _same(st, 0) and not _same(sh, 1): iexpr.append(idx * st)
      if self.mask is not None:
        b, e = self.mask[i]
        if not _le(b, idx.min) or not _lt(idx.max, e): conds.append((idx, b, e))
    return Node.sum(iexpr), conds

  # ***** movement ops *****

  def reshape(self, new_shape: Sequence[sint]) -> Optional[View]:
    """The same elements in C order over new_shape, or None when one view cannot express it."""
    return self._reshape(_as_shape(new_shape, "reshape", self.shape))

  def permute(self, axis: Sequence[int]) -> View:
    """New axis i is old axis axis[i]."""
    return self._permute(_as_ints(axis, "permute", self.shape))

  def expand(self, new_shape: Sequence[sint]) -> View:
    """Size-1 axes broadcast to new sizes (stride 0); other axes keep their size."""
    return self._expand(_as_shape(new_shape, "expand", self.shape))

  def pad(self, arg: Sequence[tuple[sint, sint]]) -> View:
    """arg[i] = (before, after) invalid positions added around axis i."""
    return self._pad(_as_pairs(arg, "pad", self.shape))

  def shrink(self, arg: Sequence[tuple[sint, sint]]) -> View:
    """Keep positions [begin, end) of each axis: new x[i] = old x[i] - begin."""
    return self._shrink(_as_pairs(arg, "shrink", self.shape))

  def stride(self, mul: Sequence[int]) -> View:
    """Every |mul[i]|-th position of axis i, starting from the end when mul[i] < 0: new x = old x*|m| (or s-1-x*|m|)."""
    return self._stride(_as_ints(mul, "stride", self.shape))

  def __add__(self, vm1: View) -> Optional[View]:
    """self (the lower view) seen through vm1 (which indexes self's elements in C order), as one View or None."""
    return merge_views(self, vm1)

  @cache
  def minify(self) -> View:
    """The same index map over the fewest axes (used when a view is indexed by a flat position)."""
    nv = self._reshape(tuple(g[0] for g in _merge_dims(self.shape, self.strides, self.mask)))
    return nv if nv is not None else self

  @cache
  def _reshape(self, new_shape: tuple[sint, ...]) -> Optional[View]:
    if self.shape == new_shape: return self
    _check_same_size(self.shape, new_shape)
    if 0 in self.shape or self.contiguous: return View.create(new_shape)
    if self.all_masked(): return _empty(new_shape) if new_shape else None
    groups = _merge_dims(self.shape, self.strides, self.mask)
    strides = _reshape_strides(groups, new_shape)
    if strides is None: return None
    if self.mask is None: return View.create(new_shape, tuple(strides), self.offset)
    new_mask = _reshape_mask(self.shape, self.mask, new_shape)
    if new_mask is None: return None
    # both views agree at the first valid element; in between the strides carry them
    corner = sum(b * st for (b, _), st in zip(self.mask, self.strides))
    corner -= sum(b * st for (b, _), st in zip(new_mask, strides))
    return View.create(new_shape, tuple(strides), _canon(self.offset + corner), new_mask)

  @cache
  def _permute(self, axis: tuple) -> View:
    if not all(type(a) is int for a in axis) or sorted(axis) != list(range(len(self.shape))):
      raise ShapeError(f"permute: {axis} is not a permutation of the {len(self.shape)} axes of shape {self.shape}")
    return View.create(tuple(self.shape[a] for a in axis), tuple(self.strides[a] for a in axis), self.offset,
                       tuple(self.mask[a] for a in axis) if self.mask is not None else None)

  @cache
  def _expand(self, new_shape: tuple[sint, ...]) -> View:
    if len(new_shape) != len(self.shape) or \
       not all(_same(s, ns) or _same(s, 1) for s, ns in zip(self.shape, new_shape)):
      raise ShapeError(f"expand: cannot expand shape {self.shape} to {new_shape}; only size-1 axes can change")
    if 0 in self.shape: return View.create(new_shape)
    if self.all_masked(): return _empty(new_shape)
    mask = tuple(m if _same(s, ns) else (0, ns) for m, s, ns in zip(self.mask, self.shape, new_shape)) \
      if self.mask is not None else None
    return View.create(new_shape, self.strides, self.offset, mask)

  @cache
  def _pad(self, arg: tuple[tuple[sint, sint], ...]) -> View:
    if all(_same(b, 0) and _same(e, 0) for b, e in arg): return self
    outer = tuple((_canon(-b), _canon(s + e)) for s, (b, e) in zip(self.shape, arg))
    return self._resize(outer, tuple((b, _canon(s + b)) for s, (b, _) in zip(self.shape, arg)))

  @cache
  def _shrink(self, arg: tuple[tuple[sint, sint], ...]) -> View:
    # refused only when provably out of range: a symbolic end that may pass the size is checked at launch
    if any(_lt(e, b) or _lt(s, e) for s, (b, e) in zip(self.shape, arg)):
      raise ShapeError(f"shrink: {arg} is outside shape {self.shape} or has begin > end")
    if not all(_le(b, e) for b, e in arg):
      raise ShapeError(f"shrink: {arg} on shape {self.shape}: a size end - begin is not provably >= 0")
    return self._resize(arg)

  def _resize(self, arg: tuple[tuple[sint, sint], ...], mask: Optional[Mask] = None) -> View:
    """Window [b, e) of each axis, where b may be negative and e past the end (pad); mask marks the valid part."""
    offset = _canon(self.offset + sum(st * b for st, (b, _) in zip(self.strides, arg)))
    if self.mask is not None:
      moved = tuple((_smax(0, _smin(_canon(mb - b), _canon(e - b))), _smax(0, _smin(_canon(me - b), _canon(e - b))))
                    for (mb, me), (b, e) in zip(self.mask, arg))
      mask = moved if mask is None else tuple((_smax(b1, b2), _smin(e1, e2)) for (b1, e1), (b2, e2) in zip(moved, mask))
    return View.create(tuple(_canon(e - b) for b, e in arg), self.strides, offset, mask)

  @cache
  def _stride(self, mul: tuple) -> View:
    if len(mul) != len(self.shape) or not all(type(m) is int and m != 0 for m in mul):
      raise ShapeError(f"stride: {mul} must be one nonzero int per axis of shape {self.shape}")
    shape = tuple(_canon((s + (abs(m) - 1)) // abs(m)) for s, m in zip(self.shape, mul))
    offset = _canon(self.offset + sum((s - 1) * st for s, st, m in zip(self.shape, self.strides, mul) if m < 0))
    mask = None
    if self.mask is not None:
      mask = tuple((_canon(((b if m > 0 else s - e) + abs(m) - 1) // abs(m)),
                    _canon(((e if m > 0 else s - b) + abs(m) - 1) // abs(m)))
                   for (b, e), s, m in zip(self.mask, self.shape, mul))
    return View.create(shape, tuple(st * m for st, m in zip(self.strides, mul)), offset, mask)

# ***** validity *****

def _affine(x: Node) -> Optional[tuple[Node, int, int]]:
  """x as c*a + k for an atom a (a Node that is neither a sum nor a constant) and ints c != 0 and k, or None."""
  k = 0
  if type(x) is SumNode:
    if len(x.nodes) != 2: return None
    first, last = x.nodes
    if type(last) is not NumNode: return None
    x, k = first, last.b
  if type(x) is MulNode and type(x.b) is int: return x.a, x.b, k
  return (x, 1, k) if type(x) not in (SumNode, NumNode) else None

def valid_node(conds: Sequence[tuple[Node, sint, sint]], valid: Optional[Node] = None) -> Node:
  """valid ∧ (b <= x < e for each condition). Conditions on c*a + k become one range per atom a, so that ranges
  which cannot all hold fold to NumNode(0) (the symbolic layer simplifies each comparison on its own)."""
  ranges: dict[Node, list[int]] = {}
  rest: list[Node] = [] if valid is None else [valid]
  for x, b, e in conds:
    aff = _affine(x) if type(b) is int and type(e) is int else None
    if aff is None or not isinstance(b, int) or not isinstance(e, int):
      rest += [x.ge(b), x.lt(e)]
      continue
    v, c, k = aff
    lo, hi = (-((k - b) // c), (e - 1 - k) // c + 1) if c > 0 else (-((k - e + 1) // c), (b - k) // c + 1)
    r = ranges.setdefault(v, [v.min, v.max + 1])
    r[0], r[1] = max(r[0], lo), min(r[1], hi)
  if any(lo >= hi for lo, hi in ranges.values()): return NumNode(0)
  for v, (lo, hi) in ranges.items():
    if lo > v.min: rest.append(v.ge(lo))
    if hi <= v.max: rest.append(v.lt(hi))
  return Node.ands(rest)

# ***** construction and merging *****

@cache
def _create(shape: tuple[sint, ...], strides: Optional[tuple[sint, ...]], offset: sint, mask: Optional[Mask]) -> View:
  shape = tuple(_dim(s, "View.create", shape) for s in shape)
  if strides is not None and len(strides) != len(shape) or mask is not None and len(mask) != len(shape):
    raise ShapeError(f"View.create: shape {shape} needs one stride and one mask pair per axis ({strides}, {mask})")
  if 0 in shape: return View(shape, (0,) * len(shape), 0, None)
  cstrides = strides_for_shape(shape)
  strides = cstrides if strides is None else tuple(0 if _same(s, 1) else _canon(st) for s, st in zip(shape, strides))
  offset = _canon(offset)
  if mask is not None:
    mask = tuple((_canon(b), _canon(e)) for b, e in mask)
    if all(_same(b, 0) and _same(e, s) for (b, e), s in zip(mask, shape)): mask = None
    elif any(_is_int(b) and _is_int(e) and b >= e for b, e in mask): return _empty(shape)
    else:
      pinned = [_same(_canon(e - b), 1) for b, e in mask]
      offset = _canon(offset + sum(st * b for st, (b, _), p in zip(strides, mask, pinned) if p))
      strides = tuple(0 if p else st for st, p in zip(strides, pinned))
  return View(shape, strides, offset, mask)

def _empty(shape: tuple[sint, ...]) -> View:
  """The canonical view whose every position is invalid (shape must have at least one axis)."""
  return View(shape, (0,) * len(shape), 0, ((0, 0),) * len(shape))

def _is_contiguous(shape: tuple[sint, ...], strides: tuple[sint, ...], offset: sint, mask: Optional[Mask]) -> bool:
  """No elements, or offset 0, no mask and C strides (the stride of a size-1 axis is never read)."""
  if 0 in shape: return True
  if mask is not None or not _same(_canon(offset), 0) or len(strides) != len(shape): return False
  return all(_same(s, 1) or _same(_canon(st), cst) for s, st, cst in zip(shape, strides, strides_for_shape(shape)))

def _check_same_size(shape: tuple[sint, ...], new_shape: tuple[sint, ...]) -> None:
  a, b = _canon(prod(shape)), _canon(prod(new_shape))
  if _same(a, b): return
  if _is_int(a) and _is_int(b) or not _equal_at_bounds(a, b):
    raise ShapeError(f"reshape: cannot reshape shape {shape} ({a} elements) to {new_shape} ({b} elements)")

def _equal_at_bounds(a: sint, b: sint) -> bool:
  """a == b at the bound values when every variable is bound, else with unbound variables at their min and max."""
  vs = (a.vars() if isinstance(a, Node) else set()) | (b.vars() if isinstance(b, Node) else set())
  bound = {v: v.val for v in vs if v.val is not None}
  if len(bound) == len(vs): envs = [bound]
  else: envs = [{v: bound[v] if v in bound else getattr(v, k) for v in vs} for k in ("min", "max")]
  return all(sym_infer(a, env) == sym_infer(b, env) for env in envs)

@cache
def merge_views(vm2: View, vm1: View) -> Optional[View]:
  """One View equal to vm2 indexed through vm1 (vm1's flat positions are vm2's elements in C order), or None."""
  if vm2.contiguous: return vm1
  if vm1.contiguous and vm1.shape == vm2.shape: return vm2
  if vm1.contiguous and _same(vm1.size(), vm2.size()) and (ret := vm2._reshape(vm1.shape)) is not None: return ret
  if vm1.all_masked() or vm2.all_masked(): return _empty(vm1.shape) if vm1.shape else None
  if not all(_is_int(x) for x in vm2.shape + vm1.shape) and (batched := _merge_batch(vm2, vm1)) is not None:
    return batched
  if vm1.mask is not None:
    if not all(_is_int(x) for m in vm1.mask for x in m): return None
    merged = merge_views(vm2, vm1._resize(vm1.mask))
    return None if merged is None else merged._pad(tuple((b, _canon(s - e)) for (b, e), s in zip(vm1.mask, vm1.shape)))
  if not all(_is_int(x) for x in vm2.shape + vm2.strides + vm1.shape + vm1.strides + (vm1.offset, vm2.offset)):
    return None
  return _merge_ints(vm2, vm1)

def _merge_batch(vm2: View, vm1: View) -> Optional[View]:
  """merge_views when both views lead with the same (often symbolic) axis, unmasked in both, that vm1 walks in steps
  of vm2's inner size: vm1's flat index n*inner + r (0 <= r < inner, which the merge of the rest proves) reaches vm2
  at position n of that axis and r within the rest, so the rest merges on its own and the axis goes back in front."""
  if not vm2.shape or not vm1.shape or not _same(vm2.shape[0], vm1.shape[0]): return None
  if any(v.mask is not None and not _same(v.mask[0][0], 0) or v.mask is not None and not _same(v.mask[0][1], v.shape[0])
         for v in (vm2, vm1)):
    return None
  inner = prod(vm2.shape[1:])
  if not vm2.shape[1:] or not vm1.shape[1:] or not _is_int(inner) or not _same(vm1.strides[0], inner): return None
  def rest(v: View, offset: sint) -> View:
    return View.create(v.shape[1:], v.strides[1:], offset, None if v.mask is None else v.mask[1:])
  r1 = rest(vm1, vm1.offset)
  if not all(_is_int(x) for x in r1.shape + r1.strides + (r1.offset,)): return None
  sranges = r1.mask if r1.mask is not None else tuple((0, s) for s in r1.shape)
  if not all(_is_int(b) and _is_int(e) for b, e in sranges): return None
  ranges, strides = cast(tuple[tuple[int, int], ...], sranges), cast(tuple[int, ...], r1.strides)
  if any(b >= e for b, e in ranges): return None   # all masked: handled by the caller's general rules
  lo = cast(int, r1.offset) + sum(st * (b if st > 0 else e - 1) for st, (b, e) in zip(strides, ranges))
  hi = cast(int, r1.offset) + sum(st * (e - 1 if st > 0 else b) for st, (b, e) in zip(strides, ranges))
  if not 0 <= lo <= hi < inner: return None
  merged = merge_views(rest(vm2, 0), r1)
  if merged is None: return None
  mask = None if merged.mask is None else ((0, vm1.shape[0]),) + merged.mask
  return View.create(vm1.shape[:1] + merged.shape, (vm2.strides[0],) + merged.strides, vm2.offset + merged.offset, mask)

def _merge_ints(vm2: View, vm1: View) -> Optional[View]:
  """merge_views for int views where vm1 has no mask: vm1's flat index offset + Σ st1*x1 is spread over vm2's axes
  (origin + per-axis steps); every group of vm2 axes must keep its share inside its own range, so no carries occur."""
  origin = un1d(vm2.shape, vm1.offset)  # type: ignore
  terms: list[list[tuple[int, int]]] = [[] for _ in origin]
  strides = [0] * len(vm1.shape)
  for d1, st in enumerate(vm1.strides):
    if st == 0: continue
    for d2, (o, s1) in enumerate(zip(origin, un1d(vm2.shape, vm1.offset + st))):  # type: ignore
      if s1 - o == 0: continue
      terms[d2].append((d1, s1 - o))
      strides[d1] += (s1 - o) * vm2.strides[d2]  # type: ignore
  extents: list[int] = []
  size, lo, hi = 1, 0, 0
  for d2 in range(len(vm2.shape) - 1, -1, -1):
    tlo, thi = _term_bounds(terms[d2], origin[d2], vm1.shape)  # type: ignore
    lo, hi, size = lo + tlo * size, hi + thi * size, size * vm2.shape[d2]  # type: ignore
    if 0 <= lo and hi < size: extents.append(size); size, lo, hi = 1, 0, 0
  if size != 1 or lo != 0 or hi != 0: return None
  if tuple(reversed(extents)) != tuple(s for s in vm2.shape):
    reshaped = vm2._reshape(tuple(reversed(extents)))
    return merge_views(reshaped, vm1) if reshaped is not None and reshaped.shape != vm2.shape else None
  if vm2.mask is not None: return _project_mask(vm2, vm1, origin, terms, strides)
  return View.create(vm1.shape, tuple(strides), sum(o * s for o, s in zip(origin, vm2.strides)) + vm2.offset)

def _project_mask(vm2: View, vm1: View, origin: list[int], terms: list[list[tuple[int, int]]],
                  strides: list[int]) -> Optional[View]:
  """The merge when vm2 has a mask: each vm2 axis that vm1 can leave must follow one vm1 axis, whose valid range
  then shrinks to keep it inside; the merge is retried with that mask on vm1."""
  if vm2.mask is None or not all(_is_int(x) for m in vm2.mask for x in m): return None
  # merge_views only gets here with int shapes and strides on both views and an int mask on vm2
  mask2, shape1 = cast(tuple[tuple[int, int], ...], vm2.mask), cast(tuple[int, ...], vm1.shape)
  newb, newe, bad = [0] * len(shape1), list(shape1), False
  for d2, ((b, e), o) in enumerate(zip(mask2, origin)):
    tlo, thi = _term_bounds(terms[d2], o, shape1)
    if b <= tlo and thi < e: continue
    if not terms[d2]: return _empty(vm1.shape) if vm1.shape else None  # a fixed position outside the mask
    if len(terms[d2]) != 1:
      bad = True
      continue
    (d1, s1), = terms[d2]
    lo_x = -((o - b) // s1) if s1 > 0 else -((o - e + 1) // s1)
    hi_x = (e - 1 - o) // s1 + 1 if s1 > 0 else (b - o) // s1 + 1
    newb[d1], newe[d1] = max(newb[d1], lo_x), min(newe[d1], hi_x)
  if any(b >= e for b, e in zip(newb, newe)): return _empty(vm1.shape)
  if newb != [0] * len(newb) or newe != list(vm1.shape):
    return merge_views(vm2, View.create(vm1.shape, vm1.strides, vm1.offset, tuple(zip(newb, newe))))
  if bad: return None
  return View.create(vm1.shape, tuple(strides), sum(o * s for o, s in zip(origin, vm2.strides)) + vm2.offset)

def _term_bounds(term: list[tuple[int, int]], o: int, shape: tuple[int, ...]) -> tuple[int, int]:
  """Range of o + Σ s*x[d] over 0 <= x[d] < shape[d]."""
  lo = hi = o
  for d, s in term:
    lo, hi = lo + min(0, s * (shape[d] - 1)), hi + max(0, s * (shape[d] - 1))
  return lo, hi
