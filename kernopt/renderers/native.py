"""The native profile of the C dialect: `NativeCRenderer` is `CRenderer` configured for the host CPU (vector width
from the ISA, thread count, raised upcast limit). Its capabilities ask for kernopt/passes' CPU pipeline (lane packing
into GCC vector ops, loop interchange, reduce blocking, panel packing, the parallel loop, non-temporal stores); it
spells what those passes marked: the parallel loop split across threads (OpenMP, or a pthread pool rendered into the
kernel), a blocked reduce, non-temporal stores. Every departure from the static C profile is listed in docs/cpu.md.
Imports dtype, errors, helpers, ops, uops and renderers."""
from __future__ import annotations
import functools
import operator
import os
import platform
from dataclasses import dataclass, field, replace
from typing import Any, Optional
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.helpers import getconfig
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps
from kernopt.renderers import Capabilities
from kernopt.renderers.cstyle import CRenderer, RenderContext
from kernopt.renderers.exp2_c import exp2_helper
from kernopt.renderers.x86_helpers import DEINT8, fma_helper, MASKLOAD, mload_helper, mstore_helper, stream_helper
from kernopt.uops import Mark, ReduceBlock, UOp, UOps, loop_mark

PARALLEL_MODES = ("pthread", "openmp", "none")
# ALU ops + bytes moved below which a kernel runs on one thread: starting workers costs more than it saves
MIN_PARALLEL_WORK = 1 << 20
# the L2 per core that REDUCE_BLOCK and PANEL_ELEMENTS were measured on (Zen 3); a host's own scales both
BASE_L2 = 512 << 10
# reduce steps per block when a matmul-like kernel's reduce is split (reduce blocking): its B panel then stays in L2
REDUCE_BLOCK = 256
# a loop-free-but-one elementwise kernel storing at least this many float32 elements writes them with non-temporal
# stores (its output is bigger than the caches and written once: no read-for-ownership of every line)
STREAM_MIN = 1 << 22
# a packed B panel of at most this many elements (128 KiB of float32: a 512^3 matmul's whole K x 16 panel)
PANEL_ELEMENTS = 32768
# an L2 size read from sysfs is taken only inside these bounds (a VM may report anything)
L2_BOUNDS = (256 << 10, 4 << 20)
# chunks per thread of a collapsed parallel loop (a plain one gets 4: matmul 1024^3's 64 panels in 32 chunks measured
# 1.5x on 2 threads against 1.7x in 8)
CHUNKS_PER_THREAD = 16

@functools.lru_cache(None)
def host_cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
  """The first CPU's feature flags (x86 "flags", ARM "Features"); empty when unreadable."""
  try:
    with open(cpuinfo) as f: text = f.read()
  except OSError: return frozenset()
  for line in text.splitlines():
    if line.startswith(("flags", "Features")): return frozenset(line.split(":", 1)[1].split())
  return frozenset()

def host_vector_width(cpuinfo: str = "/proc/cpuinfo") -> int:
  """fp32 lanes of the widest vector unit the host has: 16 with AVX-512F, 8 with AVX2, else 4 (SSE/NEON)."""
  flags = host_cpu_flags(cpuinfo)
  return 16 if "avx512f" in flags else 8 if "avx2" in flags else 4

def host_has_fma(cpuinfo: str = "/proc/cpuinfo") -> bool:
  """Whether the host fuses multiply-add in hardware (x86 FMA3; every AArch64 core), so fmaf is one instruction."""
  return "fma" in host_cpu_flags(cpuinfo) or platform.machine().lower() in ("aarch64", "arm64")

@functools.lru_cache(None)
def host_l2_bytes(sysfs: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
  """The first core's L2 (its unified or data cache of level 2) in bytes, from sysfs; BASE_L2 when unreadable or
  outside L2_BOUNDS."""
  try:
    for index in sorted(os.listdir(sysfs)):
      def read(name: str) -> str:
        with open(os.path.join(sysfs, index, name)) as f: return f.read().strip()
      if not index.startswith("index") or read("level") != "2" or read("type") not in ("Unified", "Data"): continue
      size = read("size")
      n = int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]] if size[-1:] in ("K", "M") else int(size)
      return n if L2_BOUNDS[0] <= n <= L2_BOUNDS[1] else BASE_L2
  except (OSError, ValueError): pass
  return BASE_L2

