"""Renderer capabilities, tensor-core descriptions, the `Program` a kernel compiles to, and the registry of
dialects. A dialect is a Renderer subclass: its Capabilities record plus `render(name, uops) -> str`.
Imports dtype, errors, helpers and shape/."""
from __future__ import annotations
import importlib
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Callable, Optional
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError, VerifyError
from kernopt.helpers import prod
if TYPE_CHECKING: from kernopt.shape.symbolic import sint

# a permutation's (group, index) pairs name an axis of the warp dims (group 0) or of the expanded fragment (group 1)
Perm = tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]

@dataclass(frozen=True)
class TCLayout:
  """Where one vendor's WMMA wants its operands once the tensor core's `opts` shaped the loop nest: `warp` the sizes
  of the local axes the warp's threads span (from the first local axis), `tcd` those of the upcast axes a thread's
  fragment spans (from the first upcasted axis), `tcd_expand` the fragment split into the factors the permutations
  move; `upcast` the offsets (from the first upcasted axis) of the axes holding A's, B's and C's fragments, `reduce`
  those the instruction reduces; `perm_a` and `perm_b` (None: as laid out) the warp and fragment permutations that put
  A's and B's elements into the vendor's registers."""
  upcast: tuple[int, int, int]
  reduce: tuple[int, ...]
  warp: tuple[int, ...]
  tcd: tuple[int, ...]
  tcd_expand: tuple[int, ...]
  perm_a: Perm
  perm_b: Optional[Perm]

# one step of a tensor core's Opt sequence: (OptOps name, dim, amount); dim 0, 1, 2 is the N, M, K axis, None for
# MERGE, which joins the last two upcasted axes
TCOpt = tuple[str, Optional[int], Optional[int]]

@dataclass(frozen=True)
class TensorCore:
  """A warp-wide matrix multiply-accumulate D(N, M) = A·B + C over K: `dims` is (N, M, K); `threads` lists the
  (dim, amount) splits of N (0) and M (1) across the warp's threads; `thread_local_sizes` the per-thread
  fragment sizes of A, B and C; `opts` the Opts, in order, that shape N, M and K into the warp's threads and each
  thread's fragment, and `layout` where the instruction then finds its operands (the dialect's vendor knowledge)."""
  dims: tuple[int, int, int]
  dtype_in: DType
  dtype_out: DType
  threads: tuple[tuple[int, int], ...]
  thread_local_sizes: tuple[tuple[int, ...], ...]
  opts: tuple[TCOpt, ...] = ()
  layout: Optional[TCLayout] = None

  def __str__(self) -> str: return f"WMMA_{'_'.join(map(str, self.dims))}_{self.dtype_in.name}_{self.dtype_out.name}"
  @property
  def num_threads(self) -> int: return prod(amt for _, amt in self.threads)

def _cap(default: Any, doc: str) -> Any:
  """A Capabilities field: its one default and its one-line documentation (the field's metadata["doc"])."""
  return field(default=default, metadata={"doc": doc})

