"""The C-style renderer base (`CStyleLanguage`) and the C dialect (`CRenderer`, device "CPU"). The base spells a
linearized UOp list, exactly as listed, as one C-family function, each render in a `RenderContext` of its own; a
dialect changes only spellings: attributes (prefixes, type names, barrier), the `code_for_op` table (merged along the
class hierarchy) and the small `render_*` hooks. Imports dtype, errors, ops, uops and renderers."""
from __future__ import annotations
import functools
import math
import struct
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import ALUOp, BinaryOps, TernaryOps, UnaryOps, truncate_float
from kernopt.renderers import Capabilities, Renderer
from kernopt.uops import Mark, UOp, UOps

def dtype_of(u: UOp) -> DType:
  """u's dtype, for a uop whose contract gives it one (every value, buffer and loop uop)."""
  assert u.dtype is not None, f"{u.op} has no dtype"
  return u.dtype

# a spelling: a str.format template over the operands ({0}, {1}, ...; {t} is the operand C type), or a function
# (renderer, operand compute dtype, *operand expressions) -> expression; None marks an op the dialect lacks
Spelling = Optional[Union[str, Callable[..., str]]]

@dataclass
class RenderContext:
  """What one render() call knows beyond its dialect: facts about the UOp list being spelled, computed from it before
  emission (`workgroup`: threads in one workgroup, the product of the local SPECIAL sizes), the spelled name of each
  UOp so far (`names`) and the preamble helpers registered while spelling (`helpers`, in order). A dialect that needs
  more facts subclasses it and builds it in `render_context`; a spelling reaches the render in progress through
  `CStyleLanguage.context`."""
  workgroup: int = 1
  names: dict[UOp, str] = field(default_factory=dict)
  helpers: dict[str, str] = field(default_factory=dict)

# the context of the render in progress (per thread and task); set only by `rendering`
_current: ContextVar[Optional[RenderContext]] = ContextVar("kernopt_render_context", default=None)

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

def _wide_unsigned(dt: DType) -> DType: return dtypes.uint64 if dt.itemsize == 8 else dtypes.uint32

# DType predicates memoized by the identity of the dtype (and of the set): DType hashing costs ~0.4 us. Each entry
# keeps its objects alive, so their ids are not reused while it is there
_MEMBER: dict[tuple[int, int], tuple[Any, DType, bool]] = {}
def _dtype_in(dt: DType, s: frozenset[DType]) -> bool:
  """dt in s, for a frozenset s of dtypes."""
  if (hit := _MEMBER.get((id(s), id(dt)))) is not None and hit[0] is s and hit[1] is dt: return hit[2]
  if len(_MEMBER) > 1024: _MEMBER.clear()
  ret = dt in s
  _MEMBER[(id(s), id(dt))] = (s, dt, ret)
  return ret

_INT_LIKE: dict[int, tuple[DType, bool]] = {}
def _int_like(dt: DType) -> bool:
  """dt is an integer type or bool."""
  if (hit := _INT_LIKE.get(id(dt))) is not None and hit[0] is dt: return hit[1]
  if len(_INT_LIKE) > 1024: _INT_LIKE.clear()
  ret = dtypes.is_int(dt) or dt == dtypes.bool
  _INT_LIKE[id(dt)] = (dt, ret)
  return ret

def _wrap(op: str) -> Callable[..., str]:
  """Integer `a op b` in the wide unsigned type (no signed overflow), converted back to the operand type."""
  def fn(r: CStyleLanguage, dt: DType, a: str, b: str) -> str:
    if not _int_like(dt): return f"({a}{op}{b})"
    t, u = r.render_dtype(dt), r.render_dtype(_wide_unsigned(dt))
    return f"({a}{op}{b})" if t == u else f"(({t})(({u}){a}{op}({u}){b}))"
  return fn

def _shift(op: str) -> Callable[..., str]:
  def fn(r: CStyleLanguage, dt: DType, a: str, b: str) -> str:
    if dtypes.is_float(dt): raise UnsupportedError(f"{r.dialect_name} has no {op} shift on {dt}")
    t, mask = r.render_dtype(dt), 8 * dt.itemsize - 1
    if op == ">>": return f"(({t})({a}>>({b}&{mask})))"
    return f"(({t})(({r.render_dtype(_wide_unsigned(dt))}){a}<<({b}&{mask})))"
  return fn