def blocking(l2_bytes: int) -> tuple[int, int]:
  """(reduce_block, panel_elements) for an L2 of l2_bytes: REDUCE_BLOCK and PANEL_ELEMENTS scaled from BASE_L2 (a
  power-of-two multiple of it, rounded down, at least a quarter). On a 1 MiB L2 (AMD Zen 4) matmul 1024^3 then runs
  unblocked with its whole 1024 x 64 panel packed: 1 thread 107 -> 110 GF/s, 1000x999x1000 106 -> 109, 2048^3
  92 -> 98 (alternated runs)."""
  scale = max(1, l2_bytes * 4 // BASE_L2)
  scale = 1 << (scale.bit_length() - 1)
  return REDUCE_BLOCK * scale // 4, PANEL_ELEMENTS * scale // 4

# inline-asm register class of the host's vector registers (None: loads are not pinned)
_VECTOR_REG = {"x86_64": "x", "amd64": "x", "i686": "x", "aarch64": "w", "arm64": "w"}
# the vector ALU's common ops as module constants: an attribute of an Enum class costs ~0.1 us on Python 3.11
_F32, _MULACC, _ADD, _MUL = dtypes.float32, TernaryOps.MULACC, BinaryOps.ADD, BinaryOps.MUL

@dataclass(frozen=True)
class IsaFacts:
  """What the native profile knows of its target ISA: the C compiler's `-march`, fp32 lanes of one vector register,
  whether multiply-add is fused in hardware, and the host flags a binary for it needs (else it dies of SIGILL)."""
  march: str
  vector_width: int
  fma: bool
  needs: frozenset[str] = frozenset()

# CPU_MARCH levels, so one host can run the suite as an SSE4-, AVX2- or AVX-512-only host would
ISA_LEVELS = {
  "x86-64-v2": IsaFacts("x86-64-v2", 4, False, frozenset({"sse4_2", "popcnt"})),
  "x86-64-v3": IsaFacts("x86-64-v3", 8, True, frozenset({"avx2", "fma", "bmi2"})),
  "x86-64-v4": IsaFacts("x86-64-v4", 16, True, frozenset({"avx512f", "avx512bw", "avx512dq", "avx512vl"})),
}

def isa_facts(march: Optional[str] = None, cpuinfo: str = "/proc/cpuinfo") -> IsaFacts:
  """The facts for `march` (default: the CPU_MARCH knob, else "native": the host's own ISA); a level the host cannot
  run is an UnsupportedError naming the missing flags."""
  march = march or getconfig().CPU_MARCH or "native"
  if march == "native": return IsaFacts("native", host_vector_width(cpuinfo), host_has_fma(cpuinfo))
  if (facts := ISA_LEVELS.get(march)) is None:
    raise UnsupportedError(f"CPU_MARCH={march!r} is not one of {['native', *ISA_LEVELS]}")
  if platform.machine().lower() not in ("x86_64", "amd64"):
    raise UnsupportedError(f"CPU_MARCH={march!r} is an x86-64 level; this host is {platform.machine()}")
  if missing := facts.needs - host_cpu_flags(cpuinfo):
    raise UnsupportedError(f"CPU_MARCH={march!r} needs {sorted(missing)}, which this host lacks: its binaries would "
                           f"stop with SIGILL")
  return facts

def host_threads() -> int:
  """The cores this process may run on."""
  try: return len(os.sched_getaffinity(0))
  except (AttributeError, OSError): return os.cpu_count() or 1

MAX_THREADS = 256

@functools.lru_cache(None)
def thread_limit() -> int:
  """The most worker threads a kernel may start: MAX_THREADS, or fewer when the OS allows fewer (threads-max, the
  soft RLIMIT_NPROC)."""
  limit = MAX_THREADS
  try:
    with open("/proc/sys/kernel/threads-max") as f: limit = min(limit, int(f.read()))
  except (OSError, ValueError): pass
  try:
    import resource
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft != resource.RLIM_INFINITY and soft > 0: limit = min(limit, soft)
  except (ImportError, AttributeError, OSError, ValueError): pass
  return max(limit, 1)

def _check_threads(n: Any) -> int:
  if isinstance(n, bool) or not hasattr(type(n), "__index__"):
    raise UnsupportedError(f"threads must be an int in [1, {MAX_THREADS}], got {type(n).__name__} {n!r}")
  n, limit = operator.index(n), thread_limit()
  if not 1 <= n <= limit:
    why = "" if limit == MAX_THREADS else f" (this OS allows {limit} of the at most {MAX_THREADS})"
    raise UnsupportedError(f"threads must be an int in [1, {limit}]{why}, got {n}")
  return n

def native_capabilities(vector_width: Optional[int] = None, threads: Optional[int] = None, parallel: str = "pthread",
                        min_parallel_work: int = MIN_PARALLEL_WORK, fused_accumulate: Optional[bool] = None,
                        march: Optional[str] = None, isa: Optional[IsaFacts] = None,
                        l2_bytes: Optional[int] = None) -> Capabilities:
  """The native profile's record: the static C profile's, filled in from the host. `isa` (a target other than this
  host: no host check; default: isa_facts(march)) gives the ISA, the default vector width and whether float32 SUMs of
  products fuse (MULACC in one rounding, as BLAS does); `threads` defaults to CPU_THREADS, else the cores the process
  may use, and one thread runs with `parallel` "none"; `l2_bytes` (default: the host's) sizes the reduce blocks and
  packed panels (blocking)."""
  if type(parallel) is not str or parallel not in PARALLEL_MODES:
    raise UnsupportedError(f"parallel must be one of {PARALLEL_MODES}, got {parallel!r}")
  if type(min_parallel_work) is not int or min_parallel_work < 0:
    raise UnsupportedError(f"min_parallel_work must be a non-negative int, got {min_parallel_work!r}")
  if fused_accumulate is not None and type(fused_accumulate) is not bool:
    raise UnsupportedError(f"fused_accumulate must be None or a bool, got {fused_accumulate!r}")
  isa = isa if isa is not None else isa_facts(march)
  width = vector_width if vector_width is not None else isa.vector_width
  if type(width) is not int or not 1 <= width <= 64 or width & (width - 1):
    raise UnsupportedError(f"vector_width must be a power of two in [1, 64], got {width!r}")
  n = _check_threads(threads if threads is not None else (getconfig().CPU_THREADS or host_threads()))
  if l2_bytes is not None and (type(l2_bytes) is not int or not L2_BOUNDS[0] <= l2_bytes <= L2_BOUNDS[1]):
    raise UnsupportedError(f"l2_bytes must be an int in [{L2_BOUNDS[0]}, {L2_BOUNDS[1]}], got {l2_bytes!r}")
  reduce_block, panel_elements = blocking(l2_bytes if l2_bytes is not None else host_l2_bytes())
  # pin_loads: vector loads pinned to a register (an empty asm), so GCC reads each once instead of folding it into
  # every op; masked_loads: a padded conv's contiguous gated input as one masked vector load; split_borders: its
  # interior as a copy with plain loads (rule cpu.padded_interior, passes/borders.py); deinterleave: a stride-2
  # window row as two vector loads and a shuffle (pinned, gcc shuffles them instead of reloading lanes);
  # stream_stores: big elementwise outputs written with non-temporal stores (`streams`), fenced before the kernel
  # returns
  # max_upcast: a matmul tile of two vectors, of four where 32 vector registers hold 16 accumulators (width 16)
  return replace(CRenderer.caps, heuristics="cpu_native", vector_width=width,
                 max_upcast=max(8, (4 if width >= 16 else 2) * width),
                 march=isa.march, isa_vector_width=isa.vector_width, threads=n, parallel=parallel if n > 1 else "none",
                 schedule="static", min_parallel_work=min_parallel_work, interchange=True,
                 pin_loads=_VECTOR_REG.get(platform.machine().lower()), masked_loads=True, masked_stores=True,
                 split_borders=True,
                 deinterleave=True, reduce_block=reduce_block, panel_elements=panel_elements, stream_stores=True,
                 stream_min=STREAM_MIN,
                 fused_accumulate=isa.fma if fused_accumulate is None else fused_accumulate)

def _native_exp2(r: Any, dt: DType, x: str) -> str:
  if not dtypes.is_float(dt): raise UnsupportedError(f"{r.dialect_name} has no exp2 on {dt}")
  if dt != dtypes.float32: return f"exp2{r.math_suffix(dt)}({x})"   # double: libm
  fma = "fmaf" if r.caps.fused_accumulate else None
  return f"{r.helper('ko_exp2f', exp2_helper('ko_exp2f', 'float', 'int32_t', 1, fma))}({x})"

class NativeCRenderer(CRenderer):
  """CRenderer for this host, its record `native_capabilities(...)` of the same arguments: `vector_width` fp32 lanes,
  `threads` workers, `parallel` in PARALLEL_MODES; kernels estimated below `min_parallel_work` (ALU ops + bytes) run
  on one thread; `fused_accumulate` (default: whether the ISA has FMA) makes float32 SUMs of products accumulate in
  one rounding (MULACC). Its heuristics profile is "cpu_native" (heuristics_cpu)."""
  key_caps = ("march", "isa_vector_width", "vector_width", "threads", "parallel", "min_parallel_work", "interchange",
              "pin_loads", "masked_loads", "masked_stores", "split_borders", "deinterleave", "reduce_block",
              "panel_elements", "stream_stores")
  # float32 exp2 is kernopt's own (renderers/exp2_c.py), scalar and vector alike
  code_for_op = {**CRenderer.code_for_op, UnaryOps.EXP2: _native_exp2}

  def __init__(self, vector_width: Optional[int] = None, threads: Optional[int] = None, parallel: str = "pthread",
               min_parallel_work: int = MIN_PARALLEL_WORK, fused_accumulate: Optional[bool] = None,
               march: Optional[str] = None, isa: Optional[IsaFacts] = None, l2_bytes: Optional[int] = None):
    self.caps = native_capabilities(vector_width, threads, parallel, min_parallel_work, fused_accumulate, march, isa,
                                    l2_bytes)

  def __repr__(self) -> str:
    c = self.caps
    return f"NativeCRenderer(vector_width={c.vector_width}, threads={c.threads}, parallel={c.parallel!r})"

  # ***** vector ALU (GCC vector extensions; lanes compute exactly the scalar op) *****

  def render_alu(self, op: Any, dt: DType, srcs: list[str]) -> str:
    if dt.count == 1: return super().render_alu(op, dt, srcs)
    if (s := dt.scalar()) is not _F32 and s != _F32:
      raise UnsupportedError(f"{self.dialect_name} has no vector ALU on {dt}")
    if op is _MULACC: return f"{self._fma(dt)}({srcs[0]}, {srcs[1]}, {srcs[2]})"
    if op is _ADD: return f"({srcs[0]}+{srcs[1]})"
    if op is _MUL: return f"({srcs[0]}*{srcs[1]})"
    if op is BinaryOps.IDIV: return f"({srcs[0]}/{srcs[1]})"   # IEEE per lane (no -ffast-math: never a reciprocal)
    if op is UnaryOps.NEG: return f"(-{srcs[0]})"
    if op is BinaryOps.MAX:
      vt, it = self.render_dtype(dt), self.render_dtype(dtypes.int32.vec(dt.count))
      name = f"ko_max_{vt}"
      # a > b ? a : b per lane (NaN compares false and picks b), as the scalar spelling
      self.helper(name, f"static inline {vt} {name}({vt} a, {vt} b) {{ {it} m = (a > b); "
                        f"return ({vt})((m & ({it})a) | (~m & ({it})b)); }}")
      return f"{name}({srcs[0]}, {srcs[1]})"
    if op is UnaryOps.EXP2:
      vt, it = self.render_dtype(dt), self.render_dtype(dtypes.int32.vec(dt.count))
      fma = self._fma(dt) if self.caps.fused_accumulate else None
      return f"{self.helper(f'ko_exp2_{vt}', exp2_helper(f'ko_exp2_{vt}', vt, it, dt.count, fma))}({srcs[0]})"
    raise UnsupportedError(f"{self.dialect_name} has no vector {op.name}")

  def _fma(self, dt: DType) -> str:
    """The name of the lane-wise fused multiply-add on vector dt (fma_helper), registered with this render."""
    name = f"ko_fma_{self.render_dtype(dt)}"
    self.helper(name, fma_helper(name, self.render_dtype(dt), dt.count))
    return name

  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType) -> str:
    if dt.count == 1 or not self._pinnable(dt): return super().render_load(buf, idx, dt, buf_dt)
    vt = self.render_dtype(dt)
    name = f"ko_vload_reg_{vt}"
    # the empty asm makes the value opaque: GCC can't re-read memory for each use (8 folded loads per 4x2 tile step
    # instead of 2 made the matmul load-port bound)
    self.helper(name, f"static inline {vt} {name}(const void* p) {{ {vt} v; memcpy(&v, p, sizeof(v)); "
                      f"__asm__(\"\" : \"+{self.caps.pin_loads}\"(v)); return v; }}")
    return f"{name}({buf}+{idx})"

  def _pinnable(self, dt: DType) -> bool:
    """Whether a dt vector fits one register of the target ISA, so the pinning asm's constraint can be met (a pinned
    vector_width wider than the ISA's registers is split by the compiler, and is not pinned)."""
    return self.caps.pin_loads is not None and dt.count * dt.scalar().itemsize <= 4 * self.caps.isa_vector_width

  # ***** threads and the passes' marks *****

  def render_context(self, uops: list[UOp]) -> NativeContext:
    return native_context(uops, self.caps.parallel)

  def _context(self) -> NativeContext:
    ctx = self.context
    return ctx if isinstance(ctx, NativeContext) else NativeContext()

  def render_range(self, u: UOp, var: str, start: str, end: str) -> list[str]:
    ctx = self._context()
    it = self.render_dtype(u.dtype or dtypes.int32)   # int64_t where the lowerer found int32 indices not enough
    if (block := ctx.blocks.get(u)) is not None:
      b, steps = ctx.names[block[0]], block[1]
      return [f"for ({it} {var} = {b}*{steps}; {var} < {b}*{steps} + {steps}; {var}++) {{"]
    if u is ctx.inner and ctx.loop is not None:
      flat = f"{ctx.names[ctx.loop]}_f"
      return [f"{{ {it} {var} = ({it})({start}) + ({it})({flat} % (int64_t)(({end}) - ({start})));"]
    if u is not ctx.loop: return super().render_range(u, var, start, end)
    if self.caps.parallel == "openmp":
      return [f"#pragma omp parallel for schedule({self.caps.schedule}) num_threads({self.caps.threads})",
              f"for ({it} {var} = {start}; {var} < {end}; {var}++) {{"]
    # pthread pool: workers (and the launching thread) claim chunks of iterations until none is left
    n, c, chunk, chunks = f"{var}_n", f"{var}_c", f"{var}_chunk", self.chunks(ctx)
    if ctx.inner is not None:
      f = f"{var}_f"
      m = f"(int64_t)({ctx.inner.src[1].arg} - {ctx.inner.src[0].arg})"
      return [f"int64_t {n} = ((int64_t)({end}) - (int64_t)({start})) * {m};",
              f"int64_t {chunk} = ({n} + {chunks - 1}) / {chunks};",
              f"for (int {c} = ko_pool1_claim(ko_ctx); {c} >= 0; {c} = ko_pool1_claim(ko_ctx)) "
              f"for (int64_t {f} = {c}*{chunk}; {f} < {n} && {f} < ({c}+1)*{chunk}; {f}++) {{ "
              f"{it} {var} = ({it})({start}) + ({it})({f} / {m});"]
    return [f"int64_t {n} = (int64_t)({end}) - (int64_t)({start});",
            f"int64_t {chunk} = ({n} + {chunks - 1}) / {chunks};",
            f"for (int {c} = ko_pool1_claim(ko_ctx); {c} >= 0; {c} = ko_pool1_claim(ko_ctx)) "
            f"for ({it} {var} = ({it})({start} + {c}*{chunk}); "
            f"{var} < {end} && {var} < {start} + ({c}+1)*{chunk}; {var}++) {{"]

  def chunks(self, ctx: NativeContext) -> int:
    """Chunks the parallel loop is cut into, claimed dynamically: finer when it is collapsed with the next loop."""
    return (CHUNKS_PER_THREAD if ctx.inner is not None else 4) * self.caps.threads

  def render_local(self, name: str, dt: DType, size: int) -> str:
    return f"{self.render_dtype(dt)} {name}[{size}] __attribute__((aligned(64)));"

  def render_masked_store(self, buf: str, idx: str, val: str, mask: str, dt: DType) -> str:
    if dt.scalar() != dtypes.float32: raise UnsupportedError(f"no masked store of {dt}")
    name = f"ko_mstore_{self.render_dtype(dt)}"
    self.helper(name, mstore_helper(name, self.render_dtype(dt), dt.count))
    return f"{name}({buf}, {idx}, {val}, {mask});"

  def render_masked_load(self, buf: str, idx: str, mask: str, dt: DType) -> str:
    """A vector of dt.count contiguous elements from buf[idx], lane l read only where bit l of mask is set (+0.0
    elsewhere): one vector load when every lane is open (a padded conv's interior), else lane by lane."""
    vt, st, n = self.render_dtype(dt), self.render_dtype(dt.scalar()), dt.count
    name = f"ko_mload_{vt}"
    pin = f' __asm__("" : "+{self.caps.pin_loads}"(v));' if self._pinnable(dt) else ""
    decl = f"static inline {vt} {name}(const {st}* b, int32_t i, int32_t m) {{ {vt} v;"
    fast = f"if (m == {(1 << n) - 1}) {{ memcpy(&v, b + i, sizeof(v));{pin} return v; }}"
    loop = f"for (int l = 0; l < {n}; l++) v[l] = (m >> l) & 1 ? b[i + l] : 0.0f; return v;"
    self.helper(name, mload_helper(decl, fast, loop, vt, n) if dt.scalar() == dtypes.float32 and n in MASKLOAD
                else f"{decl} {fast} {loop} }}")
    return f"{name}({buf}, {idx}, {mask})"

  def render_shuffle(self, dt: DType, picks: list[tuple[str, int]]) -> Optional[str]:
    """The even lanes of a and the odd lanes of b (a stride-2 window row, passes/deinterleave.py) at 8 floats: AVX2's
    vshufps + vpermpd through ko_deint_float8, where gcc 12 spells the lanes as two lane-crossing vpermd and a blend
    (conv 8x16x32x32 stride 2, 1 thread, Zen 1: 1.22 -> 1.09 ms). gcc spells 4 and 16 lanes in one shuffle itself."""
    if dt.count != 8 or dt.scalar() != dtypes.float32 or len({v for v, _ in picks}) != 2: return None
    a, b = picks[0][0], picks[4][0]
    if picks != [(a, 0), (a, 2), (a, 4), (a, 6), (b, 1), (b, 3), (b, 5), (b, 7)]: return None
    vt = self.render_dtype(dt)
    self.helper("ko_deint_float8", DEINT8.format(vt=vt))
    return f"ko_deint_float8({a}, {b})"

  def render_nontemporal_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType) -> str:
    if dt.count != self.caps.vector_width or dt.scalar() != dtypes.float32:
      return self.render_store(buf, idx, val, dt, buf_dt)
    vt = self.render_dtype(dt)
    name = f"ko_stream_{vt}"
    self.helper(name, stream_helper(name, vt, dt.count))
    return f"{name}({buf}+{idx}, {val});"

  def render_kernel(self, name: str, params: list[str], body: list[str], preamble: list[str]) -> str:
    # non-temporal stores are fenced before the work is reported done: here at the end of a serial kernel, in the
    # pool by each thread before it reports a chunk (POOL_SOURCE's ko_report)
    ctx = self._context()
    pool = ctx.loop is not None and self.caps.parallel == "pthread"
    if ctx.stream and not pool: body = body + ["  ko_stream_fence();"]
    if not pool: return super().render_kernel(name, params, body, preamble)
    return _pthread_kernel(self, ctx, name, params, body, preamble)

