"""Emission: one render of a linearized UOp list as the lines of a C-family function. `RenderContext` is what one
render knows beyond its dialect (the facts its spellings read, the name of each UOp spelled so far, the preamble
helpers registered), reached through `current_context()` while `rendering(ctx)` is active; `Emitter` walks the list
exactly as given, names each value, inlines single-use pure expressions and asks its dialect (a `CStyleLanguage`,
kernopt/renderers/cstyle.py) for every spelling. Imports dtype, errors, ops, uops and renderers; the dialect's class
for type hints only."""
from __future__ import annotations
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import TernaryOps
from kernopt.uops import Mark, UOp, UOps
if TYPE_CHECKING: from kernopt.renderers.cstyle import CStyleLanguage

def dtype_of(u: UOp) -> DType:
  """u's dtype, for a uop whose contract gives it one (every value, buffer and loop uop)."""
  assert u.dtype is not None, f"{u.op} has no dtype"
  return u.dtype

@dataclass
class RenderContext:
  """What one render() call knows beyond its dialect: facts about the UOp list being spelled, computed from it before
  emission (`workgroup`: threads in one workgroup, the product of the local SPECIAL sizes), the spelled name of each
  UOp so far (`names`) and the preamble helpers registered while spelling (`helpers`, in order). A dialect that needs
  more facts subclasses it and builds it in `render_context`; a spelling reaches the render in progress through
  `CStyleLanguage.context` (`current_context()`)."""
  workgroup: int = 1
  names: dict[UOp, str] = field(default_factory=dict)
  helpers: dict[str, str] = field(default_factory=dict)

# the context of the render in progress (per thread and task); set only by `rendering`
_current: ContextVar[Optional[RenderContext]] = ContextVar("kernopt_render_context", default=None)

# the context of the render in progress, None outside one
current_context = _current.get

@contextmanager
def rendering(ctx: RenderContext) -> Iterator[RenderContext]:
  """Spell within ctx: the helpers a spelling registers go to it (CStyleLanguage.render spells its list so)."""
  token = _current.set(ctx)
  try: yield ctx
  finally: _current.reset(token)

def workgroup_size(uops: list[UOp]) -> int:
  """The threads in one workgroup of a kernel: the product of its constant local SPECIAL sizes."""
  n, special = 1, UOps.SPECIAL
  for u in uops:
    if u.op is special and u.arg[1].startswith("l") and isinstance(u.arg[2], int): n *= u.arg[2]
  return n

# A Variable's name (any ASCII identifier) is spelled under VAR_PREFIX: no identifier kernopt emits starts with it,
# so a name can't meet kernopt's own (ridx0, data0, acc0) or a dialect's keywords, macros and builtins (int, INFINITY).
VAR_PREFIX = "v_"
def var_name(expr: str) -> str: return VAR_PREFIX + expr

_INLINABLE = frozenset((UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.VECTORIZE))
# an inlined expression may exceed its inlined operands' text by this much before it is named instead
REPEAT_SLACK = 96
# inlined expressions nest at most this deep (each level adds up to ~3 brackets; clang allows 256 by default)
MAX_INLINE_DEPTH = 64
# enum members as module constants for the emitter's dispatch: an attribute of an Enum class costs ~0.15 us on 3.11
_ALU, _BARRIER, _BITCAST, _CAST, _CONST, _DEFINE_ACC = \
  UOps.ALU, UOps.BARRIER, UOps.BITCAST, UOps.CAST, UOps.CONST, UOps.DEFINE_ACC
_DEFINE_GLOBAL, _DEFINE_LOCAL, _DEFINE_VAR, _ENDIF, _ENDRANGE, _GEP, _IF = \
  UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL, UOps.DEFINE_VAR, UOps.ENDIF, UOps.ENDRANGE, UOps.GEP, UOps.IF
_LOAD, _PHI, _RANGE, _SINK, _SPECIAL, _STORE, _VECTORIZE, _WMMA = \
  UOps.LOAD, UOps.PHI, UOps.RANGE, UOps.SINK, UOps.SPECIAL, UOps.STORE, UOps.VECTORIZE, UOps.WMMA
_WHERE = TernaryOps.WHERE

def _const_memo(lang: CStyleLanguage) -> dict[tuple, tuple[DType, str, tuple[tuple[str, str], ...]]]:
  """The render_const results of dialect instance lang: (value type, value, id(dtype)) -> (dtype, spelling, helpers
  registered). A spelling depends only on the value, the dtype and the dialect's attributes, so the memo is
  dropped when an instance attribute (not a private "_" one: a render's own state) is rebound."""
  attrs = tuple((k, v) for k, v in vars(lang).items() if not k.startswith("_"))
  memo = lang.__dict__.get("_const_memo")
  if memo is None or len(memo[0]) != len(attrs) or \
     any(a[0] != b[0] or a[1] is not b[1] for a, b in zip(memo[0], attrs)):
    memo = lang.__dict__["_const_memo"] = (attrs, {})
  return memo[1]

