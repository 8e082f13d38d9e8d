"""The kernel AST: the op enums, `LazyOp` (immutable, structurally equal, walked without recursion), the buffer and
arg records (`MemBuffer`, `ConstBuffer`, `KernelInfo`, `WMMAArg`), and how an AST prints (`format_tree`,
`print_tree`). Imports dtype, errors, shape/."""
from __future__ import annotations
import functools
import numbers
import reprlib
import sys
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable, Optional, TextIO, Union
from kernopt.dtype import ConstType, DType, dtypes, storage_dtype_error
from kernopt.errors import VerifyError
from kernopt.shape import symbolic
from kernopt.shape.shapetracker import ShapeTracker

class UnaryOps(Enum):
  EXP2 = auto(); LOG2 = auto(); CAST = auto(); BITCAST = auto() # noqa: E702
  SIN = auto(); SQRT = auto(); RECIP = auto(); NEG = auto() # noqa: E702
class BinaryOps(Enum):
  ADD = auto(); MUL = auto(); IDIV = auto(); MAX = auto(); MOD = auto(); CMPLT = auto(); CMPNE = auto() # noqa: E702
  XOR = auto(); SHL = auto(); SHR = auto(); AND = auto(); OR = auto() # noqa: E702
class TernaryOps(Enum):
  WHERE = auto(); MULACC = auto() # noqa: E702
class ReduceOps(Enum):
  SUM = auto(); MAX = auto(); WMMA = auto() # noqa: E702
class BufferOps(Enum):
  LOAD = auto(); CONST = auto(); STORE = auto() # noqa: E702
class MetaOps(Enum):
  KERNEL = auto()

for _e in (UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps):
  _e.__hash__ = object.__hash__  # type: ignore[method-assign]  # members are singletons: hash by identity
del _e
Op = Union[UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps]
_OP_TYPES = frozenset((UnaryOps, BinaryOps, TernaryOps, ReduceOps, BufferOps, MetaOps))
ALUOp = Union[UnaryOps, BinaryOps, TernaryOps]

# ops whose value at 0 is not 0: a reduce over padded (zero-filled) elements is wrong through them. BITCAST too: a
# padded float's NEG is -0.0, whose bits are not 0 (the AST fuzzer: SUM(BITCAST(int32, NEG(x))) with PADTO)
UNSAFE_PAD_OPS = frozenset({UnaryOps.RECIP, UnaryOps.LOG2, UnaryOps.EXP2, BinaryOps.IDIV, BinaryOps.CMPNE,
                            UnaryOps.BITCAST})

def pad_unsafe(op: LazyOp) -> bool:
  """Whether op maps padded zeros to a nonzero: an UNSAFE_PAD_OPS op, or the NEG of a bool, which is logical not
  (False -> True; the AST fuzzer, seed 46000: SUM(CAST(NEG(False))) over 9 elements PADTO'd to 32 gave 32)."""
  return op.op in UNSAFE_PAD_OPS or (op.op is UnaryOps.NEG and op.dtype == dtypes.bool)

def _brief(x: Any) -> str: return f"{type(x).__name__} {reprlib.repr(x)}"

def _check_buffer(what: str, dtype: Any, st: Any) -> None:
  if (why := storage_dtype_error(dtype)) is not None: raise VerifyError(f"{what} dtype: {why}")
  if not isinstance(st, ShapeTracker): raise VerifyError(f"{what} st must be a ShapeTracker, got {_brief(st)}")

@dataclass(frozen=True)
class MemBuffer:
  """Buffer `idx` of the kernel's arguments (-1: a workgroup-local buffer), viewed through `st`."""
  idx: int
  dtype: DType
  st: ShapeTracker

  def __post_init__(self) -> None:
    idx = self.idx
    if type(idx) is not int:
      if isinstance(idx, bool) or not isinstance(idx, numbers.Integral):
        raise VerifyError(f"MemBuffer idx must be an int >= -1, got {_brief(idx)}")
      object.__setattr__(self, "idx", idx := int(idx))
    if not -1 <= idx < 1 << 31: raise VerifyError(f"MemBuffer idx must be an int in [-1, 2**31), got {idx}")
    _check_buffer(f"MemBuffer {idx}", self.dtype, self.st)

@dataclass(frozen=True)
class ConstBuffer:
  """A constant broadcast to the shape of `st`."""
  val: ConstType
  dtype: DType
  st: ShapeTracker

  def __post_init__(self) -> None:
    _check_buffer("ConstBuffer", self.dtype, self.st)
    val = self.val
    if type(val) not in (int, float, bool) and not isinstance(val, symbolic.Node):
      if isinstance(val, numbers.Integral) and not isinstance(val, bool): val = int(val)
      elif isinstance(val, numbers.Real): val = float(val)
      elif type(val).__name__ == "bool_": val = bool(val)   # numpy's bool
      else: raise VerifyError(f"ConstBuffer val must be a bool, int, float or symbolic node, got {_brief(val)}")
      object.__setattr__(self, "val", val)
    if type(val) is int and dtypes.is_float(self.dtype) and not -_FLOAT_MAX <= val <= _FLOAT_MAX:
      raise VerifyError(f"ConstBuffer val {reprlib.repr(val)} is too large for any float ({self.dtype})")