def _bitwise(op: str) -> Callable[..., str]:
  def fn(r: CStyleLanguage, dt: DType, a: str, b: str) -> str:
    if dtypes.is_float(dt): raise UnsupportedError(f"{r.dialect_name} has no bitwise {op} on {dt}")
    return f"({a}{op}{b})"
  return fn

def _math(fn_name: str) -> Callable[..., str]:
  def fn(r: CStyleLanguage, dt: DType, x: str) -> str:
    if not dtypes.is_float(dt): raise UnsupportedError(f"{r.dialect_name} has no {fn_name} on {dt}")
    return f"{fn_name}{r.math_suffix(dt)}({x})"
  return fn

def _neg(r: CStyleLanguage, dt: DType, x: str) -> str:
  if dt == dtypes.bool: return f"(!{x})"
  if dtypes.is_float(dt): return f"(-{x})"
  t, u = r.render_dtype(dt), r.render_dtype(_wide_unsigned(dt))
  return f"(({t})(0u-({u}){x}))"

def _idiv(r: CStyleLanguage, dt: DType, a: str, b: str) -> str:
  return f"({a}/{b})" if dtypes.is_float(dt) else f"{r.int_helper('idiv', dt)}({a}, {b})"

def _mod(r: CStyleLanguage, dt: DType, a: str, b: str) -> str:
  return f"{r.int_helper('mod', dt)}({a}, {b})"

def _recip(r: CStyleLanguage, dt: DType, x: str) -> str:
  if dtypes.is_float(dt): return f"({r.render_const(1.0, dt)}/{x})"
  return f"{r.int_helper('idiv', dt)}({r.render_const(1, dt)}, {x})"

def _mulacc(r: CStyleLanguage, dt: DType, a: str, b: str, c: str) -> str:
  # single rounding for float, as exec_alu computes a*b+c exactly in double before rounding to float
  if dt.scalar() == dtypes.float32: return f"fma{r.math_suffix(dt)}({a}, {b}, {c})"
  return _wrap("+")(r, dt, _wrap("*")(r, dt, a, b), c)

# arithmetic that has no meaning on bool (the interpreter refuses it too)
_NO_BOOL_OPS = frozenset({UnaryOps.RECIP, BinaryOps.IDIV, BinaryOps.MOD, BinaryOps.SHL, BinaryOps.SHR,
                          TernaryOps.MULACC})

