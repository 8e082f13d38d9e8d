"""The UOp IR that the lowerer produces, the graph rewrites transform and the renderers spell; `flops_mem`
estimates work from a linearized list. Imports dtype, errors, ops and shape/symbolic."""
from __future__ import annotations
import itertools
import sys
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Optional
from kernopt.dtype import DType, dtypes
from kernopt.errors import ShapeError
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps
from kernopt.shape.symbolic import NumNode

class UOps(Enum):
  """Each kind's sources and argument ("-" for none):
  SINK          src: the STOREs (and other effects) of the kernel                        arg: -
  DEFINE_GLOBAL src: -                        dtype: element dtype (ImageDType for images)  arg: (index, name, writable)
  DEFINE_VAR    src: -                        dtype: int32, int64 when its range needs it    arg: Variable
  DEFINE_LOCAL  src: -                        dtype: element dtype                           arg: (name, elements)
  DEFINE_ACC    src: the reduce RANGEs it accumulates over   dtype: accumulator dtype
                arg: (initial value, accumulator number): the number keeps interned accumulators distinct
  SPECIAL       src: -                        dtype: int32   arg: (dim, name, size): name "gidx<d>" or "lidx<d>"
  RANGE         src: (start, end)             dtype: the index dtype (int32, or int64)  arg: (axis, is_reduce)
                (+ the lowerer's copy number of a reduce axis it loops again; + a pass's loop mark, last:
                Mark.PARALLEL or a ReduceBlock)
  ENDRANGE      src: (RANGE,)                 (only in linearized lists)
  CONST         src: -                        arg: the Python value (already of dtype's kind)
  LOAD          src: (buf, idx) | (buf, idx, valid, alt) | (buf, idx, BARRIER)   dtype: may be a vector
  STORE         src: (buf, idx, value) | (buf, idx, value, valid)   dtype: -   arg: None | Mark.NONTEMPORAL
  ALU           src: operands                 arg: a UnaryOps/BinaryOps/TernaryOps member (not CAST/BITCAST)
  CAST          src: (x,)                     dtype: target (value conversion)
  BITCAST       src: (x,)                     dtype: target of the same size (bit reinterpretation)
  VECTORIZE     src: scalars                  dtype: the vector dtype
  GEP           src: (vector,)                arg: lane index
  PHI           src: (DEFINE_ACC, new value)  the accumulator takes the new value (an assignment in the loop)
  IF            src: (condition,) | (condition, BARRIER)
  ENDIF         src: (IF,)                    (only in linearized lists)
  BARRIER       src: the local STOREs it orders
  WMMA          src: (a, b, c) vectors        arg: ops.WMMAArg
  For images, idx is an int2 VECTORIZE of (x, y) texel coordinates and LOAD/STORE move float4 texels."""
  SINK = auto(); DEFINE_GLOBAL = auto(); DEFINE_VAR = auto(); DEFINE_LOCAL = auto(); DEFINE_ACC = auto() # noqa: E702
  SPECIAL = auto(); RANGE = auto(); ENDRANGE = auto(); CONST = auto(); LOAD = auto(); STORE = auto() # noqa: E702
  ALU = auto(); CAST = auto(); BITCAST = auto(); VECTORIZE = auto(); GEP = auto(); PHI = auto() # noqa: E702
  IF = auto(); ENDIF = auto(); BARRIER = auto(); WMMA = auto() # noqa: E702

UOps.__hash__ = object.__hash__  # type: ignore[method-assign]  # members are singletons: hash by identity

