"""ShapeTracker: a stack of Views. The last view is what a kernel indexes; each earlier view is indexed by the flat
(C-order) position that the view above it produces, and views[0] addresses the buffer. Movement ops act on the last
view (a reshape it cannot express pushes a new one); `simplify` merges views; `expr_idxs` builds the index and
validity expressions that the lowerer renders. Imports errors and shape/."""
from __future__ import annotations
import functools
from dataclasses import dataclass
from typing import Any, Optional, Sequence
from kernopt.errors import ShapeError
from kernopt.shape.conditions import count_divmod, restrict
from kernopt.shape.symbolic import MulNode, Node, NumNode, SumNode, Variable, sint
from kernopt.shape.view import View, cache, merge_views, strides_for_shape, valid_node

@functools.lru_cache(maxsize=None)
def _idx_vars(shape: tuple[sint, ...]) -> tuple[Variable, ...]:
  """The default per-axis index variables: idx{i} in [0, shape[i]-1] (a symbolic size contributes its max)."""
  return tuple(Variable(f"idx{i}", 0, _upper(s) - 1) for i, s in enumerate(shape))

@dataclass(frozen=True)
class ShapeTracker:
  """A stack of Views, outermost (buffer-addressing) first. Immutable: every movement op returns a new tracker."""
  views: tuple[View, ...]

  def __post_init__(self) -> None:
    if type(self.views) is not tuple: object.__setattr__(self, "views", tuple(self.views))
    if not self.views or not all(isinstance(v, View) for v in self.views):
      raise ShapeError(f"ShapeTracker needs at least one View, got {self.views!r}")

  def __hash__(self) -> int:
    h = self.__dict__.get("_hash")
    if h is None: object.__setattr__(self, "_hash", h := hash(self.views))
    return h

  def has_bound(self) -> bool:
    """Whether any view holds a bound Variable."""
    b = self.__dict__.get("_has_bound")
    if b is None: object.__setattr__(self, "_has_bound", b := any(v.has_bound() for v in self.views))
    return b

  @staticmethod
  def from_shape(shape: Sequence[sint]) -> ShapeTracker:
    """The contiguous tracker of shape."""
    return ShapeTracker((View.create(shape),))

  def __add__(self, st: ShapeTracker) -> ShapeTracker:
    """st's views stacked on this tracker (st indexes this tracker's elements in C order), simplified one at a time."""
    ret = self
    for v in st.views: ret = ShapeTracker(ret.views + (v,)).simplify()
    return ret

  @property
  def shape(self) -> tuple[sint, ...]: return self.views[-1].shape
  @property
  def size(self) -> sint: return self.views[-1].size()
  @property
  def contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].contiguous
  @property
  def consecutive(self) -> bool:
    """One unmasked view with C strides; unlike contiguous, any offset."""
    v = self.views[0]
    return len(self.views) == 1 and v.mask is None and v.strides == strides_for_shape(v.shape)

  def vars(self) -> set[Variable]: return set().union(*[v.vars() for v in self.views])

  def unbind(self) -> tuple[ShapeTracker, dict[Variable, int]]:
    """This tracker with bound Variables unbound, and their values."""
    pairs = [v.unbind() for v in self.views]
    return ShapeTracker(tuple(v for v, _ in pairs)), {k: val for _, d in pairs for k, val in d.items()}

  # ***** movement ops: all but a failed reshape act on the last view *****

  def reshape(self, new_shape: Sequence[sint]) -> ShapeTracker:
    if not isinstance(new_shape, tuple):
      try: new_shape = tuple(new_shape)
      except TypeError:
        raise ShapeError(f"reshape: argument {new_shape!r} for shape {self.shape} is not a sequence") from None
    nv = self.views[-1].reshape(new_shape)
    if nv is not None: return ShapeTracker(self.views[:-1] + (nv,))
    return ShapeTracker(self.views + (View.create(new_shape),))

  def permute(self, order: Sequence[int]) -> ShapeTracker:
    return ShapeTracker(self.views[:-1] + (self.views[-1].permute(order),))
  def expand(self, new_shape: Sequence[sint]) -> ShapeTracker:
    return ShapeTracker(self.views[:-1] + (self.views[-1].expand(new_shape),))
  def pad(self, arg: Sequence[tuple[sint, sint]]) -> ShapeTracker:
    return ShapeTracker(self.views[:-1] + (self.views[-1].pad(arg),))
  def shrink(self, arg: Sequence[tuple[sint, sint]]) -> ShapeTracker:
    return ShapeTracker(self.views[:-1] + (self.views[-1].shrink(arg),))
  def stride(self, mul: Sequence[int]) -> ShapeTracker:
    return ShapeTracker(self.views[:-1] + (self.views[-1].stride(mul),))

  # ***** analysis *****

  @cache
  def simplify(self) -> ShapeTracker:
    """An equivalent tracker with adjacent views merged wherever one View can express them."""
    views = list(self.views)
    i = len(views) - 2
    while i >= 0:
      merged = merge_views(views[i], views[i + 1])
      if merged is None: i -= 1
      else:
        views[i:i + 2] = [merged]
        i = min(i, len(views) - 2)
    return self if len(views) == len(self.views) else ShapeTracker(tuple(views))

  def expr_idxs(self, idxs: Optional[Sequence[Node]] = None) -> tuple[Node, Node]:
    """(flat buffer index, validity) for per-axis index expressions idxs (default: the idx{i} Variables).
    Validity is NumNode(1) when always valid; when never valid both are NumNode(0)."""
    if idxs is None: return self._expr_idxs(None)
    idxs = tuple(NumNode(x) if isinstance(x, int) else x for x in idxs)
    if len(idxs) != len(self.shape) or not all(isinstance(x, Node) for x in idxs):
      raise ShapeError(f"expr_idxs: need one int or Node index per axis of shape {self.shape}, got {idxs}")
    return self._expr_idxs(idxs)

  @cache
  def _expr_idxs(self, idxs: Optional[tuple[Node, ...]]) -> tuple[Node, Node]:
    if any(type(s) is int and s == 0 for s in self.shape): return NumNode(0), NumNode(0)
    idx, conds = self.views[-1].expr_conds(_idx_vars(self.shape) if idxs is None else idxs)
    for view in reversed(self.views[:-1]):
      view = view.minify()
      if view.all_masked(): return NumNode(0), NumNode(0)
      idx, more = self._through(view, idx, conds)
      conds += more
    valid = valid_node(conds)
    return (NumNode(0), NumNode(0)) if valid.max == 0 else (idx, valid)

  def _through(self, view: View, idx: Node, conds: list[tuple[Node, sint, sint]]) -> tuple[Node, list]:
    """view indexed at flat position idx: its index and mask conditions. Where that leaves a // or %, idx only matters
    where the conditions so far hold, so it is unflattened again over the ranges they imply (conditions.restrict) and
    its own Variables are put back: exact on every valid point (and the validity exact everywhere), often affine."""
    plain = _unflatten(view, idx)
    if not conds or not (n := count_divmod(plain[0]) + sum(count_divmod(x) for x, _, _ in plain[1])): return plain
    if (r := restrict(idx, conds, self.vars())) is None: return plain
    y, back = r
    i2, c2 = _unflatten(view, y)
    i2, c2 = i2.substitute(back), [(x.substitute(back), b, e) for x, b, e in c2]
    return (i2, c2) if count_divmod(i2) + sum(count_divmod(x) for x, _, _ in c2) < n else plain

  def expr_node(self, idx: Optional[Node] = None) -> tuple[Node, Node]:
    """expr_idxs for one flat index over the tracker's shape (default: Variable idx in [0, size-1])."""
    if idx is None:
      size = self.size
      if type(size) is int and size == 0: return NumNode(0), NumNode(0)
      idx = Variable("idx", 0, (size if type(size) is int else size.max) - 1)  # type: ignore
    return self.expr_idxs(unflatten(self.shape, idx))

  @cache
  def real_size(self) -> int:
    """One past the largest buffer position any valid element can address (0 when none is valid)."""
    if any(type(s) is int and s == 0 for s in self.shape): return 0
    st = self.simplify()
    idx, valid = st.expr_idxs()
    if valid.max == 0: return 0
    v = st.views[0]
    hi = _upper(v.offset)
    for i, (sh, s) in enumerate(zip(v.shape, v.strides)):
      b, e = v.mask[i] if v.mask is not None else (0, sh)
      hi += max(_upper(s * b), _upper(s * (e - 1)))
    return min(hi, idx.max) + 1

  @cache
  def address_bounds(self) -> tuple[sint, sint]:
    """(lo, hi) as expressions of the Variables: every buffer position a valid element addresses lies in [lo, hi);
    (0, 0) when none is valid. Exact for one View whose sizes (and mask box) are not empty and whose mask bounds are
    provably inside its shape; otherwise a superset: a mask bound that may pass the shape counts as the whole axis,
    and with several Views it is the box of views[0] (tightened by the index's bounds when that box is all ints)."""
    if any(type(s) is int and s == 0 for s in self.shape): return 0, 0
    st = self.simplify()
    v = st.views[0]
    if v.all_masked(): return 0, 0
    if len(st.views) > 1 and st.expr_idxs()[1].max == 0: return 0, 0
    lo: sint = v.offset
    hi: sint = v.offset + 1
    for i, (sh, s) in enumerate(zip(v.shape, v.strides)):
      b, e = v.mask[i] if v.mask is not None else (0, sh)
      # positions [max(b, 0), min(e, sh)); where the order is not provable, the whole axis (a superset)
      b, e = (b if _le(0, b) else 0), (e if _le(e, sh) else sh)
      first, last = _canon(s * b), _canon(s * (e - 1))
      if _lower(s) >= 0: lo, hi = lo + first, hi + last
      elif _upper(s) <= 0: lo, hi = lo + last, hi + first
      else: lo, hi = lo + min(_lower(first), _lower(last)), hi + max(_upper(first), _upper(last))
    lo, hi = _canon(lo), _canon(hi)
    if len(st.views) > 1 and type(lo) is int and type(hi) is int:
      idx = st.expr_idxs()[0]
      lo, hi = max(lo, _lower(idx)), min(hi, _upper(idx) + 1)
    return lo, hi

  @cache
  def real_strides(self, ignore_valid: bool = False) -> tuple[Optional[sint], ...]:
    """Per axis: the stride s when the buffer index is (other terms) + s*idx_axis, 0 when the axis does not move it,
    None when it moves it in any other way, or (unless ignore_valid) when it takes part in the validity."""
    st = self.simplify()
    if len(st.views) == 1:
      v = st.views[0]
      if v.mask is None: return v.strides
      if v.all_masked(): return (0,) * len(v.shape)
      return tuple(None if not ignore_valid and not (_is0(b) and e == sh) else s
                   for s, sh, (b, e) in zip(v.strides, v.shape, v.mask))
    idxs = _idx_vars(self.shape)
    where = {v: i for i, v in enumerate(idxs)}
    idx, valid = st.expr_idxs()
    ret: list[Optional[sint]] = [None] * len(idxs)
    bad: set[Variable] = set()
    for term in (idx.nodes if type(idx) is SumNode else (idx,)):
      base, coef = (term.a, term.b) if type(term) is MulNode else (term, 1)
      if type(base) is Variable and base in where: ret[where[base]] = coef
      else: bad |= term.vars()
    idx_vars, valid_vars = idx.vars(), valid.vars()
    for i, v in enumerate(idxs):
      if v in bad or (not ignore_valid and v in valid_vars): ret[i] = None
      elif v not in idx_vars: ret[i] = 0
    return tuple(ret)

  def unit_stride_axes(self, ignore_valid: bool = False) -> list[int]:
    """Axes whose real stride is 1."""
    return [i for i, s in enumerate(self.real_strides(ignore_valid)) if type(s) is int and s == 1]

  def axis_is_masked(self, axis: int) -> bool:
    """Whether the validity of an element depends on its index along axis."""
    if type(axis) is not int or not 0 <= axis < len(self.shape):
      raise ShapeError(f"axis_is_masked: axis {axis!r} is out of range for shape {self.shape}")
    return self._masked_axes()[axis]

  @cache
  def _masked_axes(self) -> tuple[bool, ...]:
    st = self.simplify()
    if len(st.views) == 1:
      v = st.views[0]
      if v.mask is None or v.all_masked(): return (False,) * len(v.shape)
      return tuple(not (_is0(b) and e == sh) for sh, (b, e) in zip(v.shape, v.mask))
    valid_vars = st.expr_idxs()[1].vars()
    return tuple(v in valid_vars for v in _idx_vars(self.shape))