# The pthread pool: one per process, shared by every parallel kernel (POOL_SOURCE, built and loaded once by the CPU
# device; kernels declare POOL_ABI and call it). Workers spin for POOL_SPIN_NS after a launch (unless the pool has
# more threads than the host has CPUs), then sleep on a condition variable until the next; a launch
# publishes a job under a new generation, runs chunks itself and waits only for chunks other workers have claimed,
# never for a worker that has not woken (on a busy machine the launching thread may do all the work). Claims carry
# the generation, so a late worker can't take a chunk of a later launch. A worker claims its first chunk before it
# runs the job and reports that chunk only after the job returns: the job's code before the loop (hoisted loads) and
# after it reads the launcher's arguments, which live only until the launch has every chunk reported. Launches of
# all kernels are serialized (each uses every worker); the pool grows to the largest thread count asked for.
POOL_ABI = """typedef struct { long long gen; int have, first, chunks; } ko_ctx_t;
extern void ko_pool1_launch(void (*fn)(void*, ko_ctx_t*), void* args, int chunks, int threads);
extern int ko_pool1_claim(ko_ctx_t* c);"""

# how long a worker spins for the next launch before it sleeps: waking a sleeping thread took up to 0.2 ms on a VM, per
# launch (conv_64x56 on 2 threads, AMD EPYC Zen 4, 4 alternated processes: medians 1.23-1.47 ms sleeping at once,
# 1.22-1.28 spinning); libgomp and OpenBLAS spin for longer
POOL_SPIN_NS = 100_000

