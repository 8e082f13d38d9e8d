"""The AMD HIP dialect (device "AMD", RDNA3 WMMA), written for clang's amdgcn target without HIP headers: kernels
are `__attribute__((global))` with amdgpu_flat_work_group_size, ids come from __builtin_amdgcn_workgroup_id_* /
workitem_id_*, locals are `__attribute__((shared))`, barriers are s_barrier between workgroup fences. half is
`_Float16` and bfloat16 a uint16 bit pattern, both computed in float and rounded per result; math goes through
the device library's __ocml_* functions; vectors are ext_vector_type. Render only: nothing compiles it here.
Imports dtype, errors, ops, renderers and uops."""
from __future__ import annotations
from typing import Any
from kernopt.dtype import DType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.ops import TernaryOps, UnaryOps
from kernopt.renderers import Capabilities, TCLayout, TensorCore
from kernopt.renderers.cstyle import CStyleLanguage, dtype_of
from kernopt.uops import UOp

AMD_TC_LAYOUT = TCLayout(upcast=(0, 0, 1), reduce=(0,), warp=(8, 2, 2), tcd=(16, 8), tcd_expand=(16, 2, 4),
                         perm_a=(((1, 2), (0, 2), (1, 1), (0, 1)), ((1, 0), (0, 0))), perm_b=None)
# K unrolled, then the threads (AMD wants the locals before the upcasts), then the part of M they don't cover
AMD_TC_OPTS = (("UNROLL", 2, 16), ("LOCAL", 0, 8), ("LOCAL", 0, 2), ("LOCAL", 1, 2), ("UPCAST", 1, 8))
AMD_TENSOR_CORES = tuple(TensorCore(dims=(16, 16, 16), dtype_in=di, dtype_out=do,
                                    threads=((0, 8), (0, 2), (1, 2)), thread_local_sizes=((16,), (16,), (4, 2)),
                                    opts=AMD_TC_OPTS, layout=AMD_TC_LAYOUT)
                         for di, do in ((dtypes.half, dtypes.float), (dtypes.half, dtypes.half)))
_XYZ = "xyz"
_DEV = "__attribute__((device))"
_SHORT = {"_Float16": "half", "signed char": "char", "unsigned char": "uchar", "unsigned short": "ushort",
          "unsigned int": "uint", "unsigned long": "ulong"}

def _ocml(fn: str) -> Any:
  def spell(r: AMDRenderer, dt: DType, x: str) -> str:
    if dt not in (dtypes.float32, dtypes.float64): raise UnsupportedError(f"{r.dialect_name} has no {fn} on {dt}")
    bits = 8 * dt.itemsize
    t, name = r.render_dtype(dt), f"__ocml_{fn}_f{bits}"
    r.helper(name, f'extern "C" {_DEV} __attribute__((const)) {t} {name}({t});')
    return f"{name}({x})"
  return spell

def _fma(r: AMDRenderer, dt: DType, a: str, b: str, c: str) -> str:
  if dt == dtypes.float32: return f"__builtin_fmaf({a}, {b}, {c})"   # one rounding, as exec_alu
  spell = CStyleLanguage.code_for_op[TernaryOps.MULACC]
  assert callable(spell)
  return spell(r, dt, a, b, c)

