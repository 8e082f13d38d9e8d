"""Devices: the registry, `Buffer`, and the compile-then-launch contract every backend implements.
numpy is used here and below; device drivers are imported lazily, inside the device that needs them.
Imports debug, dtype, errors, helpers, renderers and shape.symbolic."""
from __future__ import annotations
import hashlib, importlib, inspect, operator, threading, time, weakref
from typing import Any, Mapping, Optional
import numpy as np
from kernopt import __version__, debug
from kernopt.dtype import DType, ImageDType, dtypes, storage_dtype_error
from kernopt.errors import CompileError, KernoptError, LaunchError, UnsupportedError
from kernopt.helpers import getconfig
from kernopt.renderers import Program, Renderer

def np_dtype(dt: DType) -> np.dtype:
  """The numpy dtype that stores dt (bfloat16 is stored as its uint16 bit pattern)."""
  dt = dt.base if isinstance(dt, ImageDType) else dt.scalar()
  if dt == dtypes.bfloat16: return np.dtype(np.uint16)
  if dt.fmt is None: raise UnsupportedError(f"no numpy dtype stores {dt}")
  return np.dtype(dt.fmt)

def round_bf16(x: Any) -> np.ndarray:
  """float values rounded to bfloat16 (to float32 first, then nearest even) and held in float32, as
  alu.truncate_float does; a NaN stays a NaN (quiet, so its top 16 bits are one too)."""
  f = np.asarray(x, dtype=np.float32)
  bits = f.view(np.uint32)
  r = ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32)
  return np.where(np.isnan(f), ((bits | np.uint32(0x00400000)) & np.uint32(0xFFFF0000)).view(np.float32), r)

def bf16_bits(x: Any) -> np.ndarray:
  """Values -> their bfloat16 bit patterns (uint16), rounded as round_bf16."""
  return (round_bf16(x).view(np.uint32) >> np.uint32(16)).astype(np.uint16)

def bf16_from_bits(b: Any) -> np.ndarray: return (np.asarray(b).astype(np.uint32) << np.uint32(16)).view(np.float32)

def to_storage(arr: np.ndarray, dt: DType) -> np.ndarray:
  """arr as the numpy storage of dt's Buffers: as it is when it has that dtype already (for bfloat16: uint16 bit
  patterns, what Buffer.numpy() returns), else its values converted (to bfloat16 rounding to nearest even)."""
  npdt = np_dtype(dt)
  if arr.dtype == npdt: return arr
  if npdt == np.uint16 and (isinstance(dt, ImageDType) and dt.base == dtypes.bfloat16 or dt == dtypes.bfloat16):
    return bf16_bits(arr)
  return arr.astype(npdt)

