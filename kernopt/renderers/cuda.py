"""The CUDA C++ dialect (device "CUDA"): `extern "C" __global__` kernels with `__launch_bounds__`, blockIdx /
threadIdx for SPECIALs, `__shared__` arrays, `__syncthreads()`. half (<cuda_fp16.h>) and `__nv_bfloat16`
(<cuda_bf16.h>) are storage types: loaded into float, computed in float, each result rounded to nearest even, so
results equal ops.exec_alu's. Vectors are CUDA's builtin float4-style types or small aligned structs; tensor cores
are `mma.sync.m16n8k16` in inline PTX. Needs no CUDA header beyond those two (NVRTC-friendly).
Imports dtype, errors, renderers and uops."""
from __future__ import annotations
from dataclasses import replace
from typing import Any, Optional
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.renderers import Capabilities, TCLayout, TensorCore
from kernopt.renderers.cstyle import CStyleLanguage, dtype_of
from kernopt.uops import UOp

# the PTX m16n8k16 fragment layout, reached by a fixed Opt sequence (DESIGN.md: nothing derived from `threads`)
CUDA_TC_LAYOUT = TCLayout(upcast=(0, 2, 2), reduce=(0, 1), warp=(2, 2, 2, 2, 2), tcd=(8, 2, 4), tcd_expand=(2,) * 6,
                          perm_a=(((1, 1), (1, 0), (0, 2), (0, 3), (0, 4)),
                                  ((1, 3), (1, 4), (1, 2), (0, 0), (0, 1), (1, 5))),
                          perm_b=(((1, 1), (1, 0), (1, 5), (0, 0), (0, 1)),
                                  ((0, 4), (0, 2), (1, 4), (0, 3), (1, 3), (1, 2))))
CUDA_TC_OPTS = (("UNROLL", 2, 8), ("UNROLL", 2, 2), ("UPCAST", 0, 2), *(("LOCAL", d, 2) for d in (0, 0, 1, 1, 1)),
                ("UPCAST", 1, 2), ("MERGE", None, None))   # the last MERGE makes the fragment one upcasted axis
CUDA_TENSOR_CORES = tuple(TensorCore(dims=(8, 16, 16), dtype_in=di, dtype_out=dtypes.float,
                                     threads=((0, 2), (0, 2), (1, 2), (1, 2), (0, 2)),
                                     thread_local_sizes=((2, 2, 2), (2, 2), (2, 2)), opts=CUDA_TC_OPTS,
                                     layout=CUDA_TC_LAYOUT)
                          for di in (dtypes.half, dtypes.bfloat16))

# scalar dtype -> the base name of CUDA's builtin vector types (char4, uint2, longlong4, float4, ...)
_BUILTIN_VEC = {dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
                dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "longlong", dtypes.uint64: "ulonglong",
                dtypes.float32: "float", dtypes.float64: "double"}
_FIELDS = "xyzw"

