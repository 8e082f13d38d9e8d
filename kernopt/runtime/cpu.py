"""The CPU device: C source from the native profile `NativeCRenderer` (or the static `CRenderer`), compiled by the
system C compiler (clang, else gcc) into a shared object cached on disk, its sha256 checked before ctypes loads it.
Flags: -O2 -march=native (when accepted) -fPIC -shared -std=gnu11 -ffp-contract=off -fno-math-errno, plus -pthread
-funroll-loops on the native profile (and -fopenmp when asked for and accepted); never -ffast-math, so NaN,
infinities and IEEE rounding match the op table. The thread count is rendered into the source, so it is part of the
binary cache key. Imports dtype, errors, helpers, renderers and runtime/."""
from __future__ import annotations
import ctypes
import functools
import hashlib
import math
import os
import platform
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Optional
import numpy as np
from kernopt import __version__
from kernopt.dtype import DType, dtypes
from kernopt.errors import CompileError, LaunchError, UnsupportedError
from kernopt.helpers import (cache_subdir, count, cache_tmp, diskcache_get, diskcache_put, getconfig, record_binary,
                             remove_stale_tmp, verified_binary)
from kernopt.renderers import Program, Renderer
from kernopt.renderers.cstyle import CRenderer
from kernopt.renderers.native import ISA_LEVELS, POOL_ABI, POOL_SOURCE, NativeCRenderer, host_cpu_flags, isa_facts
from kernopt.runtime import Compiled

BASE_FLAGS = ("-O2", "-fPIC", "-shared", "-std=gnu11", "-ffp-contract=off", "-fno-math-errno")
# native profile only: -funroll-loops unrolls the register tile's reduce loop (4x2 matmul tile, 1 thread, same process:
# 1024^3 29 -> 35 GF/s, 512^3 35 -> 42 GF/s; -O3 measured no faster than -O2)
NATIVE_FLAGS = ("-pthread", "-funroll-loops")
# the process's pthread pool (CPUDevice._load_pool): one for every parallel kernel of every CPU device
_POOL: Optional[ctypes.CDLL] = None
try: from _ctypes import dlclose as _dlclose   # POSIX
except ImportError: _dlclose = None
_POOL_LOCK = threading.Lock()
# a Variable parameter's C type, by its width in the signature
_CTYPES = {dtypes.int32: ctypes.c_int32, dtypes.int64: ctypes.c_int64}

@dataclass(frozen=True)
class Miscompile:
  """A compiler release range [first, last] (name as compiler_identity() gives it) known to miscompile kernopt's C,
  and the narrowest flags found to avoid it; `case` names its regression test in tests/test_miscompiles.py."""
  compiler: str
  first: tuple[int, int, int]
  last: tuple[int, int, int]
  flags: tuple[str, ...]
  case: str
  target_flag: str = ""   # only where the target ISA has this CPU flag (/proc/cpuinfo's name; "": any target)

# docs/cpu.md "Known miscompiles". Both gcc 12.2 cases are gcc bugs (no UB: clean under -fsanitize=undefined,address,
# unchanged by -fwrapv and -fno-strict-aliasing) in the loop vectorizer; the series is covered since the releases
# with the fixes were not verified here
MISCOMPILES = (
  Miscompile("gcc", (12, 0, 0), (12, 99, 99), ("-fno-tree-loop-vectorize",),
             "SLP reduction of int accumulators through (uint32_t) casts: sum of 16 ints, UNROLL 2 (GCC PR 107212)"),
  Miscompile("gcc", (12, 0, 0), (12, 99, 99), ("-fno-tree-loop-vectorize",),
             "AVX-512VL masked loop vectorization of padded loads: pad(5x6) + 1, UPCAST/PADTO, -march=x86-64-v4"),
  Miscompile("gcc", (12, 0, 0), (12, 99, 99), ("-fno-tree-slp-vectorize",),
             "SLP vectorization of narrow unsigned compare results gives -1 for true: (uint8_t)(x == 1) summed over 4 "
             "lanes, or a MAX over b == 0 ? 0 : 1 / b (folded to b == 1), gives 255 for 1, at -O2 on any x86-64"),
  Miscompile("gcc", (12, 0, 0), (12, 99, 99), ("-mno-avx512fp16",),
             "SLP vectorization drops float->_Float16->float roundings with AVX512-FP16: a half SUM of rounded "
             "products, -march=native -funroll-loops", target_flag="avx512_fp16"),
)

