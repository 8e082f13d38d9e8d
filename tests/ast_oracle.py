"""An independent numpy evaluator of kernel ASTs, the oracle of the generative fuzzer (tests/test_fuzz_ast.py).
It imports only the AST's data classes (LazyOp, MemBuffer, ConstBuffer, the op enums), the fields of View and
ShapeTracker, the symbolic node classes (for their fields) and dtypes. Views are evaluated by its own index arithmetic
from shape, strides, offset and mask; ops follow DESIGN.md's op semantics, written again here from the text: int IDIV
truncates toward zero and MOD takes the dividend's sign, both 0 on a zero divisor; ints wrap; MAX is a > b ? a : b;
float IDIV is true division; a float CAST to an int truncates, NaN, inf or out of range giving 0; half and bfloat16
are computed in float and rounded (to nearest even) on store or CAST. Integers are held as numpy object arrays of
Python ints (exact, wrapped after each op), floats as float32 (half, bfloat16, float32) or float64 arrays, bools as
numpy bools."""
from __future__ import annotations
import math
from typing import Any, Optional
import numpy as np
from kernopt.dtype import DType, dtypes
from kernopt.ops import BinaryOps, BufferOps, LazyOp, MetaOps, ReduceOps, TernaryOps, UnaryOps
from kernopt.shape import symbolic as sym

class OracleError(Exception):
  """The AST or its inputs are outside what the oracle evaluates (a generator bug, not a kernopt one)."""

# ***** symbolic values *****

def sym_eval(x: Any, vv: dict[str, int]) -> int:
  """The integer value of an int or symbolic node at var_vals vv (floor division and modulo, as contracts.md)."""
  if isinstance(x, (int, np.integer)) and not isinstance(x, bool): return int(x)
  if isinstance(x, sym.NumNode): return x.b
  if isinstance(x, sym.Variable):
    if x.expr in vv: return vv[x.expr]
    if x.val is not None: return x.val
    raise OracleError(f"no value for variable {x.expr}")
  if isinstance(x, sym.MulNode): return sym_eval(x.a, vv) * sym_eval(x.b, vv)
  if isinstance(x, sym.DivNode): return sym_eval(x.a, vv) // sym_eval(x.b, vv)
  if isinstance(x, sym.ModNode): return sym_eval(x.a, vv) % sym_eval(x.b, vv)
  if isinstance(x, sym.LtNode): return int(sym_eval(x.a, vv) < sym_eval(x.b, vv))
  if isinstance(x, sym.SumNode): return sum(sym_eval(n, vv) for n in x.nodes)
  if isinstance(x, sym.AndNode): return int(all(sym_eval(n, vv) for n in x.nodes))
  raise OracleError(f"cannot evaluate symbolic {type(x).__name__} {x!r}")

def concrete_shape(shape: tuple, vv: dict[str, int]) -> tuple[int, ...]:
  return tuple(sym_eval(s, vv) for s in shape)

# ***** views *****