def unflatten(shape: tuple[sint, ...], idx: Node) -> list[Node]:
  """The per-axis indices of flat (C-order) position idx over shape."""
  acc: sint = 1
  out: list[Node] = []
  for d in reversed(shape):
    out.append((idx // acc) % d)
    acc = acc * d
  return out[::-1]

def _unflatten(view: View, idx: Node) -> tuple[Node, list[tuple[Node, sint, sint]]]:
  """view's index and mask conditions at flat (C-order) position idx."""
  return view.expr_conds(unflatten(view.shape, idx))

def bounds_union(bounds: Sequence[tuple[sint, sint]]) -> tuple[sint, sint]:
  """One (lo, hi) holding every non-empty range of bounds: an expression where the order is provable, else the
  lowest lo (highest hi) over every value of the Variables; (0, 0) when every range is empty."""
  rs = [(lo, hi) for lo, hi in bounds if not (type(lo) is int and type(hi) is int and hi <= lo)]
  if not rs: return 0, 0
  lo, hi = rs[0]
  for l2, h2 in rs[1:]:
    lo = lo if _le(lo, l2) else l2 if _le(l2, lo) else min(_lower(lo), _lower(l2))
    hi = hi if _le(h2, hi) else h2 if _le(hi, h2) else max(_upper(hi), _upper(h2))
  return lo, hi

def _le(a: sint, b: sint) -> bool: return _lower(b - a) >= 0

def _is0(x: Any) -> bool: return type(x) is int and x == 0
def _upper(x: Any) -> int: return x if type(x) is int else x.max
def _lower(x: Any) -> int: return x if type(x) is int else x.min
def _canon(x: sint) -> sint: return x.b if type(x) is NumNode else x