def workaround_flags(identity: tuple[str, tuple[int, int, int]],
                     target: frozenset[str] = frozenset()) -> tuple[str, ...]:
  """The flags MISCOMPILES prescribes for a compiler identity (name, version) building for a target ISA with the CPU
  flags `target`, each once, in table order."""
  name, version = identity
  out: list[str] = []
  for m in MISCOMPILES:
    if m.compiler == name and m.first <= version <= m.last and (not m.target_flag or m.target_flag in target):
      out += [f for f in m.flags if f not in out]
  return tuple(out)

# what extra_flags may not hold: flags that change what the build writes or reads (output, language, stopping before
# the link, dependency files, dumps and reports written beside or anywhere, files or directories read: -include,
# -I, -L, -l, a linker script), that pass options on to the preprocessor, assembler or linker (-Wp,-MD,FILE,
# -Wl,-Map=FILE write where they are told), or that load code or tools from a path
_REFUSED_EXACT = ("-E", "-S", "-c", "-v", "-###", "-pipe", "--version", "-no-integrated-cpp")
_REFUSED_PREFIXES = ("-o", "-x", "-M", "-B", "-fplugin", "-wrapper", "-specs", "--specs", "--help", "-save-temps",
                     "--save-temps", "-fdump-", "--dump", "-aux-info", "-d", "-W,", "-Wp,", "-Wa,", "-Wl,", "-Xlinker",
                     "-Xassembler", "-Xpreprocessor", "-fopt-info", "-fstack-usage", "-fcallgraph-info", "-fprofile",
                     "-fauto-profile", "-fcreate-profile", "-i", "-I", "-L", "-l", "-T", "-z", "--param=ggc")

def check_extra_flags(flags: Any) -> tuple[str, ...]:
  """extra_flags as a tuple: a list or tuple of str, each one compiler flag ('-' then at least one printable
  character, no whitespace, NUL or newline), neither in _REFUSED_EXACT nor starting with one of _REFUSED_PREFIXES;
  else UnsupportedError naming extra_flags. They reach the compiler as argv entries, never through a shell."""
  if not isinstance(flags, (list, tuple)):
    raise UnsupportedError(f"extra_flags must be a list or tuple of str flags, got {type(flags).__name__} {flags!r}")
  for f in flags:
    if type(f) is not str: raise UnsupportedError(f"extra_flags entries must be str, got {type(f).__name__} {f!r}")
    if len(f) < 2 or f[0] != "-" or any(c.isspace() or not c.isprintable() for c in f):
      raise UnsupportedError(f"extra_flags entry {f!r} is not one compiler flag ('-' then printable characters, no "
                             f"whitespace, NUL or newline)")
    if f in _REFUSED_EXACT or f.startswith(_REFUSED_PREFIXES):
      raise UnsupportedError(f"extra_flags entry {f!r} is refused: it changes what the build reads, writes or runs "
                             f"(refused: {' '.join(_REFUSED_EXACT)}, and flags starting {' '.join(_REFUSED_PREFIXES)})")
  return tuple(flags)

def find_compiler() -> Optional[str]:
  """clang if on PATH, else gcc, else cc."""
  for name in ("clang", "gcc", "cc"):
    if (path := shutil.which(name)) is not None: return os.path.realpath(path)
  return None

def _run(cmd: list[str], purpose: str, stdin: str = "", timeout: Optional[float] = None) -> subprocess.CompletedProcess:
  """cmd's result; past `timeout` its whole process group (the driver and cc1 alike) is killed and TimeoutExpired
  raised."""
  if purpose == "compile": count("compiles")
  with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                        start_new_session=timeout is not None) as p:
    try: out, err = p.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
      os.killpg(p.pid, signal.SIGKILL)
      p.communicate()
      raise
  return subprocess.CompletedProcess(cmd, p.returncode, out, err)

