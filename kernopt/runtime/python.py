"""The PYTHON device: kernopt's executable spec. It interprets a Program's linearized UOp list with GPU semantics,
every thread of the launch at once as numpy arrays over a thread axis, and can emulate the CUDA, Metal and AMD
dialects (their capabilities and their tensor-core fragment layouts). It detects out-of-bounds accesses and local
memory read without a BARRIER after another thread's write. Its values and ALU live in runtime/python_alu.py, its
tensor-core layouts in runtime/python_wmma.py. Imports dtype, errors, helpers, renderers, runtime and uops."""
from __future__ import annotations
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional
import numpy as np
from kernopt.dtype import DType, ImageDType
from kernopt.errors import CompileError, UnsupportedError
from kernopt.helpers import prod
from kernopt.renderers import BufferArg, Program, Renderer, VarArg, get_renderer
from kernopt.runtime import Compiled, np_dtype
from kernopt.runtime.python_alu import EmulationError, alu_kernel, from_storage, reg_dtype, to_reg, to_storage
from kernopt.runtime.python_wmma import wmma_warps
from kernopt.uops import UOp, UOps, flops_mem

class OutOfBoundsError(EmulationError, IndexError):
  """An active thread loaded or stored outside a buffer."""

class RaceError(EmulationError):
  """A thread read local memory that another thread wrote with no BARRIER in between."""

# ***** the renderer: the emulated dialect's capabilities; the "source" is a dump of the uops *****

class PythonRenderer(Renderer):
  """The capabilities record of dialect `emulate`'s static profile ("CUDA", "METAL", "AMD"; None: OpenCL's, with
  images, no tensor cores, device "PYTHON"). render() returns a textual dump of the uops: the device runs
  Program.uops."""
  key_caps = ("emulate",)

  def __init__(self, emulate: Optional[str] = None):
    caps = get_renderer(emulate or "OPENCL").caps
    if emulate is None: caps = replace(caps, device="PYTHON", tensor_cores=(), has_local=True, supports_images=True)
    self.caps = replace(caps, emulate=emulate.upper() if emulate else None)

  def render(self, name: str, uops: list[Any]) -> str:
    num = {u: i for i, u in enumerate(uops)}
    lines = [f"// PYTHON ({self.caps.emulate or 'generic'}) kernel {name}"]
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
    self.phis_of: dict[UOp, list[int]] = {}
    for i, u in enumerate(uops):
      if u.op is UOps.PHI: self.phis_of.setdefault(u.src[0], []).append(i)
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

  def _define_acc(self, i: int, u: UOp, s: list[int]) -> Step:
    # its PHIs start at the initial value too: a loop of no iterations (a symbolic axis at 0) leaves them there
    init, phis = self._const(i, u, s), self.phis_of.get(u, [])
    def step(st: _State) -> None:
      init(st)
      for j in phis: st.vals[j] = st.vals[i]
    return step

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
    fn, dt = alu_kernel(u.arg, u.dtype), u.dtype
    def step(st: _State) -> None: st.vals[i] = fn(dt, *[np.asarray(st.vals[j]) for j in s])
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
    if emulate is not None and (not isinstance(emulate, str) or emulate.upper() not in ("CUDA", "METAL", "AMD")):
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
