"""The OpenCL C dialect (device "OPENCL") on the C-style base: `__kernel` functions over `__global` buffers,
work-group ids for SPECIALs, `__local` arrays and barriers, vectors through vloadN/vstoreN and `(float4)(...)`,
images through read_imagef/write_imagef. Without cl_khr_fp16, half is a storage type (vload_half /
vstore_half_rte, math in float, each result rounded to half); bfloat16 is a ushort bit pattern; bool buffers
are uchar. The device profile of a CPU OpenCL device (PoCL) has its upcast lanes packed into vector ops by
kernopt/passes/vectorize and chooses its Opts with heuristics_opencl. Imports dtype, errors, ops, uops and renderers."""
from __future__ import annotations
from dataclasses import dataclass, field, replace
from typing import Any, Optional
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import ALUOp, BinaryOps, TernaryOps, UnaryOps
from kernopt.renderers import Capabilities
from kernopt.renderers.cstyle import CStyleLanguage, RenderContext, workgroup_size
from kernopt.uops import Mark, UOp, UOps

_SAMPLER = "__constant sampler_t smp = CLK_NORMALIZED_COORDS_FALSE | CLK_ADDRESS_CLAMP | CLK_FILTER_NEAREST;"
_HELPERS = {
  "ko_round_half": "float ko_round_half(float x) { ushort h; vstore_half_rte(x, 0, (__private half*)&h); "
                   "return vload_half(0, (__private half*)&h); }",
  "ko_half_bits": "ushort ko_half_bits(float x) { ushort h; vstore_half_rte(x, 0, (__private half*)&h); return h; }",
  "ko_half_from_bits": "float ko_half_from_bits(ushort h) { return vload_half(0, (__private half*)&h); }",
  "ko_bf16_bits": "ushort ko_bf16_bits(float x) { uint u = as_uint(x); "
                  "if (isnan(x)) return (ushort)((u >> 16) | 0x40u); "
                  "return (ushort)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16); }",
  "ko_bf16_from_bits": "float ko_bf16_from_bits(ushort h) { return as_float(((uint)h) << 16); }",
}
# float vector ops OpenCL C computes lane-wise itself; every other vector ALU is spelled lane by lane
_NATIVE_VECTOR_OPS = frozenset((BinaryOps.ADD, BinaryOps.MUL, UnaryOps.NEG, TernaryOps.MULACC, UnaryOps.EXP2,
                                UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT, BinaryOps.IDIV))
STREAM_MIN = 1 << 22   # float32 elements a loop-free kernel stores before its scalar stores become non-temporal
# the end of a streaming kernel: every work-item's stores precede the barrier; one sfence then orders them all, since
# PoCL runs a work-group's items on one thread (LLVM fences are no-ops for non-temporal stores, mem_fence compiles to
# nothing on PoCL, and an mfence per group measured 2x slower than this)
_STREAM_FENCE = ("  barrier(CLK_GLOBAL_MEM_FENCE);",
                 '  if (get_local_id(0) == 0 && get_local_id(1) == 0 && get_local_id(2) == 0) __asm__ __volatile__'
                 '("sfence" ::: "memory");')