POOL_SOURCE = """#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
""" + POOL_ABI.replace("extern ", "") + """
typedef struct { void (*fn)(void*, ko_ctx_t*); void* args; int chunks, spin; } ko_job_t;
static pthread_mutex_t ko_mu = PTHREAD_MUTEX_INITIALIZER, ko_launch_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ko_cv = PTHREAD_COND_INITIALIZER;
static ko_job_t ko_job;
static long long ko_gen, ko_state;
#define KO_SPIN_NS """ + str(POOL_SPIN_NS) + """LL
static int ko_done, ko_workers, ko_cpus = 1 << 30;
#ifdef __linux__
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#define ko_sleep(p, v) syscall(SYS_futex, (p), FUTEX_WAIT_PRIVATE, (v), 0, 0, 0)
#define ko_wake(p) syscall(SYS_futex, (p), FUTEX_WAKE_PRIVATE, 1, 0, 0, 0)
#else
#define ko_sleep(p, v) sched_yield()
#define ko_wake(p) ((void)0)
#endif
#if defined(__x86_64__) || defined(__i386__)
#define ko_pause() __builtin_ia32_pause()
#define ko_fence() __builtin_ia32_sfence()
#else
#define ko_pause() __asm__ __volatile__("" ::: "memory")
#define ko_fence() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#endif
/* 1 when a launch after generation seen comes within KO_SPIN_NS, else 0 (the worker then sleeps) */
static int ko_spin(long long seen) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 1;; i++) {
    if (__atomic_load_n(&ko_gen, __ATOMIC_ACQUIRE) != seen) return 1;
    ko_pause();
    if ((i & 63) == 0) {
      clock_gettime(CLOCK_MONOTONIC, &t);
      if ((t.tv_sec - t0.tv_sec) * 1000000000LL + (t.tv_nsec - t0.tv_nsec) > KO_SPIN_NS) return 0;
    }
  }
}
static int ko_take(long long gen, int chunks) {
  long long s = __atomic_load_n(&ko_state, __ATOMIC_ACQUIRE);
  while ((s >> 24) == gen && (s & 0xFFFFFF) < chunks)
    if (__atomic_compare_exchange_n(&ko_state, &s, s + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      return (int)(s & 0xFFFFFF);
  return -1;
}
/* a chunk's non-temporal stores are fenced by the thread that made them before it reports the chunk done */
static void ko_report(int chunks) {
  ko_fence(); if (__atomic_add_fetch(&ko_done, 1, __ATOMIC_SEQ_CST) == chunks) ko_wake(&ko_done);
}
int ko_pool1_claim(ko_ctx_t* c) {
  if (c->first >= 0) { int k = c->first; c->first = -1; return k; }
  if (c->have) ko_report(c->chunks);
  int k = ko_take(c->gen, c->chunks);
  c->have = k >= 0;
  return k;
}
static void* ko_worker(void* unused) {
  long long seen = 0;
  int spin = 0;
  for (;;) {
    if (spin) ko_spin(seen);
    pthread_mutex_lock(&ko_mu);
    while (ko_gen == seen) pthread_cond_wait(&ko_cv, &ko_mu);
    seen = ko_gen;
    ko_job_t job = ko_job;
    pthread_mutex_unlock(&ko_mu);
    spin = job.spin;
    ko_ctx_t c = {seen, 0, ko_take(seen, job.chunks), job.chunks};
    if (c.first < 0) continue;
    job.fn(job.args, &c);
    ko_report(job.chunks);
  }
  return unused;
}
/* fork: the child gets the pool's locks free and no workers (its next launch starts its own); fork waits for a launch
   in flight on another thread, whose locks the child would otherwise inherit held */
static void ko_prefork(void) { pthread_mutex_lock(&ko_launch_mu); pthread_mutex_lock(&ko_mu); }
static void ko_parent(void) { pthread_mutex_unlock(&ko_mu); pthread_mutex_unlock(&ko_launch_mu); }
static void ko_child(void) {
  ko_workers = 0;
  pthread_cond_init(&ko_cv, 0);
  pthread_mutex_unlock(&ko_mu); pthread_mutex_unlock(&ko_launch_mu);
}
__attribute__((constructor)) static void ko_pool_init(void) {
  pthread_atfork(ko_prefork, ko_parent, ko_child);
#ifdef _SC_NPROCESSORS_ONLN
  if (sysconf(_SC_NPROCESSORS_ONLN) > 0) ko_cpus = (int)sysconf(_SC_NPROCESSORS_ONLN);
#endif
}
void ko_pool1_launch(void (*fn)(void*, ko_ctx_t*), void* args, int chunks, int threads) {
  pthread_mutex_lock(&ko_launch_mu);
  for (; ko_workers < threads - 1; ko_workers++) {
    pthread_t th;
    if (pthread_create(&th, 0, ko_worker, 0) != 0) break;
    pthread_detach(th);
  }
  pthread_mutex_lock(&ko_mu);
  /* a pool of more threads than CPUs doesn't spin: every worker is woken, and spinners would take the CPUs of the
     threads with work (once some launch grew it past them: a later 2-thread launch's p90 0.11 -> 0.4 ms) */
  ko_job = (ko_job_t){fn, args, chunks, ko_workers < ko_cpus};
  __atomic_store_n(&ko_done, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&ko_gen, ko_gen + 1, __ATOMIC_RELEASE);   /* read by spinning workers outside ko_mu */
  __atomic_store_n(&ko_state, ko_gen << 24, __ATOMIC_RELEASE);
  pthread_cond_broadcast(&ko_cv);
  pthread_mutex_unlock(&ko_mu);
  ko_ctx_t c = {ko_gen, 0, -1, chunks};
  fn(args, &c);
  int d;
  for (int spin = 0; (d = __atomic_load_n(&ko_done, __ATOMIC_ACQUIRE)) < chunks; spin++)
    if (spin >= 2048) ko_sleep(&ko_done, d); else ko_pause();
  pthread_mutex_unlock(&ko_launch_mu);
}
"""

