"""The PYTHON device: kernopt's executable spec. It interprets a Program's linearized UOp list with GPU semantics,
every thread of the launch at once as numpy arrays over a thread axis, and can emulate the CUDA, Metal and AMD
dialects (their capabilities and their tensor-core fragment layouts). It detects out-of-bounds accesses and local
memory read without a BARRIER after another thread's write. Imports runtime/, renderers/, uops, ops and dtype."""
from __future__ import annotations
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional
import numpy as np
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import CompileError, KernoptError, UnsupportedError
from kernopt.helpers import prod
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps
from kernopt.renderers import BufferArg, Program, Renderer, VarArg, get_renderer
from kernopt.runtime import Compiled, np_dtype
from kernopt.uops import UOp, UOps, flops_mem

class EmulationError(KernoptError):
  """A kernel did something that is undefined on the hardware it targets (caught by the PYTHON device)."""

class OutOfBoundsError(EmulationError, IndexError):
  """An active thread loaded or stored outside a buffer."""

class RaceError(EmulationError):
  """A thread read local memory that another thread wrote with no BARRIER in between."""

# ***** values: numpy arrays of shape () (uniform) or (T,), with a trailing lane axis for vectors *****

def reg_dtype(dt: DType) -> np.dtype:
  """The numpy type that holds values of dt in the interpreter (bfloat16 as float32 values rounded to bfloat16)."""
  dt = dt.scalar()
  return np.dtype(np.float32) if dt == dtypes.bfloat16 else np_dtype(dt)

def round_bf16(x: Any) -> np.ndarray:
  """float values rounded to bfloat16 (to float32 first, then nearest even), as ops.truncate_float does."""
  f = np.asarray(x, dtype=np.float32)
  bits = f.view(np.uint32)
  r = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32)
  return np.where(np.isnan(f), f, r)

