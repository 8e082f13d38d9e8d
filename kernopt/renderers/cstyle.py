"""The C-style renderer base (`CStyleLanguage`) and the C dialect (`CRenderer`, device "CPU"). The base spells a
linearized UOp list, exactly as listed, as one C-family function, each render in a `RenderContext` of its own (the
walk over the list is kernopt/renderers/emitter.py's `Emitter`); a dialect changes only spellings: attributes
(prefixes, type names, barrier), the `code_for_op` table (merged along the class hierarchy) and the small `render_*`
hooks. Imports dtype, errors, ops, uops and renderers."""
from __future__ import annotations
import functools
import math
import struct
from typing import Any, Callable, Optional, Union
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import ALUOp, BinaryOps, TernaryOps, UnaryOps, truncate_float
from kernopt.renderers import Capabilities, Renderer
from kernopt.renderers.emitter import Emitter, RenderContext, current_context, dtype_of, rendering, workgroup_size
from kernopt.uops import UOp

# a spelling: a str.format template over the operands ({0}, {1}, ...; {t} is the operand C type), or a function
# (renderer, operand compute dtype, *operand expressions) -> expression; None marks an op the dialect lacks
Spelling = Optional[Union[str, Callable[..., str]]]

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

# render_alu's plan of an (op, dtype) per dialect class and storage-float set: its spelling, compute dtype and
# whether the result is rounded to storage. Module-level, not on the renderer (a renderer is pickled to search
# workers; a spelling may be a closure). Each entry keeps its dtype and set alive, so their ids are not reused
_ALU_PLANS: dict[tuple[type, int, Any, int], tuple[DType, frozenset[DType], Any, DType, bool]] = {}

_INT_LIKE: dict[int, tuple[DType, bool]] = {}
def _int_like(dt: DType) -> bool:
  """dt is an integer type or bool."""
  if (hit := _INT_LIKE.get(id(dt))) is not None and hit[0] is dt: return hit[1]
  if len(_INT_LIKE) > 1024: _INT_LIKE.clear()
  ret = dtypes.is_int(dt) or dt == dtypes.bool
  _INT_LIKE[id(dt)] = (dt, ret)
  return ret

# (dialect class, dtype identity) -> (dtype, its spelling, its wide unsigned type's) for _wrap: a scalar integer type
# is spelled from the class's type_map, registering no helper. The entry keeps the dtype alive, so its id is not reused
_WRAP_TYPES: dict[tuple[type, int], tuple[DType, str, str]] = {}

def _wrap(op: str) -> Callable[..., str]:
  """Integer `a op b` in the wide unsigned type (no signed overflow), converted back to the operand type."""
  def fn(r: CStyleLanguage, dt: DType, a: str, b: str) -> str:
    if not _int_like(dt): return f"({a}{op}{b})"
    if (hit := _WRAP_TYPES.get(key := (type(r), id(dt)))) is None or hit[0] is not dt:
      if len(_WRAP_TYPES) > 1024: _WRAP_TYPES.clear()
      hit = (dt, r.render_dtype(dt), r.render_dtype(_wide_unsigned(dt)))
      if dt.count == 1: _WRAP_TYPES[key] = hit
    _, t, u = hit
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

  def render_masked_load(self, buf: str, idx: str, mask: str, dt: DType) -> str:
    """A vector of dt.count contiguous elements from buf[idx], lane l read only where bit l of the int mask is set
    (+0.0 elsewhere): the vectorize pass makes these where caps.masked_loads."""
    raise UnsupportedError(f"{self.dialect_name} has no masked vector loads ({dt} from {buf})")

  def render_masked_store(self, buf: str, idx: str, val: str, mask: str, dt: DType) -> str:
    """Lane l of the vector val to buf[idx + l] only where bit l of the int mask is set: the lowerer's vector plan
    makes these where caps.masked_stores (a tile's PADTO'd columns)."""
    raise UnsupportedError(f"{self.dialect_name} has no masked vector stores ({dt} to {buf})")

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

  def render_shuffle(self, dt: DType, picks: list[tuple[str, int]]) -> Optional[str]:
    """A vector dt whose lane l is lane picks[l][1] of the vector named picks[l][0], when the dialect has a better
    spelling than the lanes one by one (render_vectorize of the GEPs); None: it has not."""
    return None

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
    if (ctx := current_context()) is not None: ctx.helpers.setdefault(name, code)
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
    # (spelling, compute dtype, rounded to storage) per dialect class, storage set, op and dtype (see _ALU_PLANS)
    key = (type(self), id(sf := self.storage_floats), op, id(dt))
    if (plan := _ALU_PLANS.get(key)) is None or plan[0] is not dt or plan[1] is not sf:
      if dt.count > 1: raise UnsupportedError(f"{self.dialect_name} has no vector ALU ({op.name} on {dt})")
      spell = self.spelling(op)
      if spell is None: raise UnsupportedError(f"{self.dialect_name} can't spell {op.name}")
      if op in _NO_BOOL_OPS and dt == dtypes.bool: raise UnsupportedError(f"{op.name} is not defined on bool")
      if len(_ALU_PLANS) > 4096: _ALU_PLANS.clear()
      plan = _ALU_PLANS[key] = (dt, sf, spell, self.compute_dtype(dt), op not in self._exact_ops and _dtype_in(dt, sf))
    _, _, spell, cdt, rounded = plan
    ret = spell.format(*srcs, t=self.render_dtype(cdt)) if isinstance(spell, str) else spell(self, cdt, *srcs)
    return self.round_storage(ret, dt) if rounded else ret

  def render(self, name: str, uops: list[UOp]) -> str:
    """The source of uops, spelled exactly as listed (the passes ran before: kernopt.passes)."""
    with rendering(self.render_context(uops)) as ctx: return (self.emitter or Emitter)(self, ctx).emit(name, uops)

  def render_context(self, uops: list[UOp]) -> RenderContext:
    """The context one render of uops spells in: what the spellings read about the whole list."""
    return RenderContext(workgroup=workgroup_size(uops))

  @property
  def context(self) -> RenderContext:
    """The context of the render in progress (an empty one outside a render)."""
    return current_context() or RenderContext()

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
                      local_max=(0x8FFFFFFF,) * 3, shared_max=32768, sign_bit_negate=True)
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