class CStyleLanguage(Renderer):
  """Base of the C-family dialects. To write a dialect, override:
  - attributes: kernel_prefix, buffer_prefix, buffer_suffix, arg_int_prefix, smem_prefix, barrier, helper_prefix,
    includes, type_map, infinity/nan, storage_floats (types held in float registers: half/bfloat16 storage),
    code_for_workitem ("g"/"l"/"i" -> fn(dim) spelling of gidx/lidx), code_for_op (only the ops that differ);
  - hooks: render_dtype, render_const, math_suffix, render_cast, render_bitcast, render_load/render_store
    (vector and storage-type access), render_vectorize, render_gep, render_local, render_kernel,
    to_storage/from_storage/round_storage, render_wmma, render_image_load/render_image_store."""
  kernel_prefix: str = ""
  buffer_prefix: str = ""
  buffer_suffix: str = ""
  arg_int_prefix: str = "const int"
  smem_prefix: str = ""
  barrier: str = ""
  helper_prefix: str = "static inline"
  includes: tuple[str, ...] = ()
  infinity: str = "INFINITY"
  nan: str = "NAN"
  float_suffix: str = "f"
  storage_floats: frozenset[DType] = frozenset((dtypes.half, dtypes.bfloat16))
  code_for_workitem: dict[str, Callable[[int], str]] = {}
  emitter: Optional[type[Emitter]] = None   # a subclass of Emitter that spells more uops (None: Emitter)
  type_map: dict[DType, str] = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "unsigned char", dtypes.int16: "short",
    dtypes.uint16: "unsigned short", dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.int64: "long",
    dtypes.uint64: "unsigned long", dtypes.half: "half", dtypes.bfloat16: "bfloat16", dtypes.float32: "float",
    dtypes.float64: "double"}
  code_for_op: dict[ALUOp, Spelling] = {
    UnaryOps.NEG: _neg, UnaryOps.EXP2: _math("exp2"), UnaryOps.LOG2: _math("log2"), UnaryOps.SIN: _math("sin"),
    UnaryOps.SQRT: _math("sqrt"), UnaryOps.RECIP: _recip,
    BinaryOps.ADD: _wrap("+"), BinaryOps.MUL: _wrap("*"), BinaryOps.IDIV: _idiv, BinaryOps.MOD: _mod,
    BinaryOps.MAX: lambda r, dt, a, b: f"{r.max_helper(dt)}({a}, {b})",
    BinaryOps.CMPLT: "({0}<{1})", BinaryOps.CMPNE: "({0}!={1})",
    BinaryOps.XOR: _bitwise("^"), BinaryOps.AND: _bitwise("&"), BinaryOps.OR: _bitwise("|"),
    BinaryOps.SHL: _shift("<<"), BinaryOps.SHR: _shift(">>"),
    TernaryOps.WHERE: "({0}?{1}:{2})", TernaryOps.MULACC: _mulacc}
  # ops whose result is one of the operands, so a storage-float result needs no rounding
  _exact_ops = frozenset((UnaryOps.NEG, BinaryOps.MAX, BinaryOps.CMPLT, BinaryOps.CMPNE, TernaryOps.WHERE))

  @property
  def dialect_name(self) -> str: return f"the {type(self).__name__} dialect"

  # ***** spellings a dialect may override *****

  def render_dtype(self, dt: DType) -> str:
    if isinstance(dt, ImageDType): raise UnsupportedError(f"{self.dialect_name} has no images (got {dt})")
    if dt.count > 1: return f"{self.render_dtype(dt.scalar())}{dt.count}"
    if dt not in self.type_map: raise UnsupportedError(f"{self.dialect_name} has no type for {dt}")
    return self.type_map[dt]

  def vector_parts(self, dt: DType) -> tuple[DType, int]:
    """(scalar, lanes) of a vector type the GPU dialects can spell: 2, 3, 4, 8 or 16 lanes of a non-bool scalar;
    UnsupportedError for anything else, images included."""
    if isinstance(dt, ImageDType): raise UnsupportedError(f"{self.dialect_name} has no images (got {dt})")
    scalar, n = dt.scalar(), dt.count
    if scalar == dtypes.bool or n not in (2, 3, 4, 8, 16):
      raise UnsupportedError(f"{self.dialect_name} has no vector type {dt}")
    return scalar, n

  def compute_dtype(self, dt: DType) -> DType:
    """The dtype values of dt are held in (storage floats are loaded into float)."""
    return dtypes.float32 if dt.count == 1 and _dtype_in(dt.scalar(), self.storage_floats) else dt

  def render_value_dtype(self, dt: DType) -> str: return self.render_dtype(self.compute_dtype(dt))
  def math_suffix(self, dt: DType) -> str: return self.float_suffix if dt == dtypes.float32 else ""

  def render_const(self, val: Any, dt: DType) -> str:
    if dt.count > 1: return self.render_vectorize(dt, [self.render_const(val, dt.scalar())] * dt.count)
    if dt == dtypes.bool: return "1" if val else "0"
    if dtypes.is_int(dt): return self.render_int(int(val), dt)
    val, cdt = float(val), self.compute_dtype(dt)
    if dt in self.storage_floats or dt == dtypes.float32: val = truncate_float(val, dt)
    if math.isnan(val): ret = self.nan
    elif math.isinf(val): ret = self.infinity if val > 0 else f"(-{self.infinity})"
    elif cdt == dtypes.float32: ret = _float_literal(val) + self.float_suffix
    else: ret = repr(val)
    if cdt != dtypes.float32 and (math.isnan(val) or math.isinf(val)): ret = f"(({self.render_dtype(cdt)}){ret})"
    return f"({ret})" if ret.startswith("-") else ret

  def render_int(self, val: int, dt: DType) -> str:
    bits, signed = 8 * dt.itemsize, not dtypes.is_unsigned(dt)
    suffix = ("ll" if bits == 64 else "") if signed else ("ull" if bits == 64 else "u")
    lit = f"({-(1 << (bits - 1)) + 1}{suffix}-1)" if signed and val == -(1 << (bits - 1)) else f"{val}{suffix}"
    if dt != dtypes.int32 and bits < 32: lit = f"(({self.render_dtype(dt)}){lit})"
    return f"({lit})" if lit.startswith("-") else lit

  def render_cast(self, x: str, src: DType, dst: DType) -> str:
    """A value conversion of x (held in src's compute type) to dst's compute type."""
    if src.count > 1 or dst.count > 1: raise UnsupportedError(f"{self.dialect_name} can't cast vector {src} to {dst}")
    csrc, cdst = self.compute_dtype(src), self.compute_dtype(dst)
    if dst == dtypes.bool: return f"({x}!=0)"
    if dst in self.storage_floats:
      if dtypes.is_int(src) or src == dtypes.bool: x = f"((double){x})"
      return self.round_storage(x, dst)
    if dtypes.is_float(csrc) and dtypes.is_int(dst): return f"{self.f2i_helper(csrc, dst)}({x})"
    return x if csrc == cdst else f"(({self.render_dtype(cdst)}){x})"

  def render_bitcast(self, x: str, src: DType, dst: DType) -> str:
    if src.count > 1 or dst.count > 1 or src.itemsize != dst.itemsize:
      raise UnsupportedError(f"{self.dialect_name} can't bitcast {src} to {dst}")
    if dst == dtypes.bool: return f"({x}!=0)"
    if src == dtypes.bool: return f"(({self.render_dtype(dst)}){x})"
    return self.from_storage(f"({self.bitcast_bits(self.to_storage(x, src), src, dst)})", dst)

  def bitcast_bits(self, x: str, src: DType, dst: DType) -> str:
    """x, in src's memory representation, reinterpreted as dst's (same size, neither bool)."""
    union = f"union {{ {self.render_dtype(src)} a; {self.render_dtype(dst)} b; }}"
    return f"(({union}){{ .a = {x} }}).b"

  def to_storage(self, x: str, dt: DType) -> str:
    """x (held in dt's compute type) converted to dt's memory representation."""
    return f"(({self.render_dtype(dt)}){x})" if dt in self.storage_floats else x

  def from_storage(self, x: str, dt: DType) -> str:
    """x (dt's memory representation) converted to dt's compute type."""
    return f"((float){x})" if dt in self.storage_floats else x

  def round_storage(self, x: str, dt: DType) -> str:
    """x (a float or double) rounded to the storage float dt, held in float."""
    return self.from_storage(f"(({self.render_dtype(dt)}){x})", dt)

  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType) -> str:
    """The expression reading element idx (a vector dt starting there) of buf, in dt's compute type."""
    if dt.count > 1: return f"(*(({self.buffer_prefix}{self.render_dtype(dt)}*)({buf}+{idx})))"
    return self.from_storage(f"{buf}[{idx}]", buf_dt)

  def render_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType) -> str:
    if dt.count > 1: return f"*(({self.buffer_prefix}{self.render_dtype(dt)}*)({buf}+{idx})) = {val};"
    return f"{buf}[{idx}] = {self.to_storage(val, buf_dt)};"

  def render_nontemporal_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType) -> str:
    """A STORE marked Mark.NONTEMPORAL (a hint: a dialect without such stores spells a plain one)."""
    return self.render_store(buf, idx, val, dt, buf_dt)

  def render_vectorize(self, dt: DType, elems: list[str]) -> str:
    return f"(({self.render_dtype(dt)})({', '.join(elems)}))"

  def render_gep(self, x: str, lane: int, dt: DType) -> str:
    return f"{x}.{'xyzw'[lane] if dt.count <= 4 else f's{lane:x}'}"

  def render_local(self, name: str, dt: DType, size: int) -> str:
    return f"{self.smem_prefix}{self.render_dtype(dt)} {name}[{size}];"

  def render_special(self, name: str, dim: int) -> str:
    kind = name[0]
    if kind not in self.code_for_workitem: raise UnsupportedError(f"{self.dialect_name} has no work-item index {name}")
    return f"int {name} = {self.code_for_workitem[kind](dim)};"

  def render_range(self, u: UOp, var: str, start: str, end: str) -> list[str]:
    """The line(s) opening the loop of RANGE u over [start, end) with index variable var."""
    return [f"for ({self.render_dtype(dtype_of(u))} {var} = {start}; {var} < {end}; {var}++) {{"]

  def render_wmma(self, u: UOp, srcs: list[str]) -> str: raise UnsupportedError(f"{self.dialect_name} has no WMMA")
  def render_image_load(self, u: UOp, srcs: list[str]) -> str:
    raise UnsupportedError(f"{self.dialect_name} has no images")
  def render_image_store(self, u: UOp, srcs: list[str]) -> str:
    raise UnsupportedError(f"{self.dialect_name} has no images")

  def render_param(self, name: str, dt: DType, writable: bool) -> str:
    const = "" if writable else "const "
    return f"{self.buffer_prefix}{const}{self.render_dtype(dt)}*{self.buffer_suffix} {name}"

  def render_var_param(self, name: str, dt: DType) -> str:
    """A Variable parameter: arg_int_prefix, with its int spelled as dt when the Variable needs 64 bits."""
    if dt == dtypes.int32: return f"{self.arg_int_prefix} {name}"
    head, _, tail = self.arg_int_prefix.rpartition("int")
    return f"{head}{self.render_dtype(dt)}{tail} {name}"

  def render_kernel(self, name: str, params: list[str], body: list[str], preamble: list[str]) -> str:
    head = "\n".join([*self.includes, *preamble])
    return f"{head}\n{self.kernel_prefix}void {name}({', '.join(params)}) {{\n" + "\n".join(body) + "\n}\n"

  # ***** helpers (emitted into the preamble only when used) *****

  def helper(self, name: str, code: str) -> str:
    """Register the preamble function `name` (once per render) and return its name."""
    if (ctx := _current.get()) is not None: ctx.helpers.setdefault(name, code)
    return name

  def _suffix(self, dt: DType) -> str:
    if dt == dtypes.bool: return "b"
    return f"{'f' if dtypes.is_float(dt) else 'u' if dtypes.is_unsigned(dt) else 'i'}{8 * dt.itemsize}"

  def int_helper(self, kind: str, dt: DType) -> str:
    """IDIV/MOD without traps: a zero divisor gives 0, MIN / -1 wraps and MIN % -1 is 0."""
    t, name, p = self.render_dtype(dt), f"ko_{kind}_{self._suffix(dt)}", self.helper_prefix
    if dtypes.is_float(dt):
      body = f"b == 0 ? 0 : fmod{self.math_suffix(dt)}(a, b)"
      return self.helper(name, f"{p} {t} {name}({t} a, {t} b) {{ return {body}; }}")
    signed = dtypes.is_int(dt) and not dtypes.is_unsigned(dt)
    if kind == "idiv":
      neg = f"(({t})(0u-({self.render_dtype(_wide_unsigned(dt))})a))"
      body = f"b == 0 ? 0 : b == -1 ? {neg} : ({t})(a / b)" if signed else f"b == 0 ? 0 : ({t})(a / b)"
    else: body = f"(b == 0 || b == -1) ? 0 : ({t})(a % b)" if signed else f"b == 0 ? 0 : ({t})(a % b)"
    return self.helper(name, f"{p} {t} {name}({t} a, {t} b) {{ return {body}; }}")

  def max_helper(self, dt: DType) -> str:
    t, name = self.render_dtype(dt), f"ko_max_{self._suffix(dt)}"
    return self.helper(name, f"{self.helper_prefix} {t} {name}({t} a, {t} b) {{ return a > b ? a : b; }}")

  def f2i_helper(self, src: DType, dst: DType) -> str:
    """float -> int truncation; out of range (unspecified by the op table) gives 0, not C's undefined behaviour."""
    bits, name = 8 * dst.itemsize, f"ko_{self._suffix(src)}_to_{self._suffix(dst)}"
    if dtypes.is_unsigned(dst): lo, hi = "x > -1.0", f"x < {float(1 << bits)!r}"
    elif bits == 64: lo, hi = f"x >= {-float(1 << 63)!r}", f"x < {float(1 << 63)!r}"
    else: lo, hi = f"x > {-float((1 << (bits - 1)) + 1)!r}", f"x < {float(1 << (bits - 1))!r}"
    t, s = self.render_dtype(dst), self.render_dtype(src)
    return self.helper(name, f"{self.helper_prefix} {t} {name}({s} x) {{ return ({lo} && {hi}) ? ({t})x : 0; }}")

  # ***** the renderer *****

  def spelling(self, op: ALUOp) -> Spelling:
    """The spelling of op: the nearest class in this dialect's hierarchy whose code_for_op names it."""
    # a class object is hashable; mypy checks the instance's __hash__ (None on a non-frozen dataclass) instead
    return _merged_ops(type(self)).get(op)  # type: ignore[arg-type]

  def render_alu(self, op: ALUOp, dt: DType, srcs: list[str]) -> str:
    """op on operands of dtype dt (the branches' dtype for WHERE) as an expression in dt's compute type."""
    if dt.count > 1: raise UnsupportedError(f"{self.dialect_name} has no vector ALU ({op.name} on {dt})")
    spell, cdt = self.spelling(op), self.compute_dtype(dt)
    if spell is None: raise UnsupportedError(f"{self.dialect_name} can't spell {op.name}")
    if op in _NO_BOOL_OPS and dt == dtypes.bool: raise UnsupportedError(f"{op.name} is not defined on bool")
    ret = spell.format(*srcs, t=self.render_dtype(cdt)) if isinstance(spell, str) else spell(self, cdt, *srcs)
    if op not in self._exact_ops and _dtype_in(dt, self.storage_floats): ret = self.round_storage(ret, dt)
    return ret

  def render(self, name: str, uops: list[UOp]) -> str:
    """The source of uops, spelled exactly as listed (the passes ran before: kernopt.passes)."""
    with rendering(self.render_context(uops)) as ctx: return (self.emitter or Emitter)(self, ctx).emit(name, uops)

  def render_context(self, uops: list[UOp]) -> RenderContext:
    """The context one render of uops spells in: what the spellings read about the whole list."""
    return RenderContext(workgroup=workgroup_size(uops))

  @property
  def context(self) -> RenderContext:
    """The context of the render in progress (an empty one outside a render)."""
    return _current.get() or RenderContext()

  def workgroup_threads(self) -> int:
    """The threads in one workgroup of the kernel being rendered: the product of its local sizes."""
    return self.context.workgroup or 1