class Emitter:
  """One render: names each value, inlines single-use pure expressions, and writes the lines."""
  _prefixes = {UOps.ALU: "alu", UOps.CAST: "cast", UOps.BITCAST: "cast", UOps.LOAD: "val", UOps.DEFINE_ACC: "acc",
               UOps.RANGE: "ridx", UOps.VECTORIZE: "vec", UOps.GEP: "gep", UOps.WMMA: "wmma", UOps.DEFINE_LOCAL: "temp"}

  def __init__(self, lang: CStyleLanguage, ctx: Optional[RenderContext] = None):
    self.lang, self.ctx = lang, ctx if ctx is not None else RenderContext()
    self.r: dict[UOp, str] = self.ctx.names
    self.counts: dict[str, int] = {}
    self.lines: list[str] = []
    self.depth = 1
    self.dtype_names: dict[DType, str] = {}
    self.dtype_ids: dict[int, tuple[DType, str]] = {}
    self.consts = _const_memo(lang)
    self.nest: dict[UOp, int] = {}   # how many inlined expressions each inlined value's spelling nests

  def fresh(self, prefix: str) -> str:
    n = self.counts.get(prefix, 0)
    self.counts[prefix] = n + 1
    return f"{prefix}{n}"

  def line(self, s: str) -> None: self.lines.append("  " * self.depth + s)

  def value(self, u: UOp, expr: str, uses: int) -> None:
    """Bind u to expr: inline a single-use expression unless it reads an accumulator (which a PHI may change
    before the use) or would nest more than MAX_INLINE_DEPTH inlined expressions (then it is named: a chain of
    10,000 single-use ops becomes statements of bounded nesting, within clang's bracket limit, instead of one
    expression rebuilt as an ever longer string)."""
    if uses <= 1 and u.op in _INLINABLE:
      nest, r, d, total, inlined = self.nest, self.r, 0, 0, 0
      for s in u.src:
        if s.op is _DEFINE_ACC: break
        if (ds := nest.get(s, 0)) > d: d = ds
        n = len(r[s]) if s in r else 0
        total += n
        if ds: inlined += n
      else:
        # a spelling that repeats an inlined operand (OpenCL's vector MAX as select(b, a, isgreater(a, b)), a split
        # into lanes) is named, or a tree of such ops would grow its source exponentially with depth
        if d < MAX_INLINE_DEPTH and len(expr) - total <= max(REPEAT_SLACK, inlined // 2):
          self.r[u] = expr
          nest[u] = d + 1
          return
    name = self.fresh(self._prefixes[u.op])
    self.line(f"{self.value_dtype(dtype_of(u))} {name} = {expr};")
    self.r[u] = name

  def value_dtype(self, dt: DType) -> str:
    """lang.render_value_dtype, once per dtype and render (a dialect may register a typedef the first time)."""
    if (hit := self.dtype_ids.get(id(dt))) is not None and hit[0] is dt: return hit[1]  # DType hashing is slow
    if (ret := self.dtype_names.get(dt)) is None: ret = self.dtype_names[dt] = self.lang.render_value_dtype(dt)
    self.dtype_ids[id(dt)] = (dt, ret)
    return ret

  def const(self, val: Any, dt: DType) -> str:
    """lang.render_const(val, dt), memoized on the dialect (see `_const_memo`): a hit registers the preamble helpers
    the first call registered, in the same order."""
    t = type(val)
    if t is not int and t is not float and t is not bool: return self.lang.render_const(val, dt)
    # a float by value, except where == doesn't tell doubles apart (0.0 == -0.0, nan != nan): by its repr there
    key = (t, val if t is not float or (val == val and val != 0) else repr(val), id(dt))
    if (hit := self.consts.get(key)) is not None and hit[0] is dt:
      if hit[2]:
        helpers = self.ctx.helpers
        for k, v in hit[2]: helpers.setdefault(k, v)
      return hit[1]
    outer = self.ctx.helpers
    mine: dict[str, str] = {}
    self.ctx.helpers = mine
    try: ret = self.lang.render_const(val, dt)
    finally: self.ctx.helpers = outer
    for k, v in mine.items(): outer.setdefault(k, v)
    if len(self.consts) > 4096: self.consts.clear()
    self.consts[key] = (dt, ret, tuple(mine.items()))   # the entry keeps dt alive: its id is not reused
    return ret

  def emit(self, name: str, uops: list[UOp]) -> str:
    lang, r = self.lang, self.r
    uses: dict[UOp, int] = {}
    for u in uops:
      for s in u.src: uses[s] = uses.get(s, 0) + 1
    bufs: list[tuple[int, str]] = []
    variables: dict[str, str] = {}
    for u in uops:
      op, src = u.op, u.src
      if op is _ALU:  # the most common kinds first
        opdt = dtype_of(src[1] if u.arg is _WHERE else src[0])
        self.value(u, lang.render_alu(u.arg, opdt, [r[s] for s in src]), uses.get(u, 0))
      elif op is _CONST: r[u] = self.const(u.arg, dtype_of(u))
      elif op is _LOAD: self.load(u)
      elif op is _DEFINE_GLOBAL:
        idx, bname, writable = u.arg
        dt = dtype_of(u)
        if isinstance(dt, ImageDType) and not lang.caps.supports_images:
          raise UnsupportedError(f"{lang.dialect_name} has no images: buffer {bname} is {dt}")
        bufs.append((idx, lang.render_param(bname, dt, writable)))
        r[u] = bname
      elif op is _DEFINE_VAR:
        r[u] = var_name(u.arg.expr)
        variables[u.arg.expr] = lang.render_var_param(r[u], dtype_of(u))
      elif op is _DEFINE_LOCAL:
        r[u] = u.arg[0]
        self.line(lang.render_local(u.arg[0], dtype_of(u), u.arg[1]))
      elif op is _SPECIAL:
        self.line(lang.render_special(u.arg[1], u.arg[0]))
        r[u] = u.arg[1]
      elif op is _RANGE:
        r[u] = v = self.fresh("ridx")
        for ln in lang.render_range(u, v, r[src[0]], r[src[1]]): self.line(ln)
        self.depth += 1
      elif op is _IF:
        self.line(f"if ({r[src[0]]}) {{")
        self.depth += 1
      elif op is _ENDRANGE or op is _ENDIF:
        self.depth -= 1
        self.line("}")
      elif op is _BARRIER:
        if lang.barrier: self.line(lang.barrier)
      elif op is _DEFINE_ACC:
        r[u] = v = self.fresh("acc")
        dt = dtype_of(u)
        self.line(f"{lang.render_value_dtype(dt)} {v} = {self.const(u.arg[0], dt)};")
      elif op is _PHI:
        self.line(f"{r[src[0]]} = {r[src[1]]};")
        r[u] = r[src[0]]
      elif op is _STORE: self.store(u)
      elif op is _CAST:
        self.value(u, lang.render_cast(r[src[0]], dtype_of(src[0]), dtype_of(u)), uses.get(u, 0))
      elif op is _BITCAST:
        self.value(u, lang.render_bitcast(r[src[0]], dtype_of(src[0]), dtype_of(u)), uses.get(u, 0))
      elif op is _VECTORIZE:
        # lanes picked from other vectors (the deinterleave pass's shuffle): a dialect may spell the pattern
        expr = lang.render_shuffle(dtype_of(u), [(r[s.src[0]], s.arg) for s in src]) \
          if src and all(s.op is _GEP for s in src) else None
        self.value(u, expr or lang.render_vectorize(dtype_of(u), [r[s] for s in src]), uses.get(u, 0))
      elif op is _GEP: self.value(u, lang.render_gep(r[src[0]], u.arg, dtype_of(src[0])), uses.get(u, 0))
      elif op is _WMMA: self.value(u, lang.render_wmma(u, [r[s] for s in src]), 2)
      elif op is _SINK: pass
      else: raise UnsupportedError(f"{lang.dialect_name} can't render {op.name}")
    params = [p for _, p in sorted(bufs)] + [variables[k] for k in sorted(variables)]
    return lang.render_kernel(name, params, self.lines, list(self.ctx.helpers.values()))

  def load(self, u: UOp) -> None:
    lang, r, src = self.lang, self.r, u.src
    buf, buf_dt = src[0], dtype_of(src[0])
    if isinstance(buf_dt, ImageDType): expr = lang.render_image_load(u, [r[s] for s in src])
    # the vectorize pass's masked vector LOAD(buf, index, lane mask), where the dialect declares masked_loads
    elif len(src) == 3 and src[2].op is not _BARRIER:
      expr = lang.render_masked_load(r[buf], r[src[1]], r[src[2]], dtype_of(u))
    else: expr = lang.render_load(r[buf], r[src[1]], dtype_of(u), buf_dt)
    if len(src) == 4: expr = f"({r[src[2]]}?{expr}:{r[src[3]]})"
    r[u] = v = self.fresh("val")
    self.line(f"{self.value_dtype(dtype_of(u))} {v} = {expr};")

  def store(self, u: UOp) -> None:
    lang, r, src = self.lang, self.r, u.src
    buf_dt = dtype_of(src[0])
    if isinstance(buf_dt, ImageDType): stmt = lang.render_image_store(u, [r[s] for s in src])
    elif len(src) == 4 and dtype_of(src[3]) != dtypes.bool:
      # the lowerer's masked vector STORE(buf, index, value, lane mask), where the dialect declares masked_stores
      return self.line(lang.render_masked_store(r[src[0]], r[src[1]], r[src[2]], r[src[3]], dtype_of(src[2])))
    else:
      spell = lang.render_nontemporal_store if u.arg is Mark.NONTEMPORAL else lang.render_store
      stmt = spell(r[src[0]], r[src[1]], r[src[2]], dtype_of(src[2]), buf_dt)
    self.line(f"if ({r[src[3]]}) {{ {stmt} }}" if len(src) == 4 else stmt)