class CUDARenderer(CStyleLanguage):
  """CUDA C++ for nvcc or NVRTC. `arch` ("sm_80") selects the tensor cores (sm_80 and later)."""
  caps = Capabilities(device="CUDA", global_max=(2147483647, 65535, 65535), local_max=(1024, 1024, 64),
                      max_local_size=1024, shared_max=49152, arch="sm_80", tensor_cores=CUDA_TENSOR_CORES)
  key_caps = ("arch", "heuristics", "sm_count")
  suffix = "cu"

  kernel_prefix = 'extern "C" __global__ '
  smem_prefix = "__shared__ __align__(16) "
  arg_int_prefix = "const int"
  barrier = "__syncthreads();"
  helper_prefix = "static __device__ __forceinline__"
  includes = ("#include <cuda_fp16.h>", "#include <cuda_bf16.h>")
  infinity = "__int_as_float(0x7f800000)"
  nan = "__int_as_float(0x7fffffff)"
  code_for_workitem = {"g": lambda d: f"blockIdx.{_FIELDS[d]}", "l": lambda d: f"threadIdx.{_FIELDS[d]}",
                       "i": lambda d: f"(blockIdx.{_FIELDS[d]}*blockDim.{_FIELDS[d]}+threadIdx.{_FIELDS[d]})"}
  type_map = {**CStyleLanguage.type_map, dtypes.int8: "signed char", dtypes.int64: "long long",
              dtypes.uint64: "unsigned long long", dtypes.bfloat16: "__nv_bfloat16"}

  def __init__(self, arch: str = "sm_80", heuristics: str = "spec", sm_count: Optional[int] = None):
    """`heuristics` "cuda_gpu" (what the CUDA device renders with) tries kernopt/heuristics_cuda.py's rules before
    the spec's; "spec" (the default: DESIGN.md's static profile) uses the spec's alone. `sm_count` (the device's
    multiprocessors) scales the profile's grid-size threshold."""
    if not arch.startswith("sm_") or not arch[3:].isdigit():
      raise UnsupportedError(f"CUDA arch must look like 'sm_80', got {arch!r}")
    if heuristics not in ("spec", "cuda_gpu"): raise UnsupportedError(f"CUDA has no heuristics {heuristics!r}")
    if sm_count is not None and sm_count < 1: raise UnsupportedError(f"CUDA sm_count must be positive, got {sm_count}")
    self.caps = replace(self.caps, arch=arch, heuristics=heuristics, sm_count=sm_count,
                        tensor_cores=CUDA_TENSOR_CORES if int(arch[3:]) >= 80 else ())

  def render_kernel(self, name: str, params: list[str], body: list[str], preamble: list[str]) -> str:
    bounds = self.workgroup_threads()
    head = "\n".join([*self.includes, *preamble])
    return f"{head}\n{self.kernel_prefix}void __launch_bounds__({bounds}) {name}({', '.join(params)}) {{\n" + \
      "\n".join(body) + "\n}\n"

  # ***** types and values *****

  def render_dtype(self, dt: DType) -> str:
    if dt.count == 1: return super().render_dtype(dt)
    scalar, n = self.vector_parts(dt)
    if scalar in _BUILTIN_VEC and n <= 4 and not (n == 3 and scalar.itemsize == 8): return f"{_BUILTIN_VEC[scalar]}{n}"
    return self._vector_struct(scalar, n)

  def _vector_struct(self, scalar: DType, n: int) -> str:
    """An aligned struct of n scalars (fields x, y, z, w or s0..sf) and its ko_make_ constructor."""
    base = _BUILTIN_VEC.get(scalar) or {dtypes.half: "half", dtypes.bfloat16: "bf16"}[scalar]
    name, t = f"ko_{base}{n}", self.type_map[scalar]
    fields = [self._field(i, n) for i in range(n)]
    align = min(16, scalar.itemsize * (n if n & (n - 1) == 0 else 4))
    self.helper(name, f"struct __align__({align}) {name} {{ {t} {', '.join(fields)}; }};")
    args, sets = ", ".join(f"{t} a{i}" for i in range(n)), " ".join(f"v.{f} = a{i};" for i, f in enumerate(fields))
    self.helper(f"make_{name}", f"{self.helper_prefix} {name} make_{name}({args}) {{ {name} v; {sets} return v; }}")
    return name

  @staticmethod
  def _field(lane: int, n: int) -> str: return _FIELDS[lane] if n <= 4 else f"s{lane:x}"

  def render_vectorize(self, dt: DType, elems: list[str]) -> str:
    name = self.render_dtype(dt)
    if dt.scalar() in self.storage_floats: elems = [self.to_storage(e, dt.scalar()) for e in elems]
    return f"make_{name}({', '.join(elems)})"

  def render_gep(self, x: str, lane: int, dt: DType) -> str:
    ret = f"{x}.{self._field(lane, dt.count)}"
    return self.from_storage(ret, dt.scalar()) if dt.scalar() in self.storage_floats else ret

  def render_const(self, val: Any, dt: DType) -> str:
    if isinstance(val, tuple): val = val[0]   # the lowerer's DEFINE_ACC arg is (initial value, accumulator number)
    return super().render_const(val, dt)

  # ***** storage floats *****

  def to_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.half: return f"__float2half_rn({x})"
    if dt == dtypes.bfloat16: return f"__float2bfloat16_rn({x})"
    return x

  def from_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.half: return f"__half2float({x})"
    if dt == dtypes.bfloat16: return f"__bfloat162float({x})"
    return x

  def round_storage(self, x: str, dt: DType) -> str: return self.from_storage(self.to_storage(f"((float){x})", dt), dt)

  def render_cast(self, x: str, src: DType, dst: DType) -> str:
    if src.count == 1 and dst in self.storage_floats and (dtypes.is_int(src) or src in (dtypes.bool, dtypes.float64)):
      conv = "__double2half" if dst == dtypes.half else "__double2bfloat16"   # one rounding, as exec_alu does
      return self.from_storage(f"{conv}((double){x})", dst)
    return super().render_cast(x, src, dst)

  def bitcast_bits(self, x: str, src: DType, dst: DType) -> str:
    s, d = self.render_dtype(src), self.render_dtype(dst)
    name = f"ko_bitcast_{self._suffix(src)}_{self._suffix(dst)}"
    body = f"{{ {d} r; memcpy(&r, &x, sizeof(r)); return r; }}"
    self.helper(name, f"{self.helper_prefix} {d} {name}({s} x) {body}")
    return f"{name}({x})"

  # ***** tensor cores *****

  def render_wmma(self, u: UOp, srcs: list[str]) -> str:
    arg = u.arg
    if (arg.dims, arg.dtype_out) != ((8, 16, 16), dtypes.float) or arg.dtype_in not in (dtypes.half, dtypes.bfloat16):
      raise UnsupportedError(f"{self.dialect_name} has no tensor core {arg.name} (dims {arg.dims}, "
                             f"{arg.dtype_in} -> {arg.dtype_out})")
    if int(self.caps.arch[3:]) < 80:
      raise UnsupportedError(f"{self.dialect_name}: {arg.name} needs sm_80, not {self.caps.arch}")
    a_t, b_t, c_t = (self.render_dtype(dtype_of(s)) for s in u.src)
    kind = "f16" if arg.dtype_in == dtypes.half else "bf16"
    name = f"ko_mma_m16n8k16_{kind}_f32"
    regs = "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3}"
    self.helper(name, "\n".join([
      f"{self.helper_prefix} {c_t} {name}({a_t} a, {b_t} b, {c_t} c) {{",
      "  unsigned ra[4], rb[2];   // two 16-bit inputs per 32-bit register, lower index in the low half",
      "  memcpy(ra, &a, sizeof(ra)); memcpy(rb, &b, sizeof(rb));",
      f'  asm("mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32 {regs};"',
      '      : "+f"(c.x), "+f"(c.y), "+f"(c.z), "+f"(c.w)',
      '      : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));',
      "  return c;", "}"]))
    return f"{name}({', '.join(srcs)})"