class AMDRenderer(CStyleLanguage):
  caps = Capabilities(device="AMD", shared_max=65536, tensor_cores=AMD_TENSOR_CORES)
  suffix = "hip"

  kernel_prefix = 'extern "C" __attribute__((global)) '
  smem_prefix = "__attribute__((shared, aligned(16))) "
  arg_int_prefix = "const int"
  barrier = ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
             '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");')
  helper_prefix = f"static {_DEV} inline"
  infinity = "__builtin_inff()"
  nan = "__builtin_nanf(\"\")"
  code_for_workitem = {"g": lambda d: f"__builtin_amdgcn_workgroup_id_{_XYZ[d]}()",
                       "l": lambda d: f"__builtin_amdgcn_workitem_id_{_XYZ[d]}()"}
  type_map = {**CStyleLanguage.type_map, dtypes.int8: "signed char", dtypes.half: "_Float16",
              dtypes.bfloat16: "unsigned short"}
  code_for_op = {UnaryOps.EXP2: _ocml("exp2"), UnaryOps.LOG2: _ocml("log2"), UnaryOps.SIN: _ocml("sin"),
                 UnaryOps.SQRT: _ocml("sqrt"), TernaryOps.MULACC: _fma}

  def render_kernel(self, name: str, params: list[str], body: list[str], preamble: list[str]) -> str:
    n = self.workgroup_threads()
    head = "\n".join([*self.includes, *preamble])
    return (f"{head}\n{self.kernel_prefix}void __attribute__((amdgpu_flat_work_group_size(1, {n}))) "
            f"{name}({', '.join(params)}) {{\n" + "\n".join(body) + "\n}\n")

  def math_suffix(self, dt: DType) -> str: return ""

  def int_helper(self, kind: str, dt: DType) -> str:
    if dtypes.is_float(dt):   # fmod without <math.h>
      t, name = self.render_dtype(dt), f"ko_{kind}_{self._suffix(dt)}"
      fm = "__builtin_fmodf" if dt == dtypes.float32 else "__builtin_fmod"
      return self.helper(name, f"{self.helper_prefix} {t} {name}({t} a, {t} b) {{ return b == 0 ? 0 : {fm}(a, b); }}")
    return super().int_helper(kind, dt)

  # ***** types *****

  def render_dtype(self, dt: DType) -> str:
    if dt.count == 1: return super().render_dtype(dt)
    scalar, n = self.vector_parts(dt)
    base = self.render_dtype(scalar)
    name = f"ko_{_SHORT.get(base, base)}{n}"
    self.helper(name, f"typedef {base} {name} __attribute__((ext_vector_type({n})));")
    return name

  def render_vectorize(self, dt: DType, elems: list[str]) -> str:
    name = self.render_dtype(dt)
    if dt.scalar() in self.storage_floats: elems = [self.to_storage(e, dt.scalar()) for e in elems]
    return f"(({name}){{{', '.join(elems)}}})"

  def render_gep(self, x: str, lane: int, dt: DType) -> str:
    return self.from_storage(f"{x}[{lane}]", dt.scalar()) if dt.scalar() in self.storage_floats else f"{x}[{lane}]"

  def render_const(self, val: Any, dt: DType) -> str:
    if isinstance(val, tuple): val = val[0]   # the lowerer's DEFINE_ACC arg is (initial value, accumulator number)
    return super().render_const(val, dt)

  # ***** storage floats *****

  def to_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.bfloat16: return f"{self.helper('ko_f_to_bf16', _BF16['ko_f_to_bf16'])}({x})"
    return f"((_Float16)({x}))" if dt == dtypes.half else x

  def from_storage(self, x: str, dt: DType) -> str:
    if dt == dtypes.bfloat16: return f"{self.helper('ko_bf16_to_f', _BF16['ko_bf16_to_f'])}({x})"
    return f"((float)({x}))" if dt == dtypes.half else x

  def round_storage(self, x: str, dt: DType) -> str: return self.from_storage(self.to_storage(f"((float){x})", dt), dt)

  def render_cast(self, x: str, src: DType, dst: DType) -> str:
    if src.count == 1 and dst == dtypes.half and (dtypes.is_int(src) or src in (dtypes.bool, dtypes.float64)):
      return self.from_storage(f"((_Float16)({x}))", dst)   # clang converts to _Float16 with one rounding
    return super().render_cast(x, src, dst)

  def bitcast_bits(self, x: str, src: DType, dst: DType) -> str:
    # __builtin_bit_cast needs an operand of src's exact size: char/short arithmetic is promoted to int
    if dtypes.is_int(src) and src.itemsize < 4: x = f"(({self.render_dtype(src)}){x})"
    return f"__builtin_bit_cast({self.render_dtype(dst)}, {x})"

  # ***** tensor cores *****

  def render_wmma(self, u: UOp, srcs: list[str]) -> str:
    arg = u.arg
    if arg.dims != (16, 16, 16) or arg.dtype_in != dtypes.half or arg.dtype_out not in (dtypes.float, dtypes.half):
      raise UnsupportedError(f"{self.dialect_name} has no tensor core {arg.name} ({arg.dtype_in} -> {arg.dtype_out})")
    a_t, b_t, c_t = (self.render_dtype(dtype_of(s)) for s in u.src)
    if arg.dtype_out == dtypes.float:
      name = "ko_wmma_f32_16x16x16_f16"
      body = ["  return __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c);"]
    else:   # the f16 result occupies the low half of each 32-bit lane of a 16-wide vector
      name, wide = "ko_wmma_f16_16x16x16_f16", self.render_dtype(dtypes.half.vec(16))
      body = [f"  {wide} w = {{}};", "  for (int i = 0; i < 8; i++) w[2 * i] = c[i];",
              "  w = __builtin_amdgcn_wmma_f16_16x16x16_f16_w32(a, b, w, false);",
              f"  {c_t} d;", "  for (int i = 0; i < 8; i++) d[i] = w[2 * i];", "  return d;"]
    self.helper(name, "\n".join([f"{self.helper_prefix} {c_t} {name}({a_t} a, {b_t} b, {c_t} c) {{", *body, "}"]))
    return f"{name}({', '.join(srcs)})"

_BF16 = {
  "ko_bf16_to_f": f"static {_DEV} inline float ko_bf16_to_f(unsigned short b) "
                  "{ return __builtin_bit_cast(float, ((unsigned int)b) << 16); }",
  "ko_f_to_bf16": f"static {_DEV} inline unsigned short ko_f_to_bf16(float f) {{ "
                  "unsigned int u = __builtin_bit_cast(unsigned int, f); "
                  "if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u); "
                  "return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }"}