def bf16_bits(x: Any) -> np.ndarray: return (round_bf16(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
def bf16_from_bits(b: Any) -> np.ndarray: return (np.asarray(b).astype(np.uint32) << np.uint32(16)).view(np.float32)

def to_reg(x: Any, dt: DType) -> np.ndarray:
  """x converted to dt's register type, rounding as a cast to dt does."""
  if dt.scalar() == dtypes.bfloat16: return round_bf16(np.asarray(x).astype(np.float32))
  if dt.scalar() == dtypes.bool: return np.asarray(x) != 0
  return np.asarray(x).astype(reg_dtype(dt))

def to_storage(x: Any, dt: DType) -> np.ndarray:
  return bf16_bits(x) if dt.scalar() == dtypes.bfloat16 else np.asarray(x).astype(np_dtype(dt))

def from_storage(x: Any, dt: DType) -> np.ndarray:
  return bf16_from_bits(x) if dt.scalar() == dtypes.bfloat16 else np.asarray(x)

# ***** ALU: numpy vectorisation of ops.PYTHON_ALU (tests check parity with exec_alu) *****

def _idiv_int(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  zero = b == 0
  bs = np.where(zero, 1, b).astype(b.dtype)
  q = a // bs
  q = q + ((q * bs != a) & ((a < 0) != (bs < 0))).astype(q.dtype)  # floor -> truncation toward zero
  return np.where(zero, 0, q).astype(a.dtype)

def _mod_int(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  return np.where(b == 0, 0, a - b * _idiv_int(a, b)).astype(a.dtype)

def _shift_count(b: np.ndarray, a: np.ndarray) -> np.ndarray:
  return np.mod(b, 8 * a.dtype.itemsize).astype(a.dtype)

_F64_OPS: dict[Any, Callable[..., Any]] = {  # float ops computed in float64 then rounded once, as exec_alu does
  UnaryOps.EXP2: np.exp2, UnaryOps.LOG2: np.log2, UnaryOps.SIN: np.sin, TernaryOps.MULACC: lambda a, b, c: a * b + c}

_FLOAT_OPS: dict[Any, Callable[..., Any]] = {  # correctly rounded in the operand type (double rounding is innocuous)
  BinaryOps.ADD: np.add, BinaryOps.MUL: np.multiply, BinaryOps.IDIV: np.true_divide, UnaryOps.SQRT: np.sqrt,
  UnaryOps.NEG: np.negative, UnaryOps.RECIP: lambda x: np.asarray(1, x.dtype) / x,
  BinaryOps.MOD: lambda a, b: np.where(b == 0, 0, np.fmod(a, b))}

_INT_OPS: dict[Any, Callable[..., Any]] = {
  BinaryOps.ADD: np.add, BinaryOps.MUL: np.multiply, BinaryOps.IDIV: _idiv_int, BinaryOps.MOD: _mod_int,
  BinaryOps.XOR: np.bitwise_xor, BinaryOps.AND: np.bitwise_and, BinaryOps.OR: np.bitwise_or,
  BinaryOps.SHL: lambda a, b: np.left_shift(a, _shift_count(b, a)),
  BinaryOps.SHR: lambda a, b: np.right_shift(a, _shift_count(b, a)),
  UnaryOps.NEG: lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.negative(x),
  UnaryOps.RECIP: lambda x: _idiv_int(np.ones_like(x), x), TernaryOps.MULACC: lambda a, b, c: a * b + c}

def alu(op: Any, dtype: DType, operands: tuple[Any, ...]) -> np.ndarray:
  """op applied elementwise to numpy operands holding values of their dtypes' register types, giving dtype's
  register type: the vectorised ops.exec_alu (IDIV/MOD truncate, zero divisors give 0, integers wrap,
  MAX is a > b ? a : b, shift counts are taken modulo the width)."""
  with np.errstate(all="ignore"): return _alu(op, dtype, operands)

def _alu(op: Any, dtype: DType, operands: tuple[Any, ...]) -> np.ndarray:
  xs = [np.asarray(x) for x in operands]
  if op is BinaryOps.CMPLT: return np.less(xs[0], xs[1])
  if op is BinaryOps.CMPNE: return np.not_equal(xs[0], xs[1])
  if op is TernaryOps.WHERE: return np.where(xs[0], xs[1], xs[2]).astype(reg_dtype(dtype))
  if op is BinaryOps.MAX: return np.where(xs[0] > xs[1], xs[0], xs[1]).astype(reg_dtype(dtype))
  if dtypes.is_float(dtype):
    if op in _F64_OPS: ret = _F64_OPS[op](*(x.astype(np.float64) for x in xs))
    elif op in _FLOAT_OPS: ret = _FLOAT_OPS[op](*xs)
    else: raise UnsupportedError(f"ALU op {op} is not defined on {dtype}")
    return to_reg(ret, dtype)
  if op in _INT_OPS and (dtype != dtypes.bool or op in (BinaryOps.ADD, BinaryOps.MUL, UnaryOps.NEG, BinaryOps.XOR,
                                                         BinaryOps.AND, BinaryOps.OR)):
    if dtype == dtypes.bool and op is BinaryOps.ADD: return np.logical_or(*xs)
    if dtype == dtypes.bool and op is BinaryOps.MUL: return np.logical_and(*xs)
    return np.asarray(_INT_OPS[op](*xs)).astype(reg_dtype(dtype))
  if op in (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT):
    return to_reg(_F64_OPS.get(op, np.sqrt)(xs[0].astype(np.float64)), dtype)
  raise UnsupportedError(f"ALU op {op} is not defined on {dtype}")

# ***** tensor cores: per-vendor fragment layouts, (lane, element) -> (row, col) of the warp's matrix *****
# D(M x N) = A(M x K) @ B(K x N) + C(M x N); a TensorCore's dims are (N, M, K).

def cuda_a_elem(lane: int, i: int) -> tuple[int, int]:
  """mma.m16n8k16 A (16x16, row major), 8 halves a0..a7 per thread (PTX ISA, mma.m16n8k16 fragment figures)."""
  group, tig = lane >> 2, lane % 4
  return group + 8 * ((i >> 1) & 1), tig * 2 + (i & 1) + 8 * (i >> 2)

def cuda_b_elem(lane: int, i: int) -> tuple[int, int]:
  """mma.m16n8k16 B (16x8, column major), 4 halves b0..b3 per thread."""
  group, tig = lane >> 2, lane % 4
  return tig * 2 + (i & 1) + 8 * (i >> 1), group

def cuda_c_elem(lane: int, i: int) -> tuple[int, int]:
  """mma.m16n8k16 C and D (16x8), 4 floats c0..c3 per thread."""
  group, tig = lane >> 2, lane % 4
  return group + 8 * (i >> 1), tig * 2 + (i & 1)

def metal_elem(lane: int, i: int) -> tuple[int, int]:
  """simdgroup_matrix 8x8, 2 elements per thread, the same for A, B, C and D. Apple publishes no per-thread layout:
  this is the one the spec's Metal tensor-core permutations (and tinygrad's emulator) assume, rows in quads of
  lanes (lane//2)%4 + 4*(lane//16), column pairs 2*(lane%2) + 4*((lane//8)%2)."""
  return (lane // 2) % 4 + 4 * (lane // 16), i + 2 * (lane % 2) + 4 * ((lane // 8) % 2)

def amd_a_elem(lane: int, i: int) -> tuple[int, int]:
  """v_wmma_f32_16x16x16_f16 (wave32) A: lane l holds row l%16, all 16 K values; lanes 16-31 replicate 0-15."""
  return lane % 16, i

def amd_b_elem(lane: int, i: int) -> tuple[int, int]:
  """v_wmma (wave32) B: lane l holds column l%16, all 16 K values; lanes 16-31 replicate 0-15."""
  return i, lane % 16

def amd_c_elem(lane: int, i: int) -> tuple[int, int]:
  """v_wmma_f32_16x16x16 (wave32) C and D: 8 floats per lane, element j of lane l at row 2j + l//16, column l%16."""
  return 2 * i + lane // 16, lane % 16

@dataclass(frozen=True)
class WMMALayout:
  """A vendor's warp-wide multiply: matrix sizes (M, N, K), fragment sizes and element maps of A, B and C/D."""
  mnk: tuple[int, int, int]
  sizes: tuple[int, int, int]
  a: Callable[[int, int], tuple[int, int]]
  b: Callable[[int, int], tuple[int, int]]
  c: Callable[[int, int], tuple[int, int]]
  replicated: bool = False   # AMD wave32: lanes 16-31 must hold the same A and B as lanes 0-15
  warp: int = 32

  def index(self, which: int) -> tuple[np.ndarray, np.ndarray]:
    """Row and column of every (lane, element) of operand `which` (0: A, 1: B, 2: C/D), lane-major."""
    fn, n = (self.a, self.b, self.c)[which], self.sizes[which]
    rc = np.array([fn(lane, i) for lane in range(self.warp) for i in range(n)], dtype=np.int64)
    return rc[:, 0], rc[:, 1]

WMMA_LAYOUTS: dict[str, WMMALayout] = {
  "CUDA": WMMALayout((16, 8, 16), (8, 4, 4), cuda_a_elem, cuda_b_elem, cuda_c_elem),
  "METAL": WMMALayout((8, 8, 8), (2, 2, 2), metal_elem, metal_elem, metal_elem),
  "AMD": WMMALayout((16, 16, 16), (16, 16, 8), amd_a_elem, amd_b_elem, amd_c_elem, replicated=True),
}

def _round_in(x: np.ndarray, dt: DType) -> np.ndarray:
  if dt.scalar() == dtypes.bfloat16: return round_bf16(x)
  return np.asarray(x).astype(reg_dtype(dt)).astype(np.float32)

def wmma_warps(device: str, a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype_in: DType, dtype_out: DType,
               dims: Optional[tuple[int, int, int]] = None) -> np.ndarray:
  """D fragments (W, 32, nc) of D = A @ B + C for W warps, given each lane's fragments a (W, 32, na), b, c laid out as
  WMMA_LAYOUTS[device] says; the product is computed in float32 from inputs rounded to dtype_in."""
  lay = WMMA_LAYOUTS.get(device)
  if lay is None: raise UnsupportedError(f"no tensor-core layout for device {device!r}; known: {sorted(WMMA_LAYOUTS)}")
  m, n, k = lay.mnk
  if dims is not None and tuple(dims) != (n, m, k):
    raise UnsupportedError(f"{device} WMMA emulates dims (N, M, K) = {(n, m, k)}, the kernel asks {tuple(dims)}")
  for name, x, sz in (("A", a, lay.sizes[0]), ("B", b, lay.sizes[1]), ("C", c, lay.sizes[2])):
    if x.ndim != 3 or x.shape[1:] != (lay.warp, sz):
      raise EmulationError(f"{device} WMMA wants {name} fragments of {sz} elements on {lay.warp} lanes, got {x.shape}")
  w = a.shape[0]
  if lay.replicated:
    for name, x in (("A", a), ("B", b)):
      if not np.array_equal(x[:, :16], x[:, 16:], equal_nan=True):
        raise EmulationError(f"{device} WMMA: lanes 16-31 must replicate lanes 0-15 of {name}")
  mats = []
  for which, (x, shape) in enumerate(((a, (m, k)), (b, (k, n)), (c, (m, n)))):
    rows, cols = lay.index(which)
    mat = np.zeros((w,) + shape, dtype=np.float32)
    mat[:, rows, cols] = _round_in(x, dtype_in if which < 2 else dtype_out).reshape(w, -1)
    mats.append(mat)
  d = np.matmul(mats[0], mats[1]) + mats[2]
  rows, cols = lay.index(2)
  return to_reg(d[:, rows, cols].reshape(w, lay.warp, lay.sizes[2]), dtype_out)

# ***** the renderer: the emulated dialect's capabilities; the "source" is a dump of the uops *****

_CAPS = ("device", "suffix", "has_local", "has_shared", "supports_float4", "global_max", "local_max", "shared_max",
         "max_upcast", "max_unroll", "max_local_size", "tensor_cores", "supports_images")

class PythonRenderer(Renderer):
  """The capabilities of dialect `emulate` ("CUDA", "METAL", "AMD"; None: OpenCL-like with images, no tensor
  cores, device "PYTHON"). render() returns a textual dump of the uops: the device runs Program.uops."""
  def __init__(self, emulate: Optional[str] = None):
    base = get_renderer(emulate or "OPENCL")
    for k in _CAPS: setattr(self, k, getattr(base, k))
    for k, v in vars(base).items(): setattr(self, k, v)
    self.emulate = emulate.upper() if emulate else None
    if emulate is None:
      self.device, self.tensor_cores, self.has_local, self.supports_images = "PYTHON", (), True, True

  def capabilities(self) -> dict[str, Any]: return {**super().capabilities(), "emulate": self.emulate}

  def render(self, name: str, uops: list[Any]) -> str:
    num = {u: i for i, u in enumerate(uops)}
    lines = [f"// PYTHON ({self.emulate or 'generic'}) kernel {name}"]
    for i, u in enumerate(uops):
      src = ", ".join(str(num.get(s, "?")) for s in u.src)
      lines.append(f"{i:4d} {u.op.name:<13} {u.dtype!r:<24} [{src}] {u.arg!r}")
    return "\n".join(lines)

def make_program(name: str, uops: list[UOp], global_size: Optional[tuple[int, ...]] = None,
                 local_size: Optional[tuple[int, ...]] = None, min_sizes: Optional[dict[int, Any]] = None,
                 emulate: Optional[str] = None) -> Program:
  """A Program for a hand-built linearized uop list: buffer arguments from its DEFINE_GLOBALs (min_sizes[idx]
  elements, default 0), variables from its DEFINE_VARs sorted by name."""
  args = tuple(sorted((BufferArg(u.arg[0], u.dtype, (min_sizes or {}).get(u.arg[0], 0), bool(u.arg[2]))
                       for u in uops if u.op is UOps.DEFINE_GLOBAL), key=lambda a: a.idx))
  dvs = sorted((u for u in uops if u.op is UOps.DEFINE_VAR), key=lambda u: u.arg.expr)
  flops, mem = flops_mem(list(uops))
  return Program(name, PythonRenderer(emulate).render(name, list(uops)), "PYTHON", global_size, local_size,
                 tuple(uops), flops, mem, args, tuple(u.arg for u in dvs),
                 var_args=tuple(VarArg(u.arg.expr, u.dtype) for u in dvs))

# ***** the interpreter *****

@dataclass
class _Global:
  name: str
  dtype: DType
  data: np.ndarray       # flat, storage type; (H, W, 4) for images
  writable: bool

@dataclass
class _Local:
  name: str
  dtype: DType
  data: np.ndarray       # (workgroups, size)
  writer: np.ndarray     # local thread id of the last writer, -1 for none
  epoch: np.ndarray      # barrier count at that write

class _State:
  """One launch: thread geometry, values by uop slot, the active-thread mask stack, loop counters."""
  def __init__(self, name: str, nslots: int, gsz: tuple[int, ...], lsz: tuple[int, ...]):
    self.name, self.gsz, self.lsz = name, gsz, lsz
    self.G, self.L = prod(gsz), prod(lsz)
    self.T = self.G * self.L
    t = np.arange(self.T, dtype=np.int64)
    self.grp, self.lid = t // self.L, t % self.L
    self.vals: list[Any] = [None] * nslots
    self.mask: Optional[np.ndarray] = None
    self.masks: list[Optional[np.ndarray]] = []
    self.loops: dict[int, list[Any]] = {}
    self.epoch = 0
    self.globals: dict[int, _Global] = {}
    self.var_vals: dict[str, int] = {}

  def special(self, name: str, dim: int) -> np.ndarray:
    def coord(lin: np.ndarray, dims: tuple[int, ...]) -> np.ndarray:
      if dim >= len(dims): return np.zeros_like(lin, dtype=np.int32)
      return ((lin // prod(dims[:dim])) % dims[dim]).astype(np.int32)
    if name.startswith("gidx"): return coord(self.grp, self.gsz)
    if name.startswith("lidx"): return coord(self.lid, self.lsz)
    if name.startswith("idx"):
      return (coord(self.grp, self.gsz) * (self.lsz[dim] if dim < len(self.lsz) else 1) + coord(self.lid, self.lsz))
    raise EmulationError(f"{self.name}: unknown SPECIAL {name!r}")

  def thread(self, t: int) -> str: return f"thread {int(t) % self.L} of workgroup {int(t) // self.L}"

  def active(self, valid: Optional[np.ndarray]) -> Optional[np.ndarray]:
    """The threads a memory access really happens for: the IF/loop mask and the access's own guard."""
    if valid is None: return self.mask
    v = np.broadcast_to(valid, (self.T,))
    return v if self.mask is None else self.mask & v

def _per_thread(x: Any, T: int, lanes: int = 1) -> np.ndarray:
  x = np.asarray(x)
  return np.broadcast_to(x, (T,) if lanes == 1 else (T, lanes))

def _sel(mask: np.ndarray, new: Any, old: Any, lanes: int) -> np.ndarray:
  return np.where(mask if lanes == 1 else mask[:, None], new, old)

Step = Callable[[_State], Optional[int]]

class _Builder:
  """Translates a linearized uop list into a list of steps; a step returns the next pc or None for pc + 1."""
  def __init__(self, name: str, uops: tuple[UOp, ...]):
    self.name, self.uops = name, uops
    self.slot = {u: i for i, u in enumerate(uops)}
    if len(self.slot) != len(uops): raise CompileError(f"{name}: a uop appears twice in the linearized list")
    self.ends: dict[int, int] = {}
    stack: list[int] = []
    for i, u in enumerate(uops):
      if u.op in (UOps.RANGE, UOps.IF): stack.append(i)
      elif u.op in (UOps.ENDRANGE, UOps.ENDIF):
        opener = self.slot.get(u.src[0]) if u.src else None
        if not stack or opener != stack[-1]: raise CompileError(f"{name}: {u.op.name} at {i} closes nothing open")
        self.ends[stack.pop()] = i
    if stack: raise CompileError(f"{name}: {uops[stack[-1]].op.name} at {stack[-1]} is never closed")
    for i, u in enumerate(uops):
      for s in u.src:
        if self.slot.get(s, i) >= i and not (u.op is UOps.DEFINE_ACC and s in self.slot):  # ACC names later RANGEs
          raise CompileError(f"{name}: {u.op.name} at {i} uses a {s.op.name} that is not in the list before it")
    self.steps: list[Step] = [self.build(i, u) for i, u in enumerate(uops)]

  def build(self, i: int, u: UOp) -> Step:
    fn = getattr(self, f"_{u.op.name.lower()}", None)
    if fn is None: raise CompileError(f"{self.name}: the PYTHON device can't run {u.op.name}")
    return fn(i, u, [self.slot[s] for s in u.src])

  # -- definitions --
  def _sink(self, i: int, u: UOp, s: list[int]) -> Step: return lambda st: None
  def _barrier(self, i: int, u: UOp, s: list[int]) -> Step:
    def step(st: _State) -> None:
      if st.mask is not None:
        m = st.mask.reshape(st.G, st.L)
        if not (m.all(1) | ~m.any(1)).all():
          g = int(np.flatnonzero(m.any(1) & ~m.all(1))[0])
          raise EmulationError(f"{self.name}: BARRIER reached by only some threads of workgroup {g}")
      st.epoch += 1
    return step

  def _define_global(self, i: int, u: UOp, s: list[int]) -> Step:
    def step(st: _State) -> None: st.vals[i] = st.globals[u.arg[0]]
    return step

  def _define_local(self, i: int, u: UOp, s: list[int]) -> Step:
    name, size = u.arg
    def step(st: _State) -> None:
      st.vals[i] = _Local(name, u.dtype, np.zeros((st.G, size), reg_dtype(u.dtype)),
                          np.full((st.G, size), -1, np.int64), np.zeros((st.G, size), np.int64))
    return step

  def _define_var(self, i: int, u: UOp, s: list[int]) -> Step:
    def step(st: _State) -> None: st.vals[i] = np.dtype(reg_dtype(u.dtype)).type(st.var_vals[u.arg.expr])
    return step

  def _special(self, i: int, u: UOp, s: list[int]) -> Step:
    def step(st: _State) -> None: st.vals[i] = st.special(u.arg[1], u.arg[0])
    return step

  def _const(self, i: int, u: UOp, s: list[int]) -> Step:
    arg = u.arg[0] if u.op is UOps.DEFINE_ACC and isinstance(u.arg, tuple) else u.arg  # (initial value, acc number)
    val = to_reg(np.full(u.dtype.count, arg) if u.dtype.count > 1 else arg, u.dtype)
    def step(st: _State) -> None: st.vals[i] = val
    return step

  def _define_acc(self, i: int, u: UOp, s: list[int]) -> Step: return self._const(i, u, s)

  # -- control --
  def _range(self, i: int, u: UOp, s: list[int]) -> Step:
    end, it = self.ends[i], reg_dtype(u.dtype).type   # int64 where the lowerer widened the indices
    def step(st: _State) -> Optional[int]:
      lo, hi = np.asarray(st.vals[s[0]]), np.asarray(st.vals[s[1]])
      if (lo.ndim == 0 or (lo == lo.flat[0]).all()) and (hi.ndim == 0 or (hi == hi.flat[0]).all()):
        a, b = int(lo.flat[0]), int(hi.flat[0])
        if a >= b: return end + 1
        st.loops[i] = [a, b, None]
        st.vals[i] = it(a)
        return None
      # bounds that differ between threads: run to the longest trip count with a per-thread mask
      lo, hi = _per_thread(lo, st.T), _per_thread(hi, st.T)
      trips = (hi - lo).astype(np.int64)
      live = trips if st.mask is None else np.where(st.mask, trips, 0)
      most = int(live.max()) if live.size else 0
      if most <= 0: return end + 1
      st.loops[i] = [0, most, (lo, trips, st.mask)]
      st.masks.append(st.mask)
      st.mask = trips > 0 if st.mask is None else st.mask & (trips > 0)
      st.vals[i] = lo.astype(it)
      return None
    return step

  def _endrange(self, i: int, u: UOp, s: list[int]) -> Step:
    r, it = s[0], reg_dtype(u.src[0].dtype).type
    def step(st: _State) -> Optional[int]:
      lp = st.loops[r]
      lp[0] += 1
      if lp[2] is None:
        if lp[0] >= lp[1]: return None
        st.vals[r] = it(lp[0])
        return r + 1
      lo, trips, outer = lp[2]
      if lp[0] >= lp[1]:
        st.mask = st.masks.pop()
        return None
      st.vals[r] = (lo + lp[0]).astype(it)
      st.mask = (trips > lp[0]) if outer is None else outer & (trips > lp[0])
      return r + 1
    return step

  def _if(self, i: int, u: UOp, s: list[int]) -> Step:
    end = self.ends[i]
    def step(st: _State) -> Optional[int]:
      cond = _per_thread(st.vals[s[0]], st.T)
      st.masks.append(st.mask)
      st.mask = cond if st.mask is None else st.mask & cond
      if not st.mask.any():
        st.mask = st.masks.pop()
        return end + 1
      return None
    return step

  def _endif(self, i: int, u: UOp, s: list[int]) -> Step:
    def step(st: _State) -> None: st.mask = st.masks.pop()
    return step

  # -- values --
  def _alu(self, i: int, u: UOp, s: list[int]) -> Step:
    op, dt = u.arg, u.dtype
    def step(st: _State) -> None: st.vals[i] = _alu(op, dt, tuple(st.vals[j] for j in s))
    return step

  def _cast(self, i: int, u: UOp, s: list[int]) -> Step:
    def step(st: _State) -> None: st.vals[i] = to_reg(st.vals[s[0]], u.dtype)
    return step

  def _bitcast(self, i: int, u: UOp, s: list[int]) -> Step:
    src_dt, dst_dt = u.src[0].dtype, u.dtype
    if src_dt.itemsize != dst_dt.itemsize:
      raise CompileError(f"{self.name}: BITCAST from {src_dt} to {dst_dt} changes the size")
    def step(st: _State) -> None:
      x = np.ascontiguousarray(to_storage(st.vals[s[0]], src_dt))
      lead = x.shape[:-1] if src_dt.count > 1 else x.shape
      y = x.reshape(lead + (-1,)).view(np_dtype(dst_dt)).reshape(lead + ((dst_dt.count,) if dst_dt.count > 1 else ()))
      st.vals[i] = from_storage(y, dst_dt)
    return step

  def _vectorize(self, i: int, u: UOp, s: list[int]) -> Step:
    def step(st: _State) -> None:
      st.vals[i] = np.stack(np.broadcast_arrays(*(np.asarray(st.vals[j]) for j in s)), axis=-1)
    return step

  def _gep(self, i: int, u: UOp, s: list[int]) -> Step:
    lane = u.arg if isinstance(u.arg, int) else u.arg[0]
    def step(st: _State) -> None: st.vals[i] = np.asarray(st.vals[s[0]])[..., lane]
    return step

  def _phi(self, i: int, u: UOp, s: list[int]) -> Step:
    acc, lanes = s[0], u.src[0].dtype.count
    def step(st: _State) -> None:
      new = st.vals[s[1]]
      if st.mask is not None: new = _sel(st.mask, new, st.vals[acc], lanes)
      st.vals[acc] = st.vals[i] = new
    return step

  def _wmma(self, i: int, u: UOp, s: list[int]) -> Step:
    arg = u.arg
    def step(st: _State) -> None:
      if st.L % 32:
        raise EmulationError(f"{self.name}: WMMA needs workgroups of a multiple of 32 threads, got {st.lsz}")
      frags = [_per_thread(st.vals[j], st.T, u.src[n].dtype.count) for n, j in enumerate(s)]
      frags = [f.reshape(st.T // 32, 32, -1) for f in frags]
      d = wmma_warps(arg.device, *frags, arg.dtype_in, arg.dtype_out, arg.dims)
      st.vals[i] = d.reshape(st.T, -1)
    return step

  # -- memory --
  def _bounds(self, st: _State, buf: Any, idx: np.ndarray, lanes: int, size: int, act: Optional[np.ndarray],
              what: str) -> np.ndarray:
    """idx clipped into the buffer, after checking the active threads' accesses are inside it."""
    live = idx if act is None else idx[act]
    if live.size and (live.min() < 0 or live.max() + lanes > size):
      bad = (idx < 0) | (idx + lanes > size)
      if act is not None: bad &= act
      t = int(np.flatnonzero(bad)[0])
      raise OutOfBoundsError(f"{self.name}: {st.thread(t)} {what} {buf.name}[{int(idx[t])}]"
                             f"{f' (vector of {lanes})' if lanes > 1 else ''} outside its {size} elements")
    return np.clip(idx, 0, max(size - lanes, 0))

  def _load(self, i: int, u: UOp, s: list[int]) -> Step:
    lanes, dt = u.dtype.count, u.dtype
    guarded = len(s) == 4
    is_image = isinstance(u.src[0].dtype, ImageDType)
    is_local = u.src[0].op is UOps.DEFINE_LOCAL
    def step(st: _State) -> None:
      buf = st.vals[s[0]]
      valid = st.vals[s[2]] if guarded else None
      act = st.active(valid)
      if is_image: out = self._image_load(st, buf, st.vals[s[1]], act)
      else:
        idx = _per_thread(st.vals[s[1]], st.T).astype(np.int64)
        size = buf.data.shape[-1]
        idx = self._bounds(st, buf, idx, lanes, size, act, "loads")
        pos = idx if lanes == 1 else idx[:, None] + np.arange(lanes)
        if is_local:
          rows = st.grp if lanes == 1 else st.grp[:, None]
          self._race_check(st, buf, rows, pos, act)
          out = buf.data[rows, pos]
        else: out = from_storage(buf.data[pos], buf.dtype)
      out = to_reg(out, dt)
      if guarded: out = np.where(np.asarray(valid) if lanes == 1 else np.asarray(valid)[..., None], out, st.vals[s[3]])
      st.vals[i] = out
    return step

  def _race_check(self, st: _State, buf: _Local, rows: np.ndarray, pos: np.ndarray, act: Optional[np.ndarray]) -> None:
    w = buf.writer[rows, pos]
    lid = st.lid if pos.ndim == 1 else st.lid[:, None]
    bad = (w >= 0) & (w != lid) & (buf.epoch[rows, pos] == st.epoch)
    if act is not None: bad &= act if pos.ndim == 1 else act[:, None]
    if bad.any():
      t, lane = np.argwhere(bad.reshape(st.T, -1))[0]
      raise RaceError(f"{self.name}: {st.thread(t)} reads local {buf.name}[{int(pos.reshape(st.T, -1)[t, lane])}] "
                      f"written by thread {int(w.reshape(st.T, -1)[t, lane])} with no BARRIER in between")

  def _image_load(self, st: _State, buf: _Global, idx: Any, act: Optional[np.ndarray]) -> np.ndarray:
    """float4 texels at int2 (x, y); coordinates outside the image read (0, 0, 0, 0) (OpenCL's CLK_ADDRESS_CLAMP)."""
    xy = _per_thread(idx, st.T, 2).astype(np.int64)
    h, w = buf.data.shape[:2]
    x, y = xy[:, 0], xy[:, 1]
    inside = (x >= 0) & (x < w) & (y >= 0) & (y < h)
    out = buf.data[np.clip(y, 0, h - 1), np.clip(x, 0, w - 1)].astype(np.float32)
    return np.where(inside[:, None], out, 0)

  def _store(self, i: int, u: UOp, s: list[int]) -> Step:
    vdt = u.src[2].dtype
    lanes = vdt.count
    is_image = isinstance(u.src[0].dtype, ImageDType)
    is_local = u.src[0].op is UOps.DEFINE_LOCAL
    def step(st: _State) -> None:
      buf = st.vals[s[0]]
      act = st.active(st.vals[s[3]] if len(s) == 4 else None)
      if act is not None and not act.any(): return
      if not is_local and not buf.writable:
        raise EmulationError(f"{self.name}: STORE into read-only buffer {buf.name}")
      val = _per_thread(st.vals[s[2]], st.T, lanes)
      if is_image: return self._image_store(st, buf, _per_thread(st.vals[s[1]], st.T, 2), val, act)
      idx = _per_thread(st.vals[s[1]], st.T).astype(np.int64)
      idx = self._bounds(st, buf, idx, lanes, buf.data.shape[-1], act, "stores")
      sel = slice(None) if act is None else act
      pos = idx[sel] if lanes == 1 else idx[sel][:, None] + np.arange(lanes)
      if is_local:
        rows = st.grp[sel] if lanes == 1 else st.grp[sel][:, None]
        buf.data[rows, pos] = to_reg(val[sel], buf.dtype)
        buf.writer[rows, pos] = st.lid[sel] if lanes == 1 else st.lid[sel][:, None]
        buf.epoch[rows, pos] = st.epoch
      else: buf.data[pos] = to_storage(to_reg(val[sel], buf.dtype), buf.dtype)
    return step

  def _image_store(self, st: _State, buf: _Global, xy: np.ndarray, val: np.ndarray, act: Optional[np.ndarray]) -> None:
    h, w = buf.data.shape[:2]
    x, y = xy[:, 0].astype(np.int64), xy[:, 1].astype(np.int64)
    bad = (x < 0) | (x >= w) | (y < 0) | (y >= h)
    if act is not None: bad &= act
    if bad.any():
      t = int(np.flatnonzero(bad)[0])
      raise OutOfBoundsError(f"{self.name}: {st.thread(t)} stores image {buf.name} texel ({int(x[t])}, {int(y[t])}) "
                             f"outside its {w}x{h} texels")
    sel = slice(None) if act is None else act
    buf.data[y[sel], x[sel]] = val[sel].astype(buf.data.dtype)

class PythonProgram:
  """A compiled (translated) Program: run(handles, var_vals, global_size, local_size) executes every thread."""
  def __init__(self, program: Program):
    if program.uops is None: raise CompileError(f"{program.name}: the PYTHON device runs Program.uops, which is None")
    self.program = program
    self.builder = _Builder(program.name, tuple(program.uops))
    self.arg_pos = {a.idx: n for n, a in enumerate(program.used_args)}   # handles are the used args only

  def run(self, handles: list[Any], var_vals: dict[str, int], gsz: tuple[int, ...], lsz: tuple[int, ...]) -> None:
    steps = self.builder.steps
    st = _State(self.program.name, len(steps), gsz, lsz)
    st.var_vals = var_vals
    for u in self.builder.uops:
      if u.op is UOps.DEFINE_GLOBAL:
        idx, name, writable = u.arg
        if idx not in self.arg_pos: raise EmulationError(f"{self.program.name}: buffer {idx} is not an argument")
        h = handles[self.arg_pos[idx]]
        data = h if isinstance(u.dtype, ImageDType) else h.view(np_dtype(u.dtype))
        st.globals[idx] = _Global(name, u.dtype, data, bool(writable))
    pc, n = 0, len(steps)
    with np.errstate(all="ignore"):
      while pc < n:
        nxt = steps[pc](st)
        pc = pc + 1 if nxt is None else nxt

class PythonDevice(Compiled):
  """Runs Program.uops with numpy; `emulate` picks the dialect whose capabilities and tensor cores it carries."""
  interprets_uops = True
  name = "PYTHON"

  def __init__(self, emulate: Optional[str] = None):
    if emulate is not None and emulate.upper() not in ("CUDA", "METAL", "AMD"):
      raise UnsupportedError(f"PYTHON emulates CUDA, METAL or AMD (or None), not {emulate!r}")
    self.emulate = emulate.upper() if emulate else None
    super().__init__()

  @classmethod
  def availability(cls) -> tuple[bool, str]: return True, ""
  def _make_renderer(self) -> Renderer: return PythonRenderer(self.emulate)
  def compiler_id(self) -> str: return f"PYTHON-numpy{np.__version__}-{self.emulate or 'generic'}"

  def _alloc(self, nbytes: int, dtype: DType) -> np.ndarray:
    if isinstance(dtype, ImageDType): return np.zeros(dtype.shape, dtype=np_dtype(dtype.base))
    return np.zeros(nbytes, dtype=np.uint8)

  def _copyin(self, handle: np.ndarray, src: np.ndarray) -> None:
    if handle.dtype == np.uint8: handle[:] = np.ascontiguousarray(src).view(np.uint8).reshape(-1)
    else: handle.reshape(-1)[:] = src.reshape(-1)

  def _copyout(self, dst: np.ndarray, handle: np.ndarray) -> None:
    if handle.dtype == np.uint8: dst.view(np.uint8)[:] = handle
    else: dst[:] = handle.reshape(-1)

  def _compile(self, program: Program) -> PythonProgram: return PythonProgram(program)

  def _launch(self, lib: PythonProgram, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    st = time.perf_counter()
    vals = {v.expr: int(x) for v, x in zip(program.vars, var_vals)}
    lib.run(handles, vals, tuple(global_size or (1,)), tuple(local_size or (1,)))
    return time.perf_counter() - st if wait else None

DEVICE_CLASS = PythonDevice