@functools.lru_cache(None)
def host_cpu_id() -> str:
  """A digest naming this host's CPU: the machine and /proc/cpuinfo's vendor, model and feature flags (elsewhere,
  platform.processor()). Part of the probe and binary cache keys, so hosts sharing a cache directory never share a
  -march=native result."""
  keys = ("vendor_id", "cpu family", "model", "model name", "flags", "CPU implementer", "CPU part", "Features")
  found: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for ln in f:
        k, _, v = ln.partition(":")
        if k.strip() in keys: found.setdefault(k.strip(), " ".join(v.split()))
  except OSError: found["processor"] = platform.processor()
  return _sha("\n".join([platform.machine(), *(f"{k}={v}" for k, v in sorted(found.items()))]).encode())[:16]

def _sha(data: bytes) -> str: return hashlib.sha256(data).hexdigest()

@functools.lru_cache(None)
def toolchain(cc: str) -> tuple[str, tuple[str, ...], str]:
  """(version line, whether -march=native is accepted as flags, target ISA) of compiler cc, probed once per
  compiler binary (cached on disk by path, size and mtime)."""
  st = os.stat(cc)
  key = ("cpu_toolchain", cc, st.st_size, st.st_mtime_ns, __version__, host_cpu_id())
  if (hit := diskcache_get("cpu_toolchain", key)) is not None: return hit
  version = _run([cc, "--version"], "probe").stdout.splitlines()[0:1]
  native = _run([cc, "-march=native", "-x", "c", "-fsyntax-only", "-"], "probe", "int x;").returncode == 0
  isa = ""
  if native:
    out = _run([cc, "-march=native", "-Q", "--help=target"], "probe")
    isa = " ".join(ln.split()[-1] for ln in out.stdout.splitlines() if ln.strip().startswith(("-march=", "-mtune=")))
    if not isa:  # clang: the resolved target cpu from the driver's job line
      out = _run([cc, "-march=native", "-###", "-x", "c", "-c", os.devnull], "probe")
      parts = out.stderr.replace('"', "").split()
      isa = " ".join(parts[i + 1] for i, p in enumerate(parts[:-1]) if p in ("-target-cpu", "-triple"))
  ret = (version[0] if version else "unknown", ("-march=native",) if native else (), isa or os.uname().machine)
  return diskcache_put("cpu_toolchain", key, ret)

@functools.lru_cache(None)
def march_flags(cc: str, march: str) -> tuple[str, ...]:
  """("-march=<march>",) for an ISA level of CPU_MARCH (renderers.native.ISA_LEVELS) that cc accepts (gcc >= 11,
  clang >= 12), else UnsupportedError; "native" is toolchain()'s probe."""
  if march == "native": return toolchain(cc)[1]
  st = os.stat(cc)
  key = ("cpu_march", cc, st.st_size, st.st_mtime_ns, march, __version__)
  if (ok := diskcache_get("cpu_toolchain", key)) is None:
    ok = _run([cc, f"-march={march}", "-x", "c", "-fsyntax-only", "-"], "probe", "int x;").returncode == 0
    diskcache_put("cpu_toolchain", key, ok)
  if not ok: raise UnsupportedError(f"{cc} does not accept -march={march} (CPU_MARCH)")
  return (f"-march={march}",)