def _view_index(v: Any, vv: dict[str, int], idxs: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
  """(flat index, valid) of view v at per-axis index arrays idxs: offset + sum(i*stride), valid inside the mask."""
  flat = np.full(idxs[0].shape if idxs else (), sym_eval(v.offset, vv), dtype=np.int64)
  valid = np.ones(flat.shape, dtype=bool)
  for k, i in enumerate(idxs):
    flat = flat + i * sym_eval(v.strides[k], vv)
    if v.mask is not None:
      lo, hi = sym_eval(v.mask[k][0], vv), sym_eval(v.mask[k][1], vv)
      valid &= (i >= lo) & (i < hi)
  return flat, valid

def st_index(st: Any, vv: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
  """(flat buffer index, valid) for every element of a ShapeTracker's shape at vv. The last view maps the element to
  a flat index in the shape of the view before it (unflattened C-order, each coordinate modulo its size), and so on
  down to the first view, whose flat index addresses the buffer; an element is valid where every view's mask holds."""
  views = st.views
  shape = concrete_shape(views[-1].shape, vv)
  idxs = [a.astype(np.int64) for a in np.indices(shape)] if shape else []
  flat, valid = _view_index(views[-1], vv, idxs)
  for v in reversed(views[:-1]):
    vshape = concrete_shape(v.shape, vv)
    inner, sub = 1, []
    for d in reversed(vshape):
      sub.append((flat // inner) % d if d else np.zeros_like(flat))
      inner *= d
    f2, ok = _view_index(v, vv, sub[::-1])
    flat, valid = f2, valid & ok
  return flat, valid

def needed_size(st: Any, vv: dict[str, int]) -> int:
  """One past the highest buffer element st addresses at vv (0 when nothing is valid); raises on a negative one."""
  flat, valid = st_index(st, vv)
  if not valid.any(): return 0
  if int(flat[valid].min()) < 0: raise OracleError(f"view addresses element {int(flat[valid].min())} < 0")
  return int(flat[valid].max()) + 1

# ***** dtypes: storage (numpy arrays of a buffer) and compute representations *****

_MANT = {dtypes.float16: 11, dtypes.bfloat16: 8, dtypes.float32: 24, dtypes.float64: 53}

def is_float(dt: DType) -> bool: return dt in _MANT
def is_int(dt: DType) -> bool: return not is_float(dt) and dt != dtypes.bool
def bits(dt: DType) -> int: return 8 * dt.itemsize
def int_range(dt: DType) -> tuple[int, int]:
  if dt == dtypes.bool: return 0, 1
  if dtypes.is_unsigned(dt): return 0, (1 << bits(dt)) - 1
  return -(1 << (bits(dt) - 1)), (1 << (bits(dt) - 1)) - 1

def storage_np(dt: DType) -> np.dtype:
  """The numpy dtype of a buffer of dt (bfloat16: its uint16 bit pattern)."""
  return np.dtype(np.uint16) if dt == dtypes.bfloat16 else np.dtype(dt.fmt)

def _compute_np(dt: DType) -> Any: return np.float64 if dt == dtypes.float64 else np.float32

def wrap(x: np.ndarray, dt: DType) -> np.ndarray:
  """Object array of Python ints wrapped into dt's range (two's complement)."""
  b = bits(dt)
  r = np.asarray(x, dtype=object) & ((1 << b) - 1)
  if not dtypes.is_unsigned(dt): r = np.where(r >= (1 << (b - 1)), r - (1 << b), r)
  return np.asarray(r, dtype=object)

def bf16_round(x: np.ndarray) -> np.ndarray:
  """float32 values -> bfloat16 bit patterns, nearest even (nan stays a quiet nan)."""
  f = np.asarray(x, dtype=np.float32)
  b = f.view(np.uint32).astype(np.uint64)
  r = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16)
  return np.where(np.isnan(f), np.uint16(0x7FC0), r).astype(np.uint16)

def bf16_value(b: np.ndarray) -> np.ndarray:
  return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)

def from_storage(a: np.ndarray, dt: DType) -> np.ndarray:
  """Buffer contents -> compute representation."""
  if dt == dtypes.bfloat16: return bf16_value(a)
  if is_float(dt): return np.asarray(a).astype(_compute_np(dt))
  if dt == dtypes.bool: return np.asarray(a).astype(bool)
  return np.asarray(np.asarray(a).astype(storage_np(dt)).tolist(), dtype=object).reshape(np.shape(a))

def to_storage(x: np.ndarray, dt: DType) -> np.ndarray:
  """Compute representation -> buffer contents (half and bfloat16 rounded to nearest even)."""
  if dt == dtypes.bfloat16: return bf16_round(np.asarray(x, dtype=np.float32))
  if is_float(dt):
    with np.errstate(over="ignore", invalid="ignore"): return np.asarray(x).astype(storage_np(dt))
  if dt == dtypes.bool: return np.asarray(x).astype(bool)
  return np.asarray(wrap(x, dt).tolist(), dtype=storage_np(dt)).reshape(np.shape(x))

def _round_to(x: np.ndarray, dt: DType) -> np.ndarray:
  """A float value rounded to dt's precision, in dt's compute representation."""
  return from_storage(to_storage(x, dt), dt)

def const_value(val: Any, dt: DType) -> Any:
  if is_float(dt): return _round_to(np.asarray(float(val)), dt)
  if dt == dtypes.bool: return bool(val)
  return int(wrap(np.asarray([int(val)], dtype=object), dt)[0])

def zeros(shape: tuple[int, ...], dt: DType) -> np.ndarray:
  if is_float(dt): return np.zeros(shape, _compute_np(dt))
  if dt == dtypes.bool: return np.zeros(shape, bool)
  return np.full(shape, 0, dtype=object)

# ***** the ops *****

def _trunc_div(a: int, b: int) -> int:
  if b == 0: return 0
  q = abs(a) // abs(b)
  return q if (a < 0) == (b < 0) else -q

_tdiv = np.frompyfunc(_trunc_div, 2, 1)
_tmod = np.frompyfunc(lambda a, b: 0 if b == 0 else a - b * _trunc_div(a, b), 2, 1)

def _cast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  if is_float(dst):
    if is_float(src): v = x.astype(np.float64)
    elif src == dtypes.bool: v = x.astype(np.float64)
    else: v = np.asarray([float(i) for i in x.reshape(-1)], dtype=np.float64).reshape(x.shape)
    if dst == dtypes.float64: return v
    with np.errstate(over="ignore"): f = v.astype(np.float32)   # int -> float32: the double is exact for |i| < 2**53
    return _round_to(f, dst) if dst != dtypes.float32 else f
  if dst == dtypes.bool: return (x != 0) if src != dtypes.bool else x.copy()
  if is_float(src):   # truncated toward zero; NaN, inf and values dst cannot hold give 0 (DESIGN's op semantics)
    lo, hi = dtypes.min(dst), dtypes.max(dst)
    ts = np.trunc(x.astype(np.float64)).reshape(-1)
    ints = [int(f) if math.isfinite(f) and lo <= int(f) <= hi else 0 for f in ts]
    return np.asarray(ints, dtype=object).reshape(x.shape)
  if src == dtypes.bool: return np.asarray(x.astype(int).tolist(), dtype=object).reshape(x.shape)
  return wrap(x, dst)

def _bitcast(x: np.ndarray, src: DType, dst: DType) -> np.ndarray:
  return from_storage(to_storage(x, src).view(storage_np(dst)), dst)

def _alu(op: Any, dt: DType, srcs: list[np.ndarray], sdts: list[DType]) -> np.ndarray:
  """dt is the operands' dtype (the sources of WHERE after its condition)."""
  fl, bl = is_float(dt), dt == dtypes.bool
  a = srcs[0]
  with np.errstate(all="ignore"):
    if op is UnaryOps.NEG: return ~a if bl else (-a if fl else wrap(-a, dt))
    if op is UnaryOps.RECIP: return (np.asarray(1, a.dtype) / a) if fl else wrap(_tdiv(1, a), dt)
    if op is UnaryOps.EXP2: return np.exp2(a)
    if op is UnaryOps.LOG2: return np.log2(a)
    if op is UnaryOps.SIN: return np.sin(a)
    if op is UnaryOps.SQRT: return np.sqrt(a)
    if op is TernaryOps.WHERE: return np.where(srcs[0], srcs[1], srcs[2])
    if op is TernaryOps.MULACC:
      if fl: return a * srcs[1] + srcs[2]
      return wrap(a * srcs[1] + srcs[2], dt)
    b = srcs[1]
    if op is BinaryOps.CMPLT: return np.asarray(a < b, dtype=bool)
    if op is BinaryOps.CMPNE: return np.asarray(a != b, dtype=bool)
    if op is BinaryOps.MAX: return np.where(a > b, a, b)
    if bl:
      if op in (BinaryOps.ADD, BinaryOps.OR): return a | b
      if op in (BinaryOps.MUL, BinaryOps.AND): return a & b
      if op is BinaryOps.XOR: return a ^ b
      raise OracleError(f"{op} on bool")
    if fl:
      if op is BinaryOps.ADD: return a + b
      if op is BinaryOps.MUL: return a * b
      if op is BinaryOps.IDIV: return a / b
      if op is BinaryOps.MOD: return np.where(b == 0, np.asarray(0, a.dtype), np.fmod(a, np.where(b == 0, 1, b)))
      raise OracleError(f"{op} on {dt}")
    if op is BinaryOps.ADD: return wrap(a + b, dt)
    if op is BinaryOps.MUL: return wrap(a * b, dt)
    if op is BinaryOps.IDIV: return wrap(_tdiv(a, b), dt)
    if op is BinaryOps.MOD: return wrap(_tmod(a, b), dt)
    if op is BinaryOps.XOR: return wrap(a ^ b, dt)
    if op is BinaryOps.AND: return wrap(a & b, dt)
    if op is BinaryOps.OR: return wrap(a | b, dt)
    if op is BinaryOps.SHL: return wrap(a << (b % bits(dt)), dt)
    if op is BinaryOps.SHR: return wrap(a >> (b % bits(dt)), dt)
  raise OracleError(f"unknown op {op}")

def _reduce(op: Any, x: np.ndarray, axes: tuple[int, ...], dt: DType) -> np.ndarray:
  if op is ReduceOps.MAX:
    if x.dtype == object: return np.asarray(np.max(x, axis=axes, keepdims=True), dtype=object)
    return np.max(x, axis=axes, keepdims=True)
  if op is not ReduceOps.SUM: raise OracleError(f"{op} is not evaluated")
  if dt == dtypes.bool: return np.any(x, axis=axes, keepdims=True)
  if is_float(dt):
    s = np.sum(x.astype(np.float64), axis=axes, keepdims=True)   # any order is allowed: sum as exactly as we can
    return s if dt == dtypes.float64 else s.astype(np.float32)
  return wrap(np.sum(x, axis=axes, keepdims=True), dt)

class Evaluation:
  """One evaluation of an AST: `buffers` (idx -> numpy storage array, outputs updated in place) at var_vals `vv`.
  After `run()`, `written[idx]` is the mask of output elements some STORE wrote and `scale[idx]` the largest finite
  magnitude of any float value computed under that STORE (the tolerance's scale)."""
  def __init__(self, buffers: dict[int, np.ndarray], vv: dict[str, int]):
    self.buffers, self.vv = buffers, vv
    self.memo: dict[LazyOp, np.ndarray] = {}
    self.written: dict[int, np.ndarray] = {}
    self.scale: dict[int, float] = {}
    self._mag = 0.0

  def run(self, ast: LazyOp) -> dict[int, np.ndarray]:
    if ast.op is not MetaOps.KERNEL: raise OracleError("the root must be a KERNEL")
    vals = []
    for st in ast.src:
      self._mag = 0.0
      vals.append((st, self.value(st.src[0])))
      self.scale[st.arg.idx] = self._mag
    # every STORE reads the inputs before any writes (outputs are never inputs)
    for st, v in vals: self._store(st, v)
    return {st.arg.idx: self.buffers[st.arg.idx] for st in ast.src}

  def _store(self, op: LazyOp, v: np.ndarray) -> None:
    mb = op.arg
    flat, valid = st_index(mb.st, self.vv)
    out = self.buffers[mb.idx]
    f = flat[valid]
    if f.size and (f.min() < 0 or f.max() >= out.size): raise OracleError(f"STORE {mb.idx} outside its buffer")
    if len(np.unique(f)) != f.size: raise OracleError(f"STORE {mb.idx} writes an element twice")
    out[f] = to_storage(np.broadcast_to(v, valid.shape)[valid], mb.dtype)
    w = self.written.setdefault(mb.idx, np.zeros(out.size, bool))
    w[f] = True

  def value(self, op: LazyOp) -> np.ndarray:
    if (hit := self.memo.get(op)) is not None: return hit
    # iterative post-order walk: deep chains must not recurse
    stack: list[tuple[LazyOp, bool]] = [(op, False)]
    while stack:
      x, ready = stack.pop()
      if x in self.memo: continue
      if not ready:
        stack.append((x, True))
        stack.extend((s, False) for s in x.src if s not in self.memo)
        continue
      r = self._eval(x)
      if r.dtype != object and r.dtype != bool and r.size:
        fin = np.abs(r[np.isfinite(r)])
        if fin.size: self._mag = max(self._mag, float(fin.max()))
      self.memo[x] = r
    return self.memo[op]

  def _eval(self, x: LazyOp) -> np.ndarray:
    if x.op is BufferOps.LOAD:
      mb = x.arg
      if mb.idx < 0: raise OracleError("local buffers are not evaluated")
      flat, valid = st_index(mb.st, self.vv)
      data = self.buffers[mb.idx]
      f = flat[valid]
      if f.size and (f.min() < 0 or f.max() >= data.size): raise OracleError(f"LOAD {mb.idx} outside its buffer")
      ret = zeros(valid.shape, mb.dtype)
      ret[valid] = from_storage(data[f], mb.dtype)
      return ret
    if x.op is BufferOps.CONST:
      cb = x.arg
      _, valid = st_index(cb.st, self.vv)
      ret = zeros(valid.shape, cb.dtype)
      # a symbolic CONST is its expression's integer value at var_vals, converted to the dtype
      val = sym_eval(cb.val, self.vv) if isinstance(cb.val, sym.Node) else cb.val
      ret[valid] = const_value(val, cb.dtype)
      return ret
    srcs = [self.memo[s] for s in x.src]
    sdts = [s.dtype for s in x.src]
    if x.op in ReduceOps: return _reduce(x.op, srcs[0], tuple(x.arg), sdts[0])
    if x.op is UnaryOps.CAST: return _cast(srcs[0], sdts[0], x.arg)
    if x.op is UnaryOps.BITCAST: return _bitcast(srcs[0], sdts[0], x.arg)
    return _alu(x.op, sdts[-1], srcs, sdts)

def evaluate(ast: LazyOp, inputs: dict[int, np.ndarray], outputs: dict[int, np.ndarray],
             vv: Optional[dict[str, int]] = None) -> Evaluation:
  """Run `ast` on copies of `outputs` (idx -> initial storage arrays) with `inputs` (idx -> storage arrays)."""
  bufs = {**{i: np.asarray(a) for i, a in inputs.items()}, **{i: np.array(a, copy=True) for i, a in outputs.items()}}
  ev = Evaluation(bufs, dict(vv or {}))
  ev.run(ast)
  return ev