class Compiled:
  """A device: an allocator, a compiler and a launcher. Subclasses implement the underscored methods."""
  name: str = ""
  options: dict[str, Any] = {}   # what Device.open was given, so other processes can open the same device
  interprets_uops = False        # runs Program.uops itself (PYTHON): its Programs can't come from the program cache
  caches_binaries = False        # compile() stores the binary on disk, where another process's compile() finds it
  warmup_launch = False          # a binary's first launch builds more into an on-disk cache (PoCL: its work-group code)
  # runners compile() keeps for reuse, least recently used dropped first: a dropped runner that nobody else holds is
  # freed with its binary (the CPU device unloads the shared object; every loaded one costs about 5 of the process's
  # vm.max_map_count mappings, 65,530 by default)
  max_runners = 1024

  def __init__(self) -> None:
    self.renderer: Renderer = self._make_renderer()
    self._runners: dict[Any, CompiledRunner] = {}
    self._runners_lock = threading.Lock()

  # -- to implement --
  def _make_renderer(self) -> Renderer: raise NotImplementedError
  def _alloc(self, nbytes: int, dtype: DType) -> Any: raise NotImplementedError
  def _copyin(self, handle: Any, src: np.ndarray) -> None: raise NotImplementedError
  def _copyout(self, dst: np.ndarray, handle: Any) -> None: raise NotImplementedError
  def _free(self, handle: Any) -> None:
    """Release a buffer's memory; devices whose handles are garbage-collected need not override it."""
  def _wrap(self, ptr: Any, nbytes: int) -> Any:
    """The handle of nbytes at ptr, allocated elsewhere (Buffer.from_device_pointer)."""
    raise UnsupportedError(f"{self.name} cannot wrap memory allocated elsewhere")
  def _launch_arg(self, handle: Any) -> Any:
    """What _launch receives for a buffer whose handle this is: computed once, when the Buffer is made."""
    return handle
  def _compile(self, program: Program) -> Any:
    """Build program.src; return whatever _launch needs. Raise CompileError with the compiler's log."""
    raise NotImplementedError
  def _launch(self, lib: Any, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    """Run lib: handles are the _launch_arg of the buffers of program.used_args (in index order), var_vals those of
    program.vars,
    each passed as its program.var_args dtype."""
    raise NotImplementedError
  def synchronize(self) -> None: pass
  def compiler_id(self) -> str:
    """Compiler name and version, flags and target ISA: part of every compiled-binary cache key."""
    return self.name

  # -- shared --
  def compile(self, program: Program) -> CompiledRunner:
    """A runner for program, compiled once per whole Program while this device keeps the runner (source, signature,
    launch dims, variables and their ranges: a runner never checks a launch against another program's signature; the
    max_runners most recently used are kept); devices also cache binaries on disk."""
    if not isinstance(program, Program):
      raise CompileError(f"{self.name}.compile takes a Program (Kernel.to_program()), got {type(program).__name__}")
    if not self.interprets_uops and program.device != self.name:
      raise CompileError(f"{program.name} was rendered for {program.device}; the {self.name} device compiles "
                         f"{self.name} programs (render with its renderer: Kernel(ast, opts=device.renderer))")
    key = (program.src, program.name, program.device, program.global_size, program.local_size, program.args,
           tuple((v.expr, v.min, v.max) for v in program.vars), getattr(program, "var_args", ()))
    compile_s: Optional[float] = None
    with self._runners_lock:   # compile threads share the table (kernopt.compile_many)
      if (runner := self._runners.pop(key, None)) is not None: self._runners[key] = runner   # most recent last
    if runner is None:
      st = time.perf_counter()
      runner = CompiledRunner(self, program, self._compile(program))
      compile_s = time.perf_counter() - st
      with self._runners_lock:
        self._runners[key] = runner
        while len(self._runners) > max(1, self.max_runners): self._runners.pop(next(iter(self._runners)))
    if debug.on(1):
      events = debug.cache_events()
      if compile_s is None: events["binary"] = "memory"   # this process's runner for this very Program
      debug.kernel_built(program.name, self.name, program.extra.get("opts"), program.extra.get("codegen_s"),
                         compile_s, events)
    return runner

  def cache_key(self, src: str) -> str:
    return hashlib.sha256("\0".join((src, self.compiler_id(), __version__)).encode()).hexdigest()

class CompiledRunner:
  """A compiled Program bound to its device. Calling it checks every argument before anything runs."""
  def __init__(self, device: Compiled, program: Program, lib: Any):
    self.device, self.program, self.lib = device, program, lib
    # each used buffer's address range as ints, or as cheap functions of the launch's values
    self._bounds = {a.idx: (_bound_fn(a.lo, program.vars), _bound_fn(a.hi, program.vars)) for a in program.args
                    if a.used and not (type(a.lo) is int and type(a.hi) is int and a.hi <= a.lo)}
    # what each launch reads, looked up once: (arg, its bounds or None) per buffer, the positions of the used ones
    self._plan = tuple((a, self._bounds.get(a.idx)) for a in program.args)
    self._used = tuple(i for i, a in enumerate(program.args) if a.used)
    # the last launch that passed _check, for a program without Variables, as (weak references to its buffers, their
    # handles, the launch dims): a Buffer's device, size and dtype are fixed, so the very same Buffer objects pass the
    # same checks again (weak: a runner keeps no buffer alive)
    self._checked: tuple = ()

  def __call__(self, *buffers: Buffer, var_vals: Optional[dict[Any, int]] = None,
               wait: bool = False) -> Optional[float]:
    """Launch with buffers in MemBuffer index order; returns the kernel's seconds when wait=True."""
    if var_vals is not None and not isinstance(var_vals, Mapping):
      raise LaunchError(f"{self.program.name}: var_vals must be a dict of Variable or name -> int, got "
                        f"{type(var_vals).__name__}")
    if not isinstance(wait, (bool, np.bool_)):
      raise LaunchError(f"{self.program.name}: wait must be a bool, got {type(wait).__name__} {wait!r}")
    prg = self.program
    if var_vals or prg.vars or (hit := self._checked_launch(buffers)) is None:
      vals = self._check(buffers, var_vals or {})
      gsz, lsz = prg.launch_dims(vals)
      # a global dimension of 0 at these values (a Variable at 0): no output element exists, nothing is launched
      if gsz is not None and 0 in gsz: return 0.0 if wait else None
      # by index: the source's buffer parameters are the used args only, in index order
      handles = [buffers[i]._arg for i in self._used]
      if not prg.vars: self._checked = (tuple(weakref.ref(b) for b in buffers), tuple(handles), (gsz, lsz))
    else: vals, (handles, (gsz, lsz)) = {}, hit
    var_list = [vals[v] for v in prg.vars] if prg.vars else []
    if not debug.on(2): return self.device._launch(self.lib, prg, handles, var_list, gsz, lsz, wait)
    # DEBUG>=2 waits for every launch, to time it
    t = self.device._launch(self.lib, prg, handles, var_list, gsz, lsz, True)
    self._report(t or 0.0, vals, gsz, lsz)
    return t if wait else None

  def _checked_launch(self, buffers: tuple[Buffer, ...]) -> Optional[tuple[list[Any], tuple[Any, Any]]]:
    """(handles, launch dims) of the last checked launch when buffers are its very Buffer objects, else None."""
    if not (checked := self._checked) or len(refs := checked[0]) != len(buffers): return None
    for r, b in zip(refs, buffers):
      if r() is not b: return None
    return list(checked[1]), checked[2]

  def _report(self, seconds: float, vals: dict[Any, int], gsz: Any, lsz: Any) -> None:
    from kernopt.shape.symbolic import sym_infer
    prg = self.program
    flops, nbytes = (sym_infer(x, vals) if not isinstance(x, (int, float)) else x
                     for x in (prg.op_estimate, prg.mem_estimate))
    debug.launched(prg.name, self.device.name, gsz, lsz, seconds, float(flops), float(nbytes))

  def _check(self, buffers: tuple[Buffer, ...], var_vals: dict[Any, int]) -> dict[Any, int]:
    """The program's Variables -> their values, after checking every buffer (device, dtype, and where used that the
    address range [lo, hi) at these values lies inside it: none below 0, none past its size), that
    no written buffer is passed for two indices, and every value (an int in the Variable's range); var_vals keys are
    Variables or names, and the ones the program doesn't take are ignored."""
    prg = self.program
    if len(buffers) != len(prg.args):
      raise LaunchError(f"{prg.name} takes {len(prg.args)} buffers (indices {[a.idx for a in prg.args]}), "
                        f"got {len(buffers)}")
    by_name: dict[str, Any] = {}
    if var_vals: from kernopt.shape.symbolic import Variable
    for k, val in var_vals.items():
      if not isinstance(k, (str, Variable)):
        raise LaunchError(f"{prg.name}: a var_vals key must be a Variable or its name, got {type(k).__name__} {k!r}")
      name = k.expr if isinstance(k, Variable) else k
      if name in by_name and not _same_value(by_name[name], val):
        raise LaunchError(f"{prg.name}: variable {name!r} is given twice, {by_name[name]!r} and {val!r}")
      by_name[name] = val
    vals: dict[Any, int] = {}
    for v in prg.vars:
      if v.expr not in by_name: raise LaunchError(f"{prg.name} needs a value for variable {v.expr!r}")
      val = by_name[v.expr]
      if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, np.integer)):
        raise LaunchError(f"{prg.name}: variable {v.expr} must be an int, got {type(val).__name__} {val!r}")
      if not v.min <= int(val) <= v.max:
        raise LaunchError(f"{prg.name}: variable {v.expr}={val!r} is outside [{v.min}, {v.max}]")
      vals[v] = int(val)
    seen: dict[int, Any] = {}
    device = self.device.name
    for (arg, bd), buf in zip(self._plan, buffers):
      if type(buf) is not Buffer and not isinstance(buf, Buffer):
        raise LaunchError(f"{prg.name}: argument {arg.idx} is not a Buffer: {buf!r}")
      if buf.device != device:
        raise LaunchError(f"{prg.name}: buffer {arg.idx} lives on {buf.device}, the kernel on {device}")
      if buf.dtype is not arg.dtype and buf.dtype != arg.dtype:
        raise LaunchError(f"{prg.name}: buffer {arg.idx} has dtype {buf.dtype}, the kernel expects {arg.dtype}")
      if not arg.used: continue   # never read: no size to check, and no alias that matters
      if bd is not None:
        lo, hi = bd
        if type(lo) is not int: lo = lo(vals)
        if type(hi) is not int: hi = hi(vals)
        if hi > lo and (lo < 0 or buf.size < hi): self._out_of_bounds(arg.idx, buf, lo, hi, vals)
      # every pointer parameter is restrict: a written buffer may not be another parameter too
      if (other := seen.get(id(buf))) is not None and (arg.writable or other.writable):
        raise LaunchError(f"{prg.name}: the same Buffer is passed as buffers {other.idx} and {arg.idx}, and "
                          f"{other.idx if other.writable else arg.idx} is written (in-place kernels are not supported)")
      seen[id(buf)] = arg
    return vals

  def _out_of_bounds(self, idx: int, buf: Buffer, lo: int, hi: int, vals: dict[Any, int]) -> None:
    at = f" at {', '.join(f'{v.expr}={n}' for v, n in vals.items())}" if vals else ""
    where = f"elements [{lo}, {hi}){at}"
    if lo < 0:
      raise LaunchError(f"{self.program.name}: buffer {idx}: the kernel addresses element {lo}, before the buffer's "
                        f"start ({where})")
    raise LaunchError(f"{self.program.name}: buffer {idx} holds {buf.size} elements, the kernel addresses {hi} "
                      f"({where})")