@functools.lru_cache(None)
def compiler_identity(cc: str) -> tuple[str, tuple[int, int, int]]:
  """("gcc" | "clang" | "unknown", (major, minor, patch)) of compiler cc from its predefined macros (the version line's
  first word is whatever the binary is called), cached on disk like toolchain."""
  st = os.stat(cc)
  key = ("cpu_identity", cc, st.st_size, st.st_mtime_ns, __version__)
  hit = diskcache_get("cpu_toolchain", key)
  if isinstance(hit, (list, tuple)) and len(hit) == 2 and isinstance(hit[0], str) and \
     isinstance(hit[1], (list, tuple)) and len(hit[1]) == 3 and all(type(v) is int for v in hit[1]):
    return hit[0], (hit[1][0], hit[1][1], hit[1][2])
  out = _run([cc, "-dM", "-E", "-x", "c", os.devnull], "probe").stdout
  macros = dict(ln.split()[1:3] for ln in out.splitlines() if ln.startswith("#define ") and len(ln.split()) >= 3)
  def version(*names: str) -> tuple[int, int, int]:
    try: return tuple(int(macros.get(n, "0")) for n in names)  # type: ignore[return-value]
    except ValueError: return (0, 0, 0)
  if "__clang__" in macros: ret = ("clang", version("__clang_major__", "__clang_minor__", "__clang_patchlevel__"))
  elif "__GNUC__" in macros: ret = ("gcc", version("__GNUC__", "__GNUC_MINOR__", "__GNUC_PATCHLEVEL__"))
  else: ret = ("unknown", (0, 0, 0))
  diskcache_put("cpu_toolchain", key, [ret[0], list(ret[1])])
  return ret

@functools.lru_cache(None)
def openmp_flags(cc: str) -> tuple[str, ...]:
  """("-fopenmp",) if cc builds and links an OpenMP shared object, else () (cached on disk like toolchain)."""
  st = os.stat(cc)
  key = ("cpu_openmp", cc, st.st_size, st.st_mtime_ns, __version__, host_cpu_id())
  if (hit := diskcache_get("cpu_toolchain", key)) is not None: return hit
  with tempfile.TemporaryDirectory(prefix="kernopt_omp_") as d:
    src = "void f(int* x) {\n#pragma omp parallel for\nfor (int i = 0; i < 4; i++) x[i] = i;\n}\n"
    out = _run([cc, "-fopenmp", "-fPIC", "-shared", "-x", "c", "-", "-o", os.path.join(d, "t.so")], "probe", src)
  return diskcache_put("cpu_toolchain", key, ("-fopenmp",) if out.returncode == 0 else ())