class UOp:
  """An interned, immutable node: UOp(op, dtype, src, arg) returns the existing node for equal arguments, so
  equality and hashing are identity and sharing is automatic."""
  __slots__ = ("op", "dtype", "src", "arg", "__weakref__", "__dict__")
  op: UOps
  dtype: Optional[DType]
  src: tuple[UOp, ...]
  arg: Any

  def __new__(cls, op: UOps, dtype: Optional[DType] = None, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
    if type(src) is not tuple: src = tuple(src)
    # dtypes are keyed by the identity of one canonical equal object, enum args by identity (cheap hashes)
    dk = None if dtype is None else (_dtype_ids.get(id(dtype)) or _dtype_id(dtype))
    # op enum members hash by identity (see ops.py) and equal only themselves: they key as they are
    if type(arg) is not float: ak = arg
    # a float by value, except where == doesn't tell doubles apart (0.0 == -0.0, nan != nan): by its repr there
    else: ak = (float, arg) if arg == arg and arg != 0 else (float, repr(arg))
    key = (op, dk, src, ak)
    if (ret := _interned.get(key)) is not None: return ret
    ret = object.__new__(cls)
    _set_op(ret, op)
    _set_dtype(ret, dtype)
    _set_src(ret, src)
    _set_arg(ret, arg)
    _interned[key] = ret
    if len(_interned) - _sweep_state[0] > _YOUNG: _sweep()
    return ret

  def __setattr__(self, name: str, value: Any) -> None: raise AttributeError(f"UOp is immutable (setting {name})")
  def __reduce__(self) -> tuple: return (UOp, (self.op, self.dtype, self.src, self.arg))
  def __repr__(self) -> str:
    return f"UOp({self.op.name}, {self.dtype}, arg={self.arg!r}, src=({', '.join(s.op.name for s in self.src)}))"

  @property
  def parents(self) -> set[UOp]:
    """Every UOp this one depends on, transitively (not including itself)."""
    seen: set[UOp] = set()
    stack = list(self.src)
    while stack:
      u = stack.pop()
      if u in seen: continue
      seen.add(u)
      stack.extend(u.src)
    return seen

  # small builders for the lowerer and the rewrites
  @staticmethod
  def const(dtype: DType, val: Any) -> UOp:
    t = type(val)
    if (t is int and dtype is _I32 and -0x80000000 <= val <= 0x7FFFFFFF) or (t is float and dtype in _FLOATS) or \
       (t is bool and dtype is _BOOL):
      return UOp(_CONST, dtype, (), val)  # already dtype's kind and range
    return UOp(_CONST, dtype, (), dtypes.as_const(val, dtype))
  def alu(self, op: Any, *src: UOp, dtype: Optional[DType] = None) -> UOp:
    out = dtype or (dtypes.bool if op in (BinaryOps.CMPLT, BinaryOps.CMPNE) else
                    (src[0].dtype if op is TernaryOps.WHERE else self.dtype))
    return UOp(UOps.ALU, out, (self,) + src, op)
  def cast(self, dtype: DType) -> UOp: return self if self.dtype == dtype else UOp(UOps.CAST, dtype, (self,))

class Mark(Enum):
  """What a pass (kernopt/passes) decided for the renderer to spell, carried in the UOp's arg."""
  PARALLEL = auto()      # RANGE (last arg field): its iterations are split across the CPU's threads
  NONTEMPORAL = auto()   # STORE: written past the caches; the kernel fences such stores before it returns

Mark.__hash__ = object.__hash__  # type: ignore[method-assign]  # singletons, as UOps

@dataclass(frozen=True)
class ReduceBlock:
  """The last arg field of a block loop: reduce RANGE `of` runs `steps` iterations from block*steps each iteration
  (kernopt/passes/reduce_blocking)."""
  of: UOp
  steps: int

def loop_mark(rng: UOp) -> Any:
  """The pass mark a RANGE carries (Mark.PARALLEL or a ReduceBlock), None when it has none."""
  arg = rng.arg
  return arg[-1] if len(arg) > 2 and isinstance(arg[-1], (Mark, ReduceBlock)) else None

_set_op, _set_dtype, _set_src, _set_arg = (getattr(UOp, f).__set__ for f in ("op", "dtype", "src", "arg"))
_interned: dict[tuple, UOp] = {}
_YOUNG = 1 << 15   # nodes made between sweeps
_sweep_state = [0, _YOUNG]   # table size after the last sweep, after the last full sweep
_dtype_ids: dict[int, int] = {}           # id(a DType object) -> id of the canonical equal one
_dtype_keep: dict[int, DType] = {}        # the objects behind those ids, kept alive so no id is reused
_dtype_canon: dict[DType, DType] = {}
_I32, _BOOL = dtypes.int32, dtypes.bool
_FLOATS = (dtypes.float32, dtypes.float64)
_CONST = UOps.CONST   # (an attribute of an Enum class costs ~0.1 us on Python 3.11)

def _dtype_id(dt: DType) -> int:
  if len(_dtype_keep) > 4096:
    _dtype_ids.clear()
    _dtype_keep.clear()
  canon = _dtype_canon.setdefault(dt, dt)
  _dtype_keep[id(dt)] = dt
  _dtype_ids[id(dt)] = id(canon)
  return id(canon)

def _sweep(full: bool = False) -> None:
  """Drop the interned UOps nothing else references (the table holds plain references: a weak-value table costs
  more per lookup). Only the nodes made since the last sweep are looked at, unless `full` or the table has doubled
  since the last full sweep. Newest first, so a dropped node's sources are seen after it has released them."""
  full = full or len(_interned) > 2 * _sweep_state[1]
  refcount, keys = sys.getrefcount, list(_interned if full else itertools.islice(_interned, _sweep_state[0], None))
  while keys:
    k = keys.pop()
    u = _interned[k]
    if refcount(u) <= 3: del _interned[k]  # referenced by the table, u and the call's argument only
    del k, u
  _sweep_state[0] = len(_interned)
  if full: _sweep_state[1] = max(_YOUNG, len(_interned))

# ops whose value only flows on to their users: when every use is an address or a guard, so is theirs
_PURE = frozenset({UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.VECTORIZE, UOps.GEP, UOps.CONST})

def _data_uops(uops: list[UOp]) -> set[UOp]:
  """The uops whose value some data use needs: everything except what only feeds LOAD/STORE addresses, their
  validity guards, IF conditions and loop bounds (a pure op is data when one of its users uses it as data)."""
  data: set[UOp] = set()
  pure, load, store, no_data = _PURE, UOps.LOAD, UOps.STORE, (UOps.IF, UOps.RANGE)
  for u in reversed(uops):  # users come after their sources
    op = u.op
    if op in pure:
      if u in data: data.update(u.src)
    elif op is load:
      if len(u.src) == 4: data.add(u.src[3])
    elif op is store: data.add(u.src[2])
    elif op not in no_data: data.update(u.src)
  return data

def flops_mem(uops: list[UOp], ignore_indexing: bool = True) -> tuple[Any, Any]:
  """(ALU operations, bytes loaded and stored from global memory) executed by one launch of a linearized
  program: counts inside a RANGE are multiplied by its trip count (a symbolic Node when the bounds are);
  lanes of vector ops count each. With ignore_indexing, ALU ops whose only uses are addresses, validity guards
  and loop bounds are not counted. An IF(c) block directly followed by an IF(c != True) block is one choice of two
  versions of the same work (passes/borders.py): the second, which does at least as much, counts instead of both."""
  data = _data_uops(uops) if ignore_indexing else None
  flops: Any = 0
  mem: Any = 0
  mults: Any = 1
  stack: list[Any] = []
  ifs: list[tuple[Any, Any, Any]] = []               # per open IF: flops and mem when it began, the block it replaces
  last: Optional[tuple[UOp, Any, Any, int]] = None   # the IF block closed last: (IF, its flops, its mem, ENDIF's index)
  IF, ENDIF = UOps.IF, UOps.ENDIF
  # enum members as locals: an attribute of an Enum class costs ~0.15 us on Python 3.11
  RANGE, ENDRANGE, SPECIAL, ALU, WMMA = UOps.RANGE, UOps.ENDRANGE, UOps.SPECIAL, UOps.ALU, UOps.WMMA
  LOAD, STORE, DEFINE_GLOBAL, MULACC = UOps.LOAD, UOps.STORE, UOps.DEFINE_GLOBAL, TernaryOps.MULACC
  for i, u in enumerate(uops):
    op = u.op
    if op is ALU:
      if data is not None and u not in data: continue
      w = u.dtype.count if u.dtype is not None else 1
      if u.arg is MULACC: w *= 2
      flops += mults * w
    elif op is LOAD or op is STORE:
      if u.src[0].op is DEFINE_GLOBAL:
        dt = u.dtype if op is LOAD else u.src[2].dtype
        mem += mults * (dt.itemsize if dt is not None else 0)
    elif op is RANGE:
      stack.append(mults)
      mults = mults * _trip_count(u)
    elif op is ENDRANGE:
      mults = stack.pop()
    elif op is IF:
      alt = last is not None and last[3] == i - 1 and _negates(u.src[0], last[0].src[0])
      ifs.append((flops, mem, last if alt else None))
    elif op is ENDIF:
      f0, m0, other = ifs.pop()
      if other is not None: flops, mem = flops - other[1], mem - other[2]
      last = (u.src[0], flops - f0, mem - m0, i)
    elif op is SPECIAL:
      mults = mults * u.arg[2]
    elif op is WMMA:
      # one WMMA per thread: the warp's n*m outputs are spread thread_local_sizes[2] per thread
      n, m, k = u.arg.dims
      threads = max(1, n * m // max(1, u.arg.thread_local_sizes[2]))
      flops += 2 * n * m * k * mults // threads
  return flops, mem

def _negates(c: UOp, other: UOp) -> bool:
  """c is CMPNE(other, True)."""
  return c.op is UOps.ALU and c.arg is BinaryOps.CMPNE and c.src[0] is other and c.src[1].op is UOps.CONST and \
    c.src[1].arg is True

def _trip_count(rng: UOp) -> Any:
  start, end = (_sym(s) for s in rng.src)
  if start is None or end is None: return 1
  n = end - start
  return n.b if isinstance(n, NumNode) else n

def _sym(u: UOp) -> Any:
  """The int or symbolic Node a loop-bound UOp evaluates to (constants, variables, ADD/MUL/IDIV), else None."""
  if u.op is UOps.CONST: return u.arg if isinstance(u.arg, int) and not isinstance(u.arg, bool) else None
  if u.op is UOps.DEFINE_VAR: return u.arg
  if u.op is not UOps.ALU or u.arg not in _SYM_OPS or len(u.src) != 2: return None
  a, b = _sym(u.src[0]), _sym(u.src[1])
  if a is None or b is None: return None
  if isinstance(a, int) and not isinstance(b, int):
    if u.arg is BinaryOps.IDIV: return None
    a, b = b, a
  try: return _SYM_OPS[u.arg](a, b)
  except (ShapeError, ZeroDivisionError): return None

_SYM_OPS = {BinaryOps.ADD: lambda a, b: a + b, BinaryOps.MUL: lambda a, b: a * b, BinaryOps.IDIV: lambda a, b: a // b}

__all__ = ["UOps", "UOp", "Mark", "ReduceBlock", "loop_mark", "flops_mem", "UnaryOps"]