def _is_int(x: Any) -> bool: return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))

def _same_value(a: Any, b: Any) -> bool:
  """Whether two values given for one variable agree: equal ints, or the very same object (any other value is
  refused as the variable's value later, if the kernel uses it)."""
  return int(a) == int(b) if _is_int(a) and _is_int(b) else a is b

def _bound_fn(x: Any, variables: tuple[Any, ...]) -> Any:
  """x itself when an int, else x as a function of var_vals: affine sums of the Program's Variables as one sum of
  products, anything else through the symbolic evaluator."""
  from kernopt.shape.symbolic import MulNode, NumNode, SumNode, Variable
  if type(x) is int: return x
  if type(x) is NumNode: return x.b
  const, lin, known = 0, [], set(variables)
  for t in x.nodes if type(x) is SumNode else (x,):
    if type(t) is NumNode: const += t.b
    elif type(t) is Variable and t in known: lin.append((t, 1))
    elif type(t) is MulNode and type(t.a) is Variable and type(t.b) is int and t.a in known: lin.append((t.a, t.b))
    else: return x._eval
  if len(lin) == 1:
    (v, k), = lin
    return operator.itemgetter(v) if const == 0 and k == 1 else lambda vals: const + k * vals[v]
  return lambda vals: const + sum(k * vals[v] for v, k in lin)