class CPUDevice(Compiled):
  """Kernels are C functions `void name(T* data0, ..., int var, ...)` called from the launching thread (a parallel
  kernel starts its workers itself); Program global and local sizes are None (the loops are inside).
  `profile` is "native" (NativeCRenderer for this host: `threads` (default CPU_THREADS, else the usable cores),
  `parallel` "pthread" (default) | "openmp" | "none", `vector_width` (default from the ISA), `min_parallel_work`,
  `fused_accumulate` (default: the host has FMA)) or
  "static" (the spec's CRenderer). `march` (default: the CPU_MARCH knob, else "native") sets the compiler's -march and
  the native profile's ISA facts (vector width, FMA) together.
  `extra_flags` (check_extra_flags) are appended to the compiler command; `workarounds` (default True) adds the flags
  MISCOMPILES prescribes for this compiler (off only to measure what they cost)."""
  name = "CPU"
  caches_binaries = True   # the shared object, under so_path

  def __init__(self, extra_flags: tuple[str, ...] = (), profile: str = "native", threads: Optional[int] = None,
               parallel: Optional[str] = None, vector_width: Optional[int] = None,
               min_parallel_work: Optional[int] = None, fused_accumulate: Optional[bool] = None,
               march: Optional[str] = None, workarounds: bool = True):
    if profile not in ("native", "static"): raise UnsupportedError(f"CPU profile must be native or static: {profile!r}")
    if march is not None and (type(march) is not str or march not in ("native", *ISA_LEVELS)):
      raise UnsupportedError(f"march must be None or one of {['native', *ISA_LEVELS]}, got {type(march).__name__} "
                             f"{march!r}")
    if type(workarounds) is not bool: raise UnsupportedError(f"workarounds must be a bool, got {workarounds!r}")
    self.extra_flags = check_extra_flags(extra_flags)
    self.workarounds = workarounds
    self.profile, self._threads, self._parallel, self._vector_width = profile, threads, parallel, vector_width
    self._min_work = min_parallel_work
    self._fused = fused_accumulate
    self.isa = isa_facts(march)   # CPU_MARCH: -march and the native profile's ISA facts together
    self._target: Optional[frozenset[str]] = None
    self._cc: Optional[str] = None
    super().__init__()

  @classmethod
  def availability(cls) -> tuple[bool, str]:
    return (True, "") if find_compiler() is not None else (False, "no C compiler (clang, gcc or cc) on PATH")

  def _make_renderer(self) -> Renderer:
    if self.profile == "static": return CRenderer()
    parallel = self._parallel or "pthread"
    if parallel == "openmp" and find_compiler() is not None and not openmp_flags(self.cc): parallel = "pthread"
    kw = {} if self._min_work is None else {"min_parallel_work": self._min_work}
    return NativeCRenderer(vector_width=self._vector_width, threads=self._threads, parallel=parallel,
                           fused_accumulate=self._fused, march=self.isa.march, **kw)

  @property
  def cc(self) -> str:
    if self._cc is None:
      if (cc := find_compiler()) is None: raise UnsupportedError("the CPU device needs a C compiler (clang, gcc or cc)")
      self._cc = cc
    return self._cc

  def flags(self) -> tuple[str, ...]:
    native = NATIVE_FLAGS + (openmp_flags(self.cc) if self.renderer.caps.parallel == "openmp" else ()) \
      if self.profile == "native" else ()
    fixes = workaround_flags(compiler_identity(self.cc), self.target_flags()) if self.workarounds else ()
    return BASE_FLAGS + march_flags(self.cc, self.isa.march) + native + fixes + self.extra_flags

  def target_flags(self) -> frozenset[str]:
    """The CPU flags of the ISA the binaries are built for: the host's under -march=native, else the level's."""
    if self._target is None: self._target = host_cpu_flags() if self.isa.march == "native" else self.isa.needs
    return self._target

  def compiler_id(self) -> str:
    version, _, isa = toolchain(self.cc)
    return f"{self.cc} | {version} | {' '.join(self.flags())} | {isa}"

  # -- memory: 64-byte aligned numpy byte arrays --
  def _alloc(self, nbytes: int, dtype: DType) -> np.ndarray:
    raw = np.empty(max(nbytes, 1) + 64, dtype=np.uint8)
    off = (-raw.ctypes.data) % 64
    return raw[off:off + nbytes]

  def _launch_arg(self, handle: np.ndarray) -> int: return handle.ctypes.data   # the address, as the argtypes take it
  def _copyin(self, handle: np.ndarray, src: np.ndarray) -> None: handle[:] = src.reshape(-1).view(np.uint8)
  def _copyout(self, dst: np.ndarray, handle: np.ndarray) -> None: dst.reshape(-1).view(np.uint8)[:] = handle

  # -- compile and launch --
  def so_path(self, src: str) -> str:
    """Where the shared object of src lives in the on-disk cache (its key also names this host's CPU)."""
    key = hashlib.sha256(f"{self.cache_key(src)}\0{host_cpu_id()}".encode()).hexdigest()
    return os.path.join(getconfig().cache_dir, "cpu", key + ".so")

  def _compile(self, program: Program) -> Any:
    if program.global_size is not None or program.local_size is not None:
      raise UnsupportedError(f"{program.name}: the CPU device runs no threads, but the program has "
                             f"global_size={program.global_size}, local_size={program.local_size}")
    if POOL_ABI in program.src: self._load_pool()   # a parallel kernel of the native profile
    lib = self._load(program.src, program.name)
    # unloaded once the runner is gone (the function holds the CDLL); never under OpenMP, whose runtime a kernel's
    # dlclose could unload under its parked threads, and never at exit, when a daemon thread may still run a kernel
    if _dlclose is not None and "-fopenmp" not in self.flags():
      weakref.finalize(lib, _dlclose, lib._handle).atexit = False
    try: fn = lib[program.name]   # the exported symbol, never an attribute of the CDLL object (_handle, _name)
    except AttributeError: raise CompileError(f"{program.name} is not defined by its source", "", program.src) from None
    fn.argtypes = [ctypes.c_void_p] * len(program.used_args) + [_CTYPES[a.dtype] for a in program.var_args]
    fn.restype = None
    return fn

  def _load_pool(self) -> None:
    """The process's thread pool (POOL_SOURCE), built by this device's compiler and loaded once with RTLD_GLOBAL
    before any parallel kernel: the kernels' shared objects leave its two functions (POOL_ABI) to the loader."""
    global _POOL
    if _POOL is not None: return
    with _POOL_LOCK:
      if _POOL is None: _POOL = self._load(POOL_SOURCE, "ko_pool1", ctypes.RTLD_GLOBAL)

  def _load(self, src: str, name: str, mode: int = ctypes.DEFAULT_MODE) -> ctypes.CDLL:
    """The loaded shared object of src. From the disk cache only when the cache's record of it (the sha256 of the
    source and of the binary) matches, checked before loading (a truncated file mapped in dies with SIGBUS); a
    mismatch or a load error rebuilds once, a second failure is a CompileError. Without a usable cache (DISABLE_CACHE,
    an unfit directory) the binary is built in a private temporary directory and removed once loaded."""
    folder = None if getconfig().DISABLE_CACHE else cache_subdir("cpu")
    if folder is None:
      with tempfile.TemporaryDirectory(prefix="kernopt_cpu_") as d:   # the loaded mapping outlives the file
        return self._cdll(self._build(src, os.path.join(d, "k.so"), name, record=False), name, src, mode)
    path = os.path.join(folder, os.path.basename(self.so_path(src)))
    if verified_binary("cpu_binary", path, src) is not None:
      try:
        lib = ctypes.CDLL(path, mode=mode)
        count("binary_hits")
        return lib
      except OSError: pass   # a binary for another host or libc: rebuilt below
    self._build(src, path, name)
    return self._cdll(path, name, src, mode)

  @staticmethod
  def _cdll(path: str, name: str, src: str, mode: int = ctypes.DEFAULT_MODE) -> ctypes.CDLL:
    try: return ctypes.CDLL(path, mode=mode)
    except OSError as e: raise CompileError(f"the shared object built for {name} does not load: {e}", "", src) from None

  def _build(self, src: str, path: str, name: str, record: bool = True) -> str:
    """Compile src to a temporary file beside path, rename it over path and (with record) keep its digests in the
    disk cache; returns path."""
    folder = os.path.dirname(path)
    remove_stale_tmp(folder)
    tmp = cache_tmp(path)
    try:
      # COMPILE_TIMEOUT 0, negative, inf or NaN: no limit
      limit = t if 0 < (t := getconfig().COMPILE_TIMEOUT) < math.inf else None
      try: out = _run([self.cc, *self.flags(), "-x", "c", "-", "-o", tmp, "-lm"], "compile", src, limit)
      except subprocess.TimeoutExpired:   # subprocess.run has killed the compiler
        raise CompileError(f"{self.cc} took over {limit:g} s (COMPILE_TIMEOUT) to compile {name}", "", src) from None
      if out.returncode != 0: raise CompileError(f"{self.cc} failed to compile {name}", out.stderr, src)
      with open(tmp, "rb") as f: binary = f.read()
      if not binary: raise CompileError(f"{self.cc} wrote an empty shared object for {name}", out.stderr, src)
      os.replace(tmp, path)  # atomic: a parallel process sees either no file or a complete one
      if record: record_binary("cpu_binary", path, src, binary)
    finally:
      if os.path.exists(tmp): os.unlink(tmp)
    return path

  def _launch(self, lib: Any, program: Program, handles: list[Any], var_vals: list[int],
              global_size: Optional[tuple[int, ...]], local_size: Optional[tuple[int, ...]],
              wait: bool) -> Optional[float]:
    if global_size is not None or local_size is not None:
      raise LaunchError(f"{program.name}: the CPU device takes no global/local sizes")
    # plain ints (the buffers' addresses, from _launch_arg): the function's argtypes (set at load) convert them
    args = handles + var_vals
    st = time.perf_counter()
    lib(*args)
    return time.perf_counter() - st if wait else None

DEVICE_CLASS = CPUDevice