_FLOAT_MAX = int(sys.float_info.max)

@dataclass(frozen=True)
class KernelInfo:
  """What the Kernel decided, attached to the optimized AST's KERNEL op for the lowerer."""
  local_dims: int = 0
  upcasted: int = 0
  dont_use_locals: bool = False

@dataclass(frozen=True)
class WMMAArg:
  """The tensor-core instruction of a WMMA op: `upcast_axes` are the (A, B, C) axes whose lanes form each
  thread's fragment, `reduce_axes` the axes the instruction consumes."""
  name: str
  dims: tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  thread_local_sizes: tuple[int, int, int]
  device: str
  upcast_axes: tuple[int, int, int]
  reduce_axes: tuple[int, ...]

@dataclass(frozen=True, eq=False)
class LazyOp:
  """One node of a kernel's AST. Immutable; hashing is cached and equality is structural."""
  op: Op
  src: tuple[LazyOp, ...] = ()
  arg: Any = None

  def __post_init__(self) -> None:
    if type(self.op) not in _OP_TYPES:
      raise VerifyError(f"LazyOp op must be a member of an op enum (e.g. BinaryOps.ADD), got {_brief(self.op)}")
    if type(self.src) is not tuple:
      raise VerifyError(f"{self.op} src must be a tuple of LazyOps, got {type(self.src).__name__}")
    for x in self.src:
      if not isinstance(x, LazyOp): raise VerifyError(f"{self.op} has a source that is not a LazyOp: {_brief(x)}")
      if x.op is MetaOps.KERNEL or (x.op is BufferOps.STORE and self.op is not BufferOps.LOAD and
                                    self.op is not MetaOps.KERNEL):
        raise VerifyError(f"{x.op} can't be a source of {self.op} (only a KERNEL, or the LOAD of a local buffer, takes "
                          "a STORE; nothing takes a KERNEL)")
    try: self._hash
    except TypeError:
      raise VerifyError(f"{self.op} arg must be hashable (a tuple, not a list), got {_brief(self.arg)}") from None

  @functools.cached_property
  def _hash(self) -> int: return hash((self.op, self.src, self.arg))
  def __hash__(self) -> int: return self._hash
  def __eq__(self, other: object) -> bool:
    if self is other: return True
    if not isinstance(other, LazyOp) or self._hash != other._hash: return False
    return _same_tree(self, other)

  @functools.cached_property
  def dtype(self) -> Optional[DType]:
    """The dtype this op produces (None for STORE and KERNEL): its own for buffer ops, casts, comparisons and WMMA,
    else its value source's (WHERE's src[1], otherwise the last source)."""
    # walk down the chain of ops that take a source's dtype (no recursion: the chain may be 10,000 ops long), then
    # cache the dtype found on every op passed
    chain: list[LazyOp] = []
    x = self
    while (dt := x.__dict__.get("dtype", _UNSET)) is _UNSET and (s := _dtype_source(x)) is not None:
      chain.append(x)
      x = s
    if dt is _UNSET: dt = _own_dtype(x)
    for y in chain: y.__dict__["dtype"] = dt
    return dt

  @functools.cached_property
  def lazyops(self) -> list[LazyOp]:
    """Every op of the tree, each once, children before parents: a depth-first walk, sources in order, each op
    placed after the last of its sources (an explicit stack: a 10,000-deep tree needs no Python recursion)."""
    return walk_ops(self)

  def vars(self) -> list[Any]:
    """The symbolic Variables in the shapes of this tree's buffers and in its symbolic CONSTs, sorted by name."""
    return list(self._vars)

  @functools.cached_property
  def _vars(self) -> tuple[Any, ...]:
    found = {v for x in self.lazyops if x.op in BufferOps for v in x.arg.st.vars()}
    found |= {v for x in self.lazyops if x.op is BufferOps.CONST and isinstance(x.arg.val, symbolic.Node)
              for v in x.arg.val.vars()}
    return tuple(sorted(found, key=lambda v: v.expr))

  def __repr__(self) -> str:
    """`LazyOp(op, src=(...), arg=...)`, sources nested. An op that is a source more than once is spelled once, at
    its first place, as `#k=LazyOp(...)`, and as `#k` at the others (so the text grows with the number of ops, not
    of paths). Written from an explicit stack of pending text, without recursion."""
    uses: dict[LazyOp, int] = {}
    for op in self.lazyops:
      for s in op.src: uses[s] = uses.get(s, 0) + 1
    labels: dict[LazyOp, str] = {}
    out: list[str] = []
    stack: list[Union[LazyOp, str]] = [self]
    while stack:
      x = stack.pop()
      if isinstance(x, str):
        out.append(x)
        continue
      if (label := labels.get(x)) is not None:
        out.append(label)
        continue
      if uses.get(x, 0) > 1:
        labels[x] = label = f"#{len(labels) + 1}"
        out.append(f"{label}=")
      out.append(f"LazyOp({x.op}, src=(")
      stack.append(f"{',' if len(x.src) == 1 else ''}), arg={x.arg!r})")
      for i in range(len(x.src) - 1, -1, -1):
        stack.append(x.src[i])
        if i: stack.append(", ")
    return "".join(out)

