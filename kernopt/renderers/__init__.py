"""Renderer capabilities, tensor-core descriptions, the `Program` a kernel compiles to, and the registry of
dialects. A dialect is a Renderer subclass: capabilities as attributes plus `render(name, uops) -> str`.
Imports dtype, helpers, errors, shape/, ops and uops."""
from __future__ import annotations
import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError, VerifyError
from kernopt.helpers import prod
if TYPE_CHECKING: from kernopt.shape.symbolic import sint

@dataclass(frozen=True)
class TensorCore:
  """A warp-wide matrix multiply-accumulate D(N, M) = A·B + C over K: `dims` is (N, M, K); `threads` lists the
  (dim, amount) splits of N (0) and M (1) across the warp's threads; `thread_local_sizes` the per-thread
  fragment sizes of A, B and C."""
  dims: tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  threads: tuple[tuple[int, int], ...]
  thread_local_sizes: tuple[tuple[int, ...], ...]

  def __str__(self) -> str: return f"WMMA_{'_'.join(map(str, self.dims))}_{self.dtype_in.name}_{self.dtype_out.name}"
  @property
  def num_threads(self) -> int: return prod(amt for _, amt in self.threads)

class Renderer:
  """A dialect: what the target can do (the Kernel's heuristics read these) and how to spell a UOp list."""
  device: str = ""
  suffix: str = ""
  has_local: bool = True
  has_shared: bool = True
  supports_float4: bool = True
  global_max: Optional[tuple[int, ...]] = (0x8FFFFFFF,) * 3
  local_max: Optional[tuple[int, ...]] = (0x8FFFFFFF,) * 3
  shared_max: int = 32768
  max_upcast: int = 8          # the spec's "don't upcast more than 8"
  max_unroll: int = 32         # the spec's "don't unroll more than 32"
  max_local_size: int = 0x8FFFFFFF  # product of the local sizes of one workgroup
  tensor_cores: tuple[TensorCore, ...] = ()
  supports_images: bool = False
  # float32 SUM accumulators update as one fused multiply-add (MULACC, one rounding) when the summand is a product;
  # off in the spec's profiles, where every op rounds as written
  fused_accumulate: bool = False

  def render(self, name: str, uops: list[Any]) -> str:
    raise UnsupportedError(f"the {type(self).__name__} dialect has no source renderer")

  def capabilities(self) -> dict[str, Any]:
    """Everything that can change the code this dialect produces, as plain data (part of cache keys)."""
    keys = ("device", "has_local", "has_shared", "supports_float4", "global_max", "local_max", "shared_max",
            "max_upcast", "max_unroll", "max_local_size", "supports_images", "fused_accumulate")
    return {"dialect": type(self).__name__, **{k: getattr(self, k) for k in keys},
            "tensor_cores": [str(tc) for tc in self.tensor_cores]}

  def __repr__(self) -> str: return f"{type(self).__name__}(device={self.device!r})"

@dataclass(frozen=True)
class BufferArg:
  """One MemBuffer index of a Program's AST. The kernel addresses elements [lo, hi) of it, expressions of the
  Program's Variables that the runner checks against the buffer at each launch (an empty range when hi <= lo; hi
  defaults to min_size); min_size is an int, at least hi for every value of the Variables, so a buffer that large
  fits every launch. An unused one (its loads folded away) is still passed to the runner, checked for dtype only, but
  is no parameter of the source."""
  idx: int
  dtype: DType
  min_size: Any
  writable: bool
  used: bool = True
  lo: Any = 0
  hi: Any = None

  def __post_init__(self) -> None:
    if self.hi is None: object.__setattr__(self, "hi", self.min_size)

def var_dtype(v: Any) -> DType:
  """The parameter type of Variable v: int32 when its whole range fits, else int64."""
  return dtypes.int32 if -2**31 <= v.min and v.max < 2**31 else dtypes.int64

@dataclass(frozen=True)
class VarArg:
  """One Variable parameter of a Program, passed (after the used buffers, in `Program.vars` order) as dtype."""
  name: str
  dtype: DType

@dataclass(frozen=True)
class Program:
  """A rendered kernel: plain data, with the signature a runner checks before it launches anything."""
  name: str
  src: str
  device: str
  global_size: Optional[tuple[sint, ...]] = None
  local_size: Optional[tuple[sint, ...]] = None
  uops: Optional[tuple[Any, ...]] = None
  op_estimate: Any = 0
  mem_estimate: Any = 0
  args: tuple[BufferArg, ...] = ()
  vars: tuple[Any, ...] = ()
  extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
  var_args: tuple[VarArg, ...] = ()   # one per vars entry; derived from the Variables' ranges when not given

  def __post_init__(self) -> None:
    if not self.var_args and self.vars:
      object.__setattr__(self, "var_args", tuple(VarArg(v.expr, var_dtype(v)) for v in self.vars))
    if len(self.var_args) != len(self.vars) or any(a.name != v.expr for a, v in zip(self.var_args, self.vars)):
      raise VerifyError(f"{self.name}: var_args {self.var_args} don't match vars {self.vars}")

  @property
  def used_args(self) -> tuple[BufferArg, ...]:
    """The buffers the rendered function takes, in index order: its leading parameters."""
    return tuple(a for a in self.args if a.used)

  def launch_dims(self, var_vals: dict[Any, int]) -> tuple[Optional[tuple[int, ...]], Optional[tuple[int, ...]]]:
    """global and local sizes with symbolic entries evaluated for var_vals."""
    from kernopt.shape.symbolic import sym_infer
    def ev(dims: Optional[tuple[Any, ...]]) -> Optional[tuple[int, ...]]:
      return None if dims is None else tuple(sym_infer(d, var_vals) for d in dims)
    return ev(self.global_size), ev(self.local_size)

# dialect name -> "module:Class"; modules are imported on first use
_DIALECTS: dict[str, str] = {
  "CPU": "kernopt.renderers.cstyle:CRenderer", "C": "kernopt.renderers.cstyle:CRenderer",
  "OPENCL": "kernopt.renderers.opencl:OpenCLRenderer", "CUDA": "kernopt.renderers.cuda:CUDARenderer",
  "METAL": "kernopt.renderers.metal:MetalRenderer", "AMD": "kernopt.renderers.amd:AMDRenderer",
}

def register_dialect(name: str, target: str | Callable[..., Renderer]) -> None:
  """Make `get_renderer(name)` build target: a Renderer factory or a "module:Class" string."""
  _DIALECTS[name.upper()] = target  # type: ignore[assignment]

def dialect_names() -> list[str]: return sorted(_DIALECTS)

def get_renderer(name: str, **kwargs: Any) -> Renderer:
  """A fresh static profile of dialect `name` (e.g. get_renderer("CUDA", arch="sm_90"))."""
  target = _DIALECTS.get(name.upper())
  if target is None: raise UnsupportedError(f"unknown dialect {name!r}; known: {dialect_names()}")
  if callable(target): return target(**kwargs)
  module, cls = target.split(":")
  return getattr(importlib.import_module(module), cls)(**kwargs)