class Buffer:
  """`size` elements of `dtype` on a device (a name, or an opened device). `copyin(array)` and `numpy()` move data
  through numpy."""
  _owner: Any = None   # what keeps wrapped memory alive (from_device_pointer); such memory is never freed here

  def __init__(self, device: str | Compiled, size: int, dtype: DType, _wrap: Optional[tuple[Any, Any]] = None):
    if type(size) is not int:
      if isinstance(size, bool) or not hasattr(type(size), "__index__"):
        raise LaunchError(f"Buffer size must be a non-negative int, got {type(size).__name__} {size!r}")
      size = operator.index(size)
    if not 0 <= size < 1 << 48: raise LaunchError(f"Buffer size must be an int in [0, 2**48), got {size}")
    if (why := storage_dtype_error(dtype)) is not None: raise LaunchError(f"Buffer dtype: {why}")
    if not isinstance(dtype, ImageDType) and dtype.count != 1:
      raise LaunchError(f"Buffer dtype must be a scalar (or image) dtype, got the vector {dtype}: make a Buffer of "
                        f"{dtype.count} times the elements of {dtype.scalar()}")
    if not isinstance(device, (str, Compiled)):
      raise UnsupportedError(f"Buffer device must be a device name or an opened device, got {type(device).__name__}")
    self.dev = device if isinstance(device, Compiled) else Device[device]
    self.device, self.size, self.dtype = self.dev.name, size, dtype
    self.nbytes = size * (dtype.itemsize if not isinstance(dtype, ImageDType) else dtype.base.itemsize)
    if _wrap is None:
      try: self._handle = self.dev._alloc(self.nbytes, dtype)
      except MemoryError:
        raise LaunchError(f"cannot allocate a Buffer of {self.nbytes} bytes on {self.device}") from None
    else: self._handle, self._owner = self.dev._wrap(_wrap[0], self.nbytes), _wrap
    self._arg = self.dev._launch_arg(self._handle)
    self._made = True

  def __setattr__(self, name: str, value: Any) -> None:
    # what the launch checks read (device, size, dtype) and the memory they describe are fixed once the Buffer exists
    if self.__dict__.get("_made"): raise AttributeError(f"a Buffer's {name} is fixed: make a new Buffer")
    object.__setattr__(self, name, value)

  @classmethod
  def from_device_pointer(cls, device: str | Compiled, ptr: Any, size: int, dtype: DType, owner: Any = None) -> Buffer:
    """A Buffer over `size` elements at ptr, memory allocated elsewhere (a device address, or the driver's allocation
    object): no copy is made, kernopt never frees it, and the Buffer keeps ptr and owner alive."""
    return cls(device, size, dtype, _wrap=(ptr, owner))

  def copyin(self, src: Any) -> Buffer:
    """src's elements into this Buffer (as many as it holds), through runtime.to_storage: an array of the storage
    dtype as it is (bfloat16: uint16 bit patterns), any other's values converted. Returns self."""
    try: raw = np.ascontiguousarray(src)
    except (TypeError, ValueError) as e:
      raise LaunchError(f"copyin takes an array of numbers, got {type(src).__name__}: {str(e)[:120]}") from None
    if raw.dtype.kind not in "biuf":
      raise LaunchError(f"copyin takes an array of numbers, got {type(src).__name__} of {raw.dtype}")
    arr = to_storage(raw.reshape(-1), self.dtype)
    if arr.size != self.size: raise LaunchError(f"copyin of {arr.size} elements into a Buffer of {self.size}")
    self.dev._copyin(self._handle, arr)
    return self

  def numpy(self) -> np.ndarray:
    out = np.empty(self.size, dtype=np_dtype(self.dtype))
    self.dev._copyout(out, self._handle)
    return out

  def __del__(self) -> None:
    if (handle := getattr(self, "_handle", None)) is not None and self._owner is None: self.dev._free(handle)

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
    if not isinstance(name, str): raise UnsupportedError(f"a device name is a str, got {type(name).__name__} {name!r}")
    name = name.upper()
    # a list option (extra_flags=[...]) means its tuple; anything else unhashable can't name a device
    options = {k: tuple(v) if type(v) is list else v for k, v in options.items()}
    try: hash(key := (name, tuple(sorted(options.items()))))
    except TypeError:
      bad = [k for k, v in options.items() if getattr(type(v), "__hash__", None) is None]
      raise UnsupportedError(f"device {name} options must be hashable values: {bad or sorted(options)}") from None
    if (dev := self._open.get(key)) is None:
      if name not in _DEVICES: raise UnsupportedError(f"unknown device {name!r}; known: {sorted(_DEVICES)}")
      module = importlib.import_module(_DEVICES[name])
      try: inspect.signature(module.DEVICE_CLASS).bind(**options)
      except TypeError as e: raise UnsupportedError(f"device {name} does not take these options: {e}") from None
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
    return [name for name in _DEVICES if self.why_unavailable(name) is None]

  def why_unavailable(self, name: str) -> Optional[str]:
    """Why device `name` is not in `available()`, or None when it is."""
    if not isinstance(name, str): return f"a device name is a str, got {type(name).__name__} {name!r}"
    if (name := name.upper()) not in _DEVICES: return f"unknown device {name!r}; known: {sorted(_DEVICES)}"
    try:
      ok, why = importlib.import_module(_DEVICES[name]).DEVICE_CLASS.availability()
    except (ImportError, KernoptError, AttributeError) as e: ok, why = False, f"{type(e).__name__}: {e}"
    return None if ok else (why or f"{name} is not available")

Device = _DeviceRegistry()

def timed(fn: Any) -> float:
  st = time.perf_counter()
  fn()
  return time.perf_counter() - st