def _pthread_kernel(r: NativeCRenderer, ctx: NativeContext, name: str, params: list[str], body: list[str],
                    preamble: list[str]) -> str:
  """The body as `static void name_part(params, ko_ctx_t* ko_ctx)`; `name` packs its arguments and hands
  name_part to the process's pool (POOL_SOURCE, declared by POOL_ABI)."""
  names = [p.split()[-1] for p in params]
  fields = "".join(f" {p.replace(' restrict', '')};" for p in params)
  head = "\n".join([*r.includes, *preamble, POOL_ABI])
  part = f"static void {name}_part({', '.join(params + ['ko_ctx_t* ko_ctx'])}) {{\n" + "\n".join(body) + "\n}\n"
  args = ", ".join([f"a->{n}" for n in names] + ["c"])
  thr = (f"struct {name}_args {{{fields} }};\n"
         f"static void {name}_job(void* p, ko_ctx_t* c) {{ struct {name}_args* a = p; {name}_part({args}); }}\n")
  main = (f"{r.kernel_prefix}void {name}({', '.join(params)}) {{\n"
          f"  struct {name}_args a = {{{', '.join(names)}}};\n"
          f"  ko_pool1_launch({name}_job, &a, {r.chunks(ctx)}, {r.caps.threads});\n}}\n")
  return f"{head}\n{part}{thr}{main}"