@functools.lru_cache(None)
def _merged_ops(cls: type) -> dict[ALUOp, Spelling]:
  ret: dict[ALUOp, Spelling] = {}
  for klass in reversed(cls.__mro__): ret.update(klass.__dict__.get("code_for_op", {}))
  return ret

def _float_literal(val: float) -> str:
  """The shortest decimal that reads back as the float32 val (val must already be a float32 value)."""
  want = struct.pack("<f", val)
  for prec in range(1, 10):
    s = f"{val:.{prec}g}"
    try:
      if struct.pack("<f", float(s)) == want: break
    except OverflowError: continue  # rounded past the largest float
  return s if any(c in s for c in ".en") else s + ".0"

# A Variable's name (any ASCII identifier) is spelled under VAR_PREFIX: no identifier kernopt emits starts with it,
# so a name can't meet kernopt's own (ridx0, data0, acc0) or a dialect's keywords, macros and builtins (int, INFINITY).
VAR_PREFIX = "v_"
def var_name(expr: str) -> str: return VAR_PREFIX + expr

_INLINABLE = frozenset((UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.VECTORIZE))
# inlined expressions nest at most this deep (each level adds up to ~3 brackets; clang allows 256 by default)
MAX_INLINE_DEPTH = 64
# enum members as module constants for the emitter's dispatch: an attribute of an Enum class costs ~0.15 us on 3.11
_ALU, _BARRIER, _BITCAST, _CAST, _CONST, _DEFINE_ACC = \
  UOps.ALU, UOps.BARRIER, UOps.BITCAST, UOps.CAST, UOps.CONST, UOps.DEFINE_ACC