class OpenCLRenderer(CStyleLanguage):
  """OpenCL C. The no-argument profile is DESIGN.md's static one; the OPENCL device passes the real limits and
  features (`has_fp16`: cl_khr_fp16 arithmetic; without it half is storage-only). `vector_width` > 1 (a CPU device:
  its native float vector width) makes the CPU profile: scalar loads (supports_float4 off) whose contiguous lanes,
  with the ALU ops and accumulators between them, are packed into floatN ops (the vectorize pass), upcasts up to
  2*vector_width, and `heuristics` "opencl_cpu" (kernopt/heuristics_opencl.py). With it, `clang` (the device
  compiles with clang: PoCL) renders vector accesses as element-aligned vector-type dereferences instead of
  vloadN/vstoreN, and `stream_stores` (clang on x86-64: PoCL runs each work-group on one thread) has big loop-free
  kernels' float32 stores marked non-temporal (kernopt/passes/stream_stores), spelled with
  __builtin_nontemporal_store for scalar values, each work-group ending with a barrier and
  an `sfence` by its first work-item, so the weakly ordered stores are visible before the group is reported done."""
  caps = Capabilities(device="OPENCL", supports_images=True, stream_min=STREAM_MIN)
  key_caps = ("has_fp16", "vector_width", "heuristics", "stream_stores", "clang")
  suffix = "cl"

  kernel_prefix = "__kernel "
  buffer_prefix = "__global "
  smem_prefix = "__local "
  arg_int_prefix = "const int"
  barrier = "barrier(CLK_LOCAL_MEM_FENCE);"
  helper_prefix = ""   # plain functions: `static` is OpenCL 1.2+ and a lone C99 `inline` may not be emitted
  float_suffix = "f"
  code_for_workitem = {"g": lambda d: f"get_group_id({d})", "l": lambda d: f"get_local_id({d})",
                       "i": lambda d: f"get_global_id({d})"}
  type_map = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
    dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.half: "half",
    dtypes.bfloat16: "ushort", dtypes.float32: "float", dtypes.float64: "double"}

  def __init__(self, local_max: Optional[tuple[int, ...]] = None, max_local_size: Optional[int] = None,
               shared_max: Optional[int] = None, has_fp16: Optional[bool] = None,
               supports_images: Optional[bool] = None, vector_width: Optional[int] = None,
               stream_stores: bool = False, clang: bool = False):
    given: dict[str, Any] = {"local_max": None if local_max is None else tuple(local_max),
                             "max_local_size": max_local_size, "shared_max": shared_max, "has_fp16": has_fp16,
                             "supports_images": supports_images}
    caps = replace(self.caps, **{k: v for k, v in given.items() if v is not None})
    if vector_width is not None and vector_width > 1:
      if vector_width not in (2, 4, 8, 16): raise UnsupportedError(f"OpenCL has no float{vector_width} vectors")
      caps = replace(caps, vector_width=vector_width, heuristics="opencl_cpu", supports_float4=False,
                     max_upcast=max(caps.max_upcast, 2 * vector_width), clang=clang, masked_loads=True,
                     stream_stores=stream_stores and clang)
    self.caps = caps
    self.storage_floats = frozenset((dtypes.bfloat16,) if caps.has_fp16 else (dtypes.half, dtypes.bfloat16))

  def __repr__(self) -> str:
    c = self.caps
    extra = f", vector_width={c.vector_width}, heuristics={c.heuristics!r}" if c.vector_width > 1 else ""
    return f"{type(self).__name__}(device={self.caps.device!r}{extra})"

  def render_context(self, uops: list[UOp]) -> OpenCLContext:
    # each distinct dtype object once (DType.scalar() and hashing cost ~0.3-0.5 us a call)
    dts = list({id(u.dtype): u.dtype for u in uops if u.dtype is not None}.values())
    scalars = {dt.scalar() for dt in dts if not isinstance(dt, ImageDType)}
    images = any(isinstance(dt, ImageDType) for dt in dts) and \
      any(u.op is UOps.DEFINE_GLOBAL and isinstance(u.dtype, ImageDType) for u in uops)
    return OpenCLContext(workgroup=workgroup_size(uops), fp64=dtypes.float64 in scalars,
                         fp16=dtypes.half in scalars and self.caps.has_fp16, images=images,
                         stream=any(u.op is UOps.STORE and u.arg is Mark.NONTEMPORAL and
                                    (dt := u.src[2].dtype) is not None and dt.count == 1
                                    for u in uops),   # (a marked vector store is spelled plain: no fence for it)
                         locals={u.arg[0] for u in uops if u.op is UOps.DEFINE_LOCAL})

  def _context(self) -> OpenCLContext:
    ctx = self.context
    return ctx if isinstance(ctx, OpenCLContext) else OpenCLContext()

  def render_kernel(self, name: str, params: list[str], body: list[str], preamble: list[str]) -> str:
    ctx = self._context()
    fp64, fp16, images = ctx.fp64, ctx.fp16, ctx.images
    pragmas = [f"#pragma OPENCL EXTENSION cl_khr_{ext} : enable" for ext, on in (("fp64", fp64), ("fp16", fp16)) if on]
    # OpenCL C lets the compiler fuse a*b+c into one rounding by default; every profile rounds each op as the op
    # table says, as the C (-ffp-contract=off) and CUDA (--fmad=false) devices do
    pragmas.append("#pragma OPENCL FP_CONTRACT OFF")
    if ctx.stream: body = body + list(_STREAM_FENCE)
    return super().render_kernel(name, params, body, pragmas + preamble + [_SAMPLER] * images)

  # ***** types and values *****

  def compute_dtype(self, dt: DType) -> DType:
    if dt.scalar() in self.storage_floats: return dtypes.float32.vec(dt.count)
    return dt

  def mem_dtype(self, dt: DType) -> str:
    """The element type of a buffer of dt in memory (half stays half: it is read through vload_half)."""
    return "uchar" if dt.scalar() == dtypes.bool else self.render_dtype(dt.scalar())

  def render_dtype(self, dt: DType) -> str:
    # memoized by identity (a spelling depends only on dt and the class's type_map; DType hashing is slow); the
    # entry keeps dt alive, so ids stay unique
    cache: dict[int, tuple[DType, str]] = self.__dict__.setdefault("_dtype_spellings", {})
    if (hit := cache.get(id(dt))) is not None and hit[0] is dt: return hit[1]
    bad_vector = dt.count > 1 and (dt.scalar() == dtypes.bool or dt.count not in (2, 3, 4, 8, 16))
    if bad_vector and not isinstance(dt, ImageDType):
      raise UnsupportedError(f"{self.dialect_name} has no vector type {dt}")
    ret = super().render_dtype(dt)
    if len(cache) > 4096: cache.clear()
    cache[id(dt)] = (dt, ret)
    return ret

  def math_suffix(self, dt: DType) -> str: return ""   # OpenCL's math builtins are overloaded: exp2, fma, fmod

  def render_int(self, val: int, dt: DType) -> str:
    if dt.itemsize != 8: return super().render_int(val, dt)
    suffix = "ul" if dtypes.is_unsigned(dt) else "l"
    return f"(({-(1 << 63) + 1}l-1))" if val == -(1 << 63) else (f"({val}{suffix})" if val < 0 else f"{val}{suffix}")

  def render_const(self, val: Any, dt: DType) -> str:
    ret = super().render_const(val, dt)
    if dt == dtypes.half and self.caps.has_fp16: return f"((half){ret}f)" if ret[-1].isdigit() else f"((half){ret})"
    return ret

  def render_vectorize(self, dt: DType, elems: list[str]) -> str:
    return f"(({self.render_value_dtype(dt)})({', '.join(elems)}))"

  def render_param(self, name: str, dt: DType, writable: bool) -> str:
    if isinstance(dt, ImageDType): return f"{'write_only' if writable else 'read_only'} image2d_t {name}"
    return f"__global {'' if writable else 'const '}{self.mem_dtype(dt)}* {name}"

  def render_local(self, name: str, dt: DType, size: int) -> str:
    # core OpenCL can't declare half arrays, only point at them
    if dt.scalar() == dtypes.half and not self.caps.has_fp16:
      return f"__local ushort {name}_bits[{size}]; __local half* {name} = (__local half*){name}_bits;"
    return f"__local {self.mem_dtype(dt)} {name}[{size}];"

  # ***** conversions *****

  def round_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.bfloat16: return self.from_storage(self.to_storage(f"((float){x})", dt), dt)
    return f"{self.helper('ko_round_half', _HELPERS['ko_round_half'])}((float){x})"

  def to_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.bfloat16: return f"{self.helper('ko_bf16_bits', _HELPERS['ko_bf16_bits'])}({x})"
    if dt == dtypes.half and not self.caps.has_fp16:
      return f"{self.helper('ko_half_bits', _HELPERS['ko_half_bits'])}({x})"
    return x

  def from_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.bfloat16: return f"{self.helper('ko_bf16_from_bits', _HELPERS['ko_bf16_from_bits'])}({x})"
    if dt == dtypes.half and not self.caps.has_fp16:
      return f"{self.helper('ko_half_from_bits', _HELPERS['ko_half_from_bits'])}({x})"
    return x

  def render_cast(self, x: str, src: DType, dst: DType) -> str:
    if src.count > 1 or dst.count > 1:
      if src.count != dst.count: raise UnsupportedError(f"{self.dialect_name} can't cast {src} to {dst}")
      if dst.scalar() in self.storage_floats or src.scalar() in self.storage_floats or dst.scalar() == dtypes.bool:
        lanes = [self.render_cast(f"({x}).s{i:x}", src.scalar(), dst.scalar()) for i in range(dst.count)]
        return self.render_vectorize(dst, lanes)
      return f"convert_{self.render_value_dtype(dst)}({x})"
    if dst in self.storage_floats and not dtypes.is_float(src) and src != dtypes.float64:
      return self.round_storage(f"((float){x})", dst)   # no double on devices without cl_khr_fp64
    return super().render_cast(x, src, dst)

  def render_bitcast(self, x: str, src: DType, dst: DType) -> str:
    if src.itemsize != dst.itemsize: raise UnsupportedError(f"{self.dialect_name} can't bitcast {src} to {dst}")
    if src.count > 1 or dst.count > 1:
      if src.scalar() in self.storage_floats or dst.scalar() in self.storage_floats or dtypes.bool in (src, dst):
        raise UnsupportedError(f"{self.dialect_name} can't bitcast vector {src} to {dst}")
      return f"as_{self.render_dtype(dst)}({x})"
    if dst == dtypes.bool: return f"({x}!=0)"
    if src == dtypes.bool: return f"(({self.render_dtype(dst)}){x})"
    # as_<type> needs an operand of src's exact size: char/short arithmetic is promoted to int, so cast it back first
    bits = self.to_storage(x, src) if src in self.storage_floats else f"(({self.render_dtype(src)}){x})"
    if dst in self.storage_floats:
      return self.from_storage(f"as_ushort({bits})" if src not in self.storage_floats else bits, dst)
    return f"as_{self.render_dtype(dst)}({bits})"

  # ***** ALU: vectors lane-wise where OpenCL does it, lane by lane otherwise *****

  def render_alu(self, op: ALUOp, dt: DType, srcs: list[str]) -> str:
    if dt.count == 1: return super().render_alu(op, dt, srcs)
    if op in _NATIVE_VECTOR_OPS and dt.scalar() in (dtypes.float32, dtypes.float64) or \
       (op is TernaryOps.MULACC and dt.scalar() == dtypes.half and self.caps.has_fp16):
      spell = self.spelling(op)
      assert spell is not None and not isinstance(spell, str)
      return spell(self, dt, *srcs)
    if op is BinaryOps.MAX and dt.scalar() in (dtypes.float32, dtypes.float64):
      # per lane a > b ? a : b, as the scalar spelling (a NaN compares false and picks b)
      return f"select({srcs[1]}, {srcs[0]}, isgreater({srcs[0]}, {srcs[1]}))"
    if op in (BinaryOps.CMPLT, BinaryOps.CMPNE):
      raise UnsupportedError(f"{self.dialect_name} has no bool vectors ({op.name} on {dt})")
    lanes = [self.render_alu(op, dt.scalar(), [f"({s}).s{i:x}" for s in srcs]) for i in range(dt.count)]
    return self.render_vectorize(dt, lanes)

  # ***** memory *****

  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType) -> str:
    s, n = buf_dt.scalar(), dt.count
    if s == dtypes.half and not self.caps.has_fp16:
      return f"vload_half({idx}, {buf})" if n == 1 else f"vload_half{n}(0, {buf}+{idx})"
    if s == dtypes.bool:
      if n != 1: raise UnsupportedError(f"{self.dialect_name} has no bool vectors (loading {dt} from {buf})")
      return f"({buf}[{idx}]!=0)"
    if s == dtypes.bfloat16 and n > 1:
      return self.render_vectorize(dt, [self.from_storage(f"{buf}[{idx}+{i}]", s) for i in range(n)])
    if n > 1:
      if self.caps.clang: return f"*(({self._space(buf)} const {self._unaligned(s, n)}*)({buf}+{idx}))"
      return f"vload{n}(0, {buf}+{idx})"
    return self.from_storage(f"{buf}[{idx}]", buf_dt)

  def render_masked_load(self, buf: str, idx: str, mask: str, dt: DType) -> str:
    """The CPU profile's masked float32 vector load (a padded window's lanes): one vector load when every lane is open
    (a padded conv's interior work-items), else only the open lanes read, through a private array."""
    n = dt.count
    if dt.scalar() != dtypes.float32 or n not in (2, 4, 8, 16):
      raise UnsupportedError(f"{self.dialect_name} has no masked load of {dt}")
    vt = self.render_dtype(dt)
    name = f"ko_mload_{vt}"
    full = self.render_load("b", "i", dt, dtypes.float32)
    self.helper(name, f"{vt} {name}({self._space(buf)} const float* b, int i, int m) {{ if (m == {(1 << n) - 1}) "
                      f"return {full}; float t[{n}]; for (int l = 0; l < {n}; l++) t[l] = (m >> l) & 1 ? b[i + l] : "
                      f"0.0f; return vload{n}(0, t); }}")
    return f"{name}({buf}, {idx}, {mask})"

  def render_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType) -> str:
    s, n = buf_dt.scalar(), dt.count
    if s == dtypes.half and not self.caps.has_fp16:
      return f"vstore_half_rte({val}, {idx}, {buf});" if n == 1 else f"vstore_half{n}_rte({val}, 0, {buf}+{idx});"
    if s == dtypes.bool: return f"{buf}[{idx}] = (uchar)({val});"
    if s == dtypes.bfloat16 and n > 1:
      return " ".join(f"{buf}[{idx}+{i}] = {self.to_storage(f'({val}).s{i:x}', s)};" for i in range(n))
    if n > 1:
      if self.caps.clang: return f"*(({self._space(buf)} {self._unaligned(s, n)}*)({buf}+{idx})) = {val};"
      return f"vstore{n}({val}, 0, {buf}+{idx});"
    return f"{buf}[{idx}] = {self.to_storage(val, buf_dt)};"

  def render_nontemporal_store(self, buf: str, idx: str, val: str, dt: DType, buf_dt: DType) -> str:
    # a vector store stays plain: the CPU profile's vector accesses are only element-aligned
    if buf_dt.scalar() != dtypes.float32 or dt.count != 1: return self.render_store(buf, idx, val, dt, buf_dt)
    return f"__builtin_nontemporal_store((float)({val}), {buf}+{idx});"

  def _unaligned(self, scalar: DType, n: int) -> str:
    """The CPU profile's vector access type: `scalar`N aligned only to its element. PoCL calls vloadN/vstoreN out of
    line, and each call in a register tile's loop spills every live vector register (a 512^3 matmul: 40 -> 68
    GFLOP/s without them); a dereference of this type is one unaligned vector move."""
    t = self.render_dtype(scalar)
    name = f"ko_{t}{n}u"
    return self.helper(name, f"typedef {t} {name} __attribute__((ext_vector_type({n}), aligned({scalar.itemsize})));")

  def _space(self, buf: str) -> str:
    return "__local" if buf in self._context().locals else "__global"

  def render_image_load(self, u: UOp, srcs: list[str]) -> str:
    assert u.dtype is not None
    if u.dtype.count != 4: raise UnsupportedError(f"an image load reads float4 texels, not {u.dtype}")
    val = f"read_imagef({srcs[0]}, smp, {srcs[1]})"
    return f"convert_half4({val})" if self.render_value_dtype(u.dtype) == "half4" else val

  def render_image_store(self, u: UOp, srcs: list[str]) -> str:
    val_dt = u.src[2].dtype
    assert val_dt is not None
    if val_dt.count != 4: raise UnsupportedError(f"an image store writes float4 texels, not {val_dt}")
    val = srcs[2] if self.render_value_dtype(val_dt) == "float4" else f"convert_float4({srcs[2]})"
    return f"write_imagef({srcs[0]}, {srcs[1]}, {val});"

@dataclass
class OpenCLContext(RenderContext):
  """A render's facts about its list: whether it computes in double and in half (the pragmas it needs), reads an
  image (the sampler), has non-temporal stores (then every work-group fences them), and its __local buffers' names."""
  fp64: bool = False
  fp16: bool = False
  images: bool = False
  stream: bool = False
  locals: set[str] = field(default_factory=set)