@dataclass(frozen=True)
class Capabilities:
  """Everything a target can do that changes the code kernopt makes for it, as data: a dialect's profile is this record
  filled in (the defaults are the spec's static profile of a GPU-like dialect). The Kernel, its heuristics, the
  lowerer and the renderer read it as `renderer.caps.<field>`; a profile changes by replacing its record
  (`dataclasses.replace`)."""
  device: str = _cap("", "the device name the dialect's Programs run on")
  has_local: bool = _cap(True, "work-items run in workgroups with local ids (LOCAL and GROUP Opts); False: loops only")
  has_shared: bool = _cap(True, "a workgroup shares memory: GROUP reduces combine through a local buffer")
  supports_float4: bool = _cap(True, "the lowerer emits unit-stride float/half loads and stores as float4 vectors")
  global_max: Optional[tuple[int, ...]] = _cap((0x8FFFFFFF,) * 3, "most workgroups per grid dimension (None: no grid)")
  local_max: Optional[tuple[int, ...]] = _cap((0x8FFFFFFF,) * 3, "most work-items per workgroup dimension")
  shared_max: int = _cap(32768, "bytes of local (shared) memory one workgroup may use")
  max_upcast: int = _cap(8, "the heuristics upcast (and UPCAST Opts multiply) the upcast axes at most this much")
  max_unroll: int = _cap(32, "the heuristics unroll a reduce at most this much (the spec's limit)")
  max_local_size: int = _cap(0x8FFFFFFF, "most work-items in one workgroup: the product of its local sizes")
  tensor_cores: tuple[TensorCore, ...] = _cap((), "the warp-wide matrix multiply-accumulates TC Opts may use")
  supports_images: bool = _cap(False, "image buffers (ImageDType) can be read and written")
  fused_accumulate: bool = _cap(False, "float32 multiply-adds fuse (one rounding): SUMs of products as MULACC, "
                                       "the native exp2's polynomial")
  heuristics: str = _cap("spec", "the heuristics profile (kernopt.heuristics_registry) tried before the spec's rules")
  vector_width: int = _cap(1, "fp32 lanes of the target's vectors the heuristics tile for and lanes are packed into")
  has_fp16: bool = _cap(False, "half arithmetic (OpenCL cl_khr_fp16); without it half is a storage type")
  clang: bool = _cap(False, "the device compiles with clang (PoCL): vector accesses are element-aligned dereferences")
  stream_stores: bool = _cap(False, "big loop-free kernels store with non-temporal stores, fenced before they end")
  stream_min: int = _cap(1 << 22, "float32 elements a loop-free kernel stores before stream_stores applies to it")
  arch: str = _cap("", "the GPU architecture the source is compiled for (CUDA: \"sm_80\")")
  sm_count: Optional[int] = _cap(None, "the GPU's multiprocessors, scaling its grid-size threshold (None: unknown)")
  march: str = _cap("", "the CPU ISA the C compiler targets (-march; \"native\": the host's)")
  isa_vector_width: int = _cap(0, "fp32 lanes of one vector register of that ISA (0: not a CPU target)")
  threads: int = _cap(1, "threads a CPU kernel's outermost parallel loop is split across")
  parallel: str = _cap("none", "how a CPU kernel runs on threads: \"pthread\", \"openmp\" or \"none\"")
  schedule: str = _cap("static", "the OpenMP schedule of a parallel loop")
  min_parallel_work: int = _cap(0, "ALU ops + bytes moved below which a kernel runs on one thread")
  interchange: bool = _cap(False, "a reduce loop may move outside the loops after it (matmul's K outside N)")
  pin_loads: Optional[str] = _cap(None, "inline-asm register class vector loads are pinned to (None: unpinned)")
  masked_loads: bool = _cap(False, "a contiguous gated load becomes one masked vector load, not a gather of lanes")
  masked_stores: bool = _cap(False, "a store gated lane by lane (PADTO'd columns) is one masked vector store")
  split_borders: bool = _cap(False, "a padded window's tile loop runs a plain-load interior copy (passes/borders.py)")
  deinterleave: bool = _cap(False, "a gather of lanes 2 elements apart is two vector loads and a shuffle "
                                   "(passes/deinterleave.py)")
  reduce_block: int = _cap(0, "reduce steps per block when a matmul-like reduce is split (0: never split)")
  panel_elements: int = _cap(0, "most elements of a packed B panel (0: no packing)")
  sign_bit_negate: bool = _cap(False, "NEG of a float32 MULACC flips the sign bit (passes/sign_bit_negate.py: gcc 12)")
  emulate: Optional[str] = _cap(None, "the dialect whose tensor-core layouts the PYTHON emulator runs (None: none)")

# the fields every dialect's capabilities() reports (a dialect adds its own `key_caps`)
KEY_CAPS = ("device", "has_local", "has_shared", "supports_float4", "global_max", "local_max", "shared_max",
            "max_upcast", "max_unroll", "max_local_size", "supports_images", "fused_accumulate")

_FIELDS = frozenset(f.name for f in fields(Capabilities))

class Renderer:
  """A dialect: `caps`, what the target can do (its Capabilities record, the only place a capability is declared), and
  how to spell a UOp list (`render`). A dialect's class declares its static profile's record; a constructor that
  takes the target's facts fills in its own."""
  caps: Capabilities = Capabilities()
  suffix: str = ""
  # the record fields, after KEY_CAPS, that this dialect's capabilities() reports: those its profiles vary
  key_caps: tuple[str, ...] = ()

  def __setattr__(self, name: str, value: Any) -> None:
    if name in _FIELDS:
      raise AttributeError(f"{name} is a capability: change the record, {type(self).__name__}.caps = "
                           f"dataclasses.replace(caps, {name}=...)")
    object.__setattr__(self, name, value)

  def render(self, name: str, uops: list[Any]) -> str:
    raise UnsupportedError(f"the {type(self).__name__} dialect has no source renderer")

  def capabilities(self) -> dict[str, Any]:
    """Everything that can change the code this dialect produces, as plain data (part of cache keys): the dialect,
    the record's KEY_CAPS, its tensor cores by name and the dialect's own key_caps."""
    c = self.caps
    return {"dialect": type(self).__name__, **{k: getattr(c, k) for k in KEY_CAPS},
            "tensor_cores": [str(tc) for tc in c.tensor_cores], **{k: getattr(c, k) for k in self.key_caps}}

  def __repr__(self) -> str: return f"{type(self).__name__}(device={self.caps.device!r})"

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
    if self.global_size is None and self.local_size is None: return None, None   # a loop kernel (the CPU)
    from kernopt.shape.symbolic import sym_infer
    def ev(dims: Optional[tuple[Any, ...]]) -> Optional[tuple[int, ...]]:
      return None if dims is None else tuple(d if type(d) is int else sym_infer(d, var_vals) for d in dims)
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