_DEFINE_GLOBAL, _DEFINE_LOCAL, _DEFINE_VAR, _ENDIF, _ENDRANGE, _GEP, _IF = \
  UOps.DEFINE_GLOBAL, UOps.DEFINE_LOCAL, UOps.DEFINE_VAR, UOps.ENDIF, UOps.ENDRANGE, UOps.GEP, UOps.IF
_LOAD, _PHI, _RANGE, _SINK, _SPECIAL, _STORE, _VECTORIZE, _WMMA = \
  UOps.LOAD, UOps.PHI, UOps.RANGE, UOps.SINK, UOps.SPECIAL, UOps.STORE, UOps.VECTORIZE, UOps.WMMA

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
      nest, d = self.nest, 0
      for s in u.src:
        if s.op is _DEFINE_ACC: break
        if (ds := nest.get(s, 0)) > d: d = ds
      else:
        if d < MAX_INLINE_DEPTH:
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
        opdt = dtype_of(src[1] if u.arg is TernaryOps.WHERE else src[0])
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
      elif op is _VECTORIZE: self.value(u, lang.render_vectorize(dtype_of(u), [r[s] for s in src]), uses.get(u, 0))
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
    else: expr = lang.render_load(r[buf], r[src[1]], dtype_of(u), buf_dt)
    if len(src) == 4: expr = f"({r[src[2]]}?{expr}:{r[src[3]]})"
    r[u] = v = self.fresh("val")
    self.line(f"{self.value_dtype(dtype_of(u))} {v} = {expr};")

  def store(self, u: UOp) -> None:
    lang, r, src = self.lang, self.r, u.src
    buf_dt = dtype_of(src[0])
    if isinstance(buf_dt, ImageDType): stmt = lang.render_image_store(u, [r[s] for s in src])
    else:
      spell = lang.render_nontemporal_store if u.arg is Mark.NONTEMPORAL else lang.render_store
      stmt = spell(r[src[0]], r[src[1]], r[src[2]], dtype_of(src[2]), buf_dt)
    self.line(f"if ({r[src[3]]}) {{ {stmt} }}" if len(src) == 4 else stmt)

