"""Devices: the registry, `Buffer`, and the compile-then-launch contract every backend implements.
numpy is used here and below; device drivers are imported lazily, inside the device that needs them."""
from __future__ import annotations
import hashlib, importlib, time
from typing import Any, Optional
import numpy as np
from kernopt import __version__
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import KernoptError, LaunchError, UnsupportedError
from kernopt.helpers import getconfig
from kernopt.renderers import Program, Renderer

def np_dtype(dt: DType) -> np.dtype:
  """The numpy dtype that stores dt (bfloat16 is stored as its uint16 bit pattern)."""
  dt = dt.base if isinstance(dt, ImageDType) else dt.scalar()
  if dt == dtypes.bfloat16: return np.dtype(np.uint16)
  if dt.fmt is None: raise UnsupportedError(f"no numpy dtype stores {dt}")
  return np.dtype(dt.fmt)

class Compiled:
  """A device: an allocator, a compiler and a launcher. Subclasses implement the underscored methods."""
  name: str = ""
  options: dict[str, Any] = {}   # what Device.open was given, so other processes can open the same device

  def __init__(self) -> None:
    self.renderer: Renderer = self._make_renderer()
    self._runners: dict[Any, CompiledRunner] = {}

  # -- to implement --
  def _make_renderer(self) -> Renderer: raise NotImplementedError
  def _alloc(self, nbytes: int, dtype: DType) -> Any: raise NotImplementedError
  def _copyin(self, handle: Any, src: np.ndarray) -> None: raise NotImplementedError
  def _copyout(self, dst: np.ndarray, handle: Any) -> None: raise NotImplementedError
  def _free(self, handle: Any) -> None:
    """Release a buffer's memory; devices whose handles are garbage-collected need not override it."""
  def _compile(self, program: Program) -> Any:
    """Build program.src; return whatever _launch needs. Raise CompileError with the compiler's log."""
    raise NotImplementedError
  def _launch(self, lib: Any, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    raise NotImplementedError
  def synchronize(self) -> None: pass
  def compiler_id(self) -> str:
    """Compiler name and version, flags and target ISA: part of every compiled-binary cache key."""
    return self.name

  # -- shared --
  def compile(self, program: Program) -> CompiledRunner:
    """A runner for program, compiled once per (source, compiler) in this process; devices also cache on disk."""
    key = (program.src, program.name, program.global_size, program.local_size)
    if (runner := self._runners.get(key)) is None:
      runner = self._runners[key] = CompiledRunner(self, program, self._compile(program))
    return runner

  def cache_key(self, src: str) -> str:
    return hashlib.sha256("\0".join((src, self.compiler_id(), __version__)).encode()).hexdigest()

class CompiledRunner:
  """A compiled Program bound to its device. Calling it checks every argument before anything runs."""
  def __init__(self, device: Compiled, program: Program, lib: Any):
    self.device, self.program, self.lib = device, program, lib

  def __call__(self, *buffers: Buffer, var_vals: Optional[dict[Any, int]] = None,
               wait: bool = False) -> Optional[float]:
    """Launch with buffers in MemBuffer index order; returns the kernel's seconds when wait=True."""
    vals = self._check(buffers, var_vals or {})
    gsz, lsz = self.program.launch_dims(vals)
    ordered = [v for v in self.program.vars]
    ret = self.device._launch(self.lib, self.program, [b._handle for b in buffers], [vals[v] for v in ordered],
                              gsz, lsz, wait)
    return ret

  def _check(self, buffers: tuple[Buffer, ...], var_vals: dict[Any, int]) -> dict[Any, int]:
    from kernopt.shape.symbolic import sym_infer
    prg = self.program
    if len(buffers) != len(prg.args):
      raise LaunchError(f"{prg.name} takes {len(prg.args)} buffers (indices {[a.idx for a in prg.args]}), "
                        f"got {len(buffers)}")
    by_name = {(k.expr if hasattr(k, "expr") else k): v for k, v in var_vals.items()}
    vals: dict[Any, int] = {}
    for v in prg.vars:
      if v.expr not in by_name: raise LaunchError(f"{prg.name} needs a value for variable {v.expr!r}")
      val = by_name[v.expr]
      if not isinstance(val, int) or not v.min <= val <= v.max:
        raise LaunchError(f"{prg.name}: variable {v.expr}={val!r} is outside [{v.min}, {v.max}]")
      vals[v] = val
    for arg, buf in zip(prg.args, buffers):
      if not isinstance(buf, Buffer): raise LaunchError(f"{prg.name}: argument {arg.idx} is not a Buffer: {buf!r}")
      if buf.device != self.device.name:
        raise LaunchError(f"{prg.name}: buffer {arg.idx} lives on {buf.device}, the kernel on {self.device.name}")
      if buf.dtype != arg.dtype:
        raise LaunchError(f"{prg.name}: buffer {arg.idx} has dtype {buf.dtype}, the kernel expects {arg.dtype}")
      need = sym_infer(arg.min_size, vals)
      if buf.size < need:
        raise LaunchError(f"{prg.name}: buffer {arg.idx} holds {buf.size} elements, the kernel addresses {need}")
    return vals

class Buffer:
  """`size` elements of `dtype` on a device. `copyin(array)` and `numpy()` move data through numpy."""
  def __init__(self, device: str, size: int, dtype: DType):
    if not isinstance(size, int) or size < 0: raise LaunchError(f"Buffer size must be a non-negative int, got {size!r}")
    self.dev = Device[device]
    self.device, self.size, self.dtype = self.dev.name, size, dtype
    self.nbytes = size * (dtype.itemsize if not isinstance(dtype, ImageDType) else dtype.base.itemsize)
    self._handle = self.dev._alloc(self.nbytes, dtype)

  def copyin(self, src: Any) -> Buffer:
    arr = np.ascontiguousarray(src).reshape(-1)
    if arr.dtype != np_dtype(self.dtype): arr = arr.astype(np_dtype(self.dtype))
    if arr.size != self.size: raise LaunchError(f"copyin of {arr.size} elements into a Buffer of {self.size}")
    self.dev._copyin(self._handle, arr)
    return self

  def numpy(self) -> np.ndarray:
    out = np.empty(self.size, dtype=np_dtype(self.dtype))
    self.dev._copyout(out, self._handle)
    return out

  def __del__(self) -> None:
    if (handle := getattr(self, "_handle", None)) is not None: self.dev._free(handle)

  def __repr__(self) -> str: return f"Buffer({self.device!r}, {self.size}, {self.dtype})"

# device name -> module that defines `DEVICE_CLASS`
_DEVICES: dict[str, str] = {"CPU": "kernopt.runtime.cpu", "OPENCL": "kernopt.runtime.opencl",
                            "PYTHON": "kernopt.runtime.python", "CUDA": "kernopt.runtime.cuda",
                            "METAL": "kernopt.runtime.metal"}

class _DeviceRegistry:
  """`Device["CPU"]` opens (once) and returns a device; `Device["PYTHON", "CUDA"]`-style options go through
  `Device.open(name, **options)`."""
  def __init__(self) -> None: self._open: dict[tuple, Compiled] = {}

  def open(self, name: str, **options: Any) -> Compiled:
    name = name.upper()
    key = (name, tuple(sorted(options.items())))
    if (dev := self._open.get(key)) is None:
      if name not in _DEVICES: raise UnsupportedError(f"unknown device {name!r}; known: {sorted(_DEVICES)}")
      module = importlib.import_module(_DEVICES[name])
      dev = self._open[key] = module.DEVICE_CLASS(**options)
      dev.options = dict(options)
    return dev

  def __getitem__(self, name: str) -> Compiled: return self.open(name)
  def opened(self) -> list[Compiled]:
    """The devices opened so far in this process."""
    return list(self._open.values())

  @property
  def DEFAULT(self) -> str: return (getconfig().DEVICE or "CPU").upper()

  def available(self) -> list[str]:
    """Names of the devices that can compile and run kernels on this machine."""
    ret = []
    for name in _DEVICES:
      try:
        module = importlib.import_module(_DEVICES[name])
        ok, _ = module.DEVICE_CLASS.availability()
      except (ImportError, KernoptError, AttributeError): ok = False
      if ok: ret.append(name)
    return ret

Device = _DeviceRegistry()

def timed(fn: Any) -> float:
  st = time.perf_counter()
  fn()
  return time.perf_counter() - st