_UNSET: Any = object()

def walk_ops(root: LazyOp, accept: Optional[Callable[[LazyOp], bool]] = None) -> list[LazyOp]:
  """root and the ops under it that `accept` (all, without it), reached through accepted ops only, each once,
  children before parents (sources in order). An explicit stack, so that a pass can visit a 10,000-deep tree
  bottom-up without recursion."""
  order: list[LazyOp] = []
  seen = {root}
  stack: list[tuple[LazyOp, int]] = [(root, 0)]
  while stack:
    op, i = stack[-1]
    if i < len(op.src):
      stack[-1] = (op, i + 1)
      if (s := op.src[i]) not in seen and (accept is None or accept(s)):
        seen.add(s)
        stack.append((s, 0))
    else:
      stack.pop()
      order.append(op)
  return order

_OWN_DTYPE = frozenset((*BufferOps, UnaryOps.CAST, UnaryOps.BITCAST, BinaryOps.CMPLT, BinaryOps.CMPNE, MetaOps.KERNEL,
                        ReduceOps.WMMA))

def _dtype_source(op: LazyOp) -> Optional[LazyOp]:
  """The source whose dtype op produces, or None where op's dtype is its own."""
  o = op.op
  if o in _OWN_DTYPE or not op.src: return None
  return op.src[1] if o is TernaryOps.WHERE and len(op.src) > 1 else op.src[-1]

def _own_dtype(op: LazyOp) -> Optional[DType]:
  o = op.op
  if o is BufferOps.LOAD or o is BufferOps.CONST: return op.arg.dtype
  if o is UnaryOps.CAST or o is UnaryOps.BITCAST: return op.arg
  if o is ReduceOps.WMMA: return op.arg.dtype_out
  if o is BinaryOps.CMPLT or o is BinaryOps.CMPNE: return dtypes.bool
  return None

def _same_tree(a: LazyOp, b: LazyOp) -> bool:
  """a and b are equal trees: the same op, arg and (equal) sources at every node; each pair compared once."""
  stack, seen = [(a, b)], set()
  while stack:
    x, y = stack.pop()
    if x is y: continue
    if x._hash != y._hash or x.op is not y.op or len(x.src) != len(y.src) or not x.arg == y.arg: return False
    if (key := (id(x), id(y))) in seen: continue
    seen.add(key)
    stack.extend(zip(x.src, y.src))
  return True


# ***** printing *****

def shape_str(shape: tuple[Any, ...]) -> str:
  """A shape as Python writes a tuple: `(3,)`, `(4, n)`."""
  return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"

def _arg_str(op: LazyOp) -> str:
  a = op.arg
  if isinstance(a, MemBuffer):
    return f"buf{a.idx} {a.dtype} {shape_str(a.st.shape)}" + ("" if a.st.contiguous else f" {a.st.views}")
  if isinstance(a, ConstBuffer): return f"const {a.val!r} {a.dtype} {shape_str(a.st.shape)}"
  return "" if a is None else repr(a)

_MAX_INDENT = 64

def _indent(depth: int) -> str:
  return "  " * depth if depth <= _MAX_INDENT else "  " * _MAX_INDENT + f"[depth {depth}] "

def format_tree(ast: LazyOp) -> str:
  """One line per op, indented by depth: `#id op arg`; a shared sub-tree is printed once and then named by its #id.
  Past 64 levels the indent stops growing and the line starts with `[depth d]`."""
  ids: dict[LazyOp, int] = {}
  lines: list[str] = []
  stack: list[tuple[LazyOp, int]] = [(ast, 0)]
  while stack:
    op, depth = stack.pop()
    if op in ids:
      lines.append(f"{_indent(depth)}#{ids[op]} (shared)")
      continue
    ids[op] = len(ids)
    lines.append(f"{_indent(depth)}#{ids[op]} {str(op.op).split('.')[-1]} {_arg_str(op)}".rstrip())
    stack.extend((x, depth + 1) for x in reversed(op.src))
  return "\n".join(lines)

def print_tree(ast: LazyOp, file: Optional[TextIO] = None) -> None:
  """Print format_tree(ast) to `file` (default stdout)."""
  print(format_tree(ast), file=sys.stdout if file is None else file)