# ***** the C dialect *****

# half in memory: _Float16 where the compiler has it (gcc >= 12, clang >= 15 on x86), else clang's __fp16, which
# every clang target has as a storage-only type. Arithmetic happens in float either way. ko_to_half rounds a float or
# a double to half once, to nearest even: __fp16 converts doubles wrongly in clang 14, so there a double is first
# narrowed to float rounding to odd, which keeps the one float->half rounding exact (float has 13 more bits than half)
_HALF_TYPEDEF = """#if defined(__FLT16_MAX__)
typedef _Float16 ko_half;
#define ko_to_half(x) ((ko_half)(x))
#else
typedef __fp16 ko_half;
static inline float ko_float_id(float x) { return x; }
static inline float ko_d2f_odd(double d) {
  float f = (float)d;
  if ((double)f != d && d == d) {
    uint32_t u; memcpy(&u, &f, 4);
    if (fabs((double)f) > fabs(d)) u -= 1;
    u |= 1u; memcpy(&f, &u, 4);
  }
  return f;
}
#define ko_to_half(x) ((ko_half)_Generic((x), double: ko_d2f_odd, default: ko_float_id)(x))
#endif"""

_BF16_HELPERS = {
  "ko_bf16_to_f": "static inline float ko_bf16_to_f(uint16_t b) { uint32_t u = (uint32_t)b << 16; float f; "
                  "memcpy(&f, &u, 4); return f; }",
  "ko_f_to_bf16": "static inline uint16_t ko_f_to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4); "
                  "if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); "
                  "return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }"}