# ***** the render context: the passes' marks, found in the final list *****

@dataclass
class NativeContext(RenderContext):
  """A native render's schedule, read from the passes' marks: the PARALLEL loop split across threads (`loop`), the
  loop directly inside it split with it (`inner`, see collapsed_loop), each blocked reduce RANGE -> (its block RANGE,
  steps), and whether any store is non-temporal (`stream`: then the kernel fences them)."""
  loop: Optional[UOp] = None
  inner: Optional[UOp] = None
  blocks: dict[UOp, tuple[UOp, int]] = field(default_factory=dict)
  stream: bool = False

def native_context(uops: list[UOp], parallel: str) -> NativeContext:
  """The context a native render of uops spells in, under threading mode `parallel` (PARALLEL_MODES)."""
  loop: Optional[UOp] = None
  blocks: dict[UOp, tuple[UOp, int]] = {}
  stream = False
  RANGE, STORE = UOps.RANGE, UOps.STORE
  for u in uops:
    if u.op is RANGE and (m := loop_mark(u)) is not None:
      if m is Mark.PARALLEL and loop is None and parallel != "none": loop = u
      elif isinstance(m, ReduceBlock): blocks[m.of] = (u, m.steps)
    elif u.op is STORE and u.arg is Mark.NONTEMPORAL: stream = True
  inner = collapsed_loop(uops, loop) if loop is not None and parallel == "pthread" else None
  return NativeContext(loop=loop, inner=inner, blocks=blocks, stream=stream)

# what may sit between two loops split as one: index math, and the CASTs of a lane mask's gates
_INDEX_MATH = (UOps.ALU, UOps.CONST, UOps.CAST)

def collapsed_loop(uops: list[UOp], rng: UOp) -> Optional[UOp]:
  """The loop directly inside parallel loop rng that the pthread pool splits together with it (one flat index over
  both), so a short outer loop (conv's 16 channel tiles) still gives every thread many small chunks: a non-reduce
  RANGE with constant bounds, only index math between the two, closed right before rng, and not a reduce block
  (whose iterations depend on each other through memory)."""
  if any(s.op is not UOps.CONST for s in rng.src): return None
  i0 = uops.index(rng)
  i1 = next((i for i in range(i0 + 1, len(uops)) if uops[i].op not in _INDEX_MATH), None)
  if i1 is None or uops[i1].op is not UOps.RANGE: return None
  inner = uops[i1]
  if inner.arg[1] or any(s.op is not UOps.CONST for s in inner.src): return None
  if isinstance(loop_mark(inner), ReduceBlock): return None
  ends = [i for i, u in enumerate(uops) if u.op is UOps.ENDRANGE and u.src[0] in (rng, inner)]
  if len(ends) != 2 or uops[ends[0]].src[0] is not inner or ends[1] != ends[0] + 1: return None
  return inner