class CRenderer(CStyleLanguage):
  """C11 with GCC/clang extensions, for the CPU device: one function whose loops cover the whole launch.
  half is `_Float16` (or clang's `__fp16`) in memory and bfloat16 a uint16_t bit pattern; both are computed in
  float, each ALU result
  rounded back to nearest even (so results match ops.exec_alu bit for bit). Integer ops have no undefined
  behaviour. Vector types use GCC vector extensions and unaligned memcpy access."""
  # has_shared is declared, but without local threads nothing uses it
  caps = Capabilities(device="CPU", has_local=False, has_shared=True, supports_float4=False, global_max=None,
                      local_max=(0x8FFFFFFF,) * 3, shared_max=32768)
  arg_int_prefix = "int"
  buffer_suffix = " restrict"
  includes = ("#include <math.h>", "#include <stdbool.h>", "#include <stdint.h>", "#include <string.h>")
  type_map = {
    dtypes.bool: "bool", dtypes.int8: "int8_t", dtypes.uint8: "uint8_t", dtypes.int16: "int16_t",
    dtypes.uint16: "uint16_t", dtypes.int32: "int32_t", dtypes.uint32: "uint32_t", dtypes.int64: "int64_t",
    dtypes.uint64: "uint64_t", dtypes.half: "ko_half", dtypes.bfloat16: "uint16_t", dtypes.float32: "float",
    dtypes.float64: "double"}

  def render_dtype(self, dt: DType) -> str:
    # memoized by identity (DType hashing dominates emission otherwise); the entry keeps dt alive, so ids stay unique
    cache: dict[int, tuple[DType, str, Optional[str]]] = self.__dict__.setdefault("_dtype_names", {})
    if (hit := cache.get(id(dt))) is None or hit[0] is not dt:
      hit = cache[id(dt)] = (dt, *self._render_dtype(dt))
    if hit[2] is not None: self.helper(hit[1], hit[2])
    return hit[1]

  def _render_dtype(self, dt: DType) -> tuple[str, Optional[str]]:
    """dt's C spelling and the typedef it needs (None for none)."""
    if dt == dtypes.half: return "ko_half", _HALF_TYPEDEF
    if dt.count > 1 and not isinstance(dt, ImageDType):
      scalar = dt.scalar()
      if scalar in self.storage_floats or scalar == dtypes.bool or dt.count & (dt.count - 1):
        raise UnsupportedError(f"{self.dialect_name} has no vector type {dt}")
      name = f"{self.render_dtype(scalar)}{dt.count}"
      return name, (f"typedef {self.render_dtype(scalar)} {name} __attribute__((aligned({dt.itemsize}), "
                    f"vector_size({dt.itemsize})));")
    return super().render_dtype(dt), None

  def render_vectorize(self, dt: DType, elems: list[str]) -> str:
    return f"(({self.render_dtype(dt)}){{{', '.join(elems)}}})"
  def render_gep(self, x: str, lane: int, dt: DType) -> str: return f"{x}[{lane}]"

  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType) -> str:
    if dt.count == 1: return super().render_load(buf, idx, dt, buf_dt)
    # an unaligned vector read without aliasing or alignment undefined behaviour
    vt, helper = self.render_dtype(dt), f"ko_vload_{self.render_dtype(dt)}"
    self.helper(helper, f"static inline {vt} {helper}(const void* p) {{ {vt} v; memcpy(&v, p, sizeof(v)); return v; }}")
    return f"{helper}({buf}+{idx})"

  def render_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType) -> str:
    if dt.count == 1: return super().render_store(buf, idx, val, dt, buf_dt)
    return f"{{ {self.render_dtype(dt)} v_ = {val}; memcpy({buf}+{idx}, &v_, sizeof(v_)); }}"

  def to_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.half:
      self.render_dtype(dt)  # declares ko_half and, with it, ko_to_half
      return f"ko_to_half({x})"
    return f"{self.helper('ko_f_to_bf16', _BF16_HELPERS['ko_f_to_bf16'])}({x})" if dt == dtypes.bfloat16 else \
      super().to_storage(x, dt)

  def from_storage(self, x: str, dt: DType) -> str:
    return f"{self.helper('ko_bf16_to_f', _BF16_HELPERS['ko_bf16_to_f'])}({x})" if dt == dtypes.bfloat16 else \
      super().from_storage(x, dt)

  def round_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.bfloat16: return self.from_storage(self.to_storage(f"((float){x})", dt), dt)
    if dt == dtypes.half: return self.from_storage(self.to_storage(x, dt), dt)
    return super().round_storage(x, dt)

  def render_special(self, name: str, dim: int) -> str:
    raise UnsupportedError(f"{self.dialect_name} has no threads: {name} must be a loop")
