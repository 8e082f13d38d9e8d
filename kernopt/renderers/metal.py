"""The Metal Shading Language dialect (device "METAL"): `kernel void` functions over `device` buffers bound with
[[buffer(i)]], threadgroup ids for SPECIALs, `threadgroup` arrays and barriers. half is native (its +, *, /, sqrt
are correctly rounded, so they equal ops.exec_alu's float-then-round); bfloat16 is a ushort bit pattern computed in
float; Metal has no double. Tensor cores are simdgroup_matrix 8x8 multiply-accumulates.
Imports dtype, errors, renderers and uops."""
from __future__ import annotations
from typing import Any
from kernopt.dtype import DType, ImageDType, dtypes
from kernopt.errors import UnsupportedError
from kernopt.renderers import Capabilities, TCLayout, TensorCore
from kernopt.renderers.cstyle import CStyleLanguage
from kernopt.uops import UOp

METAL_TC_LAYOUT = TCLayout(upcast=(1, 1, 1), reduce=(0,), warp=(2, 4, 2, 2), tcd=(8, 2), tcd_expand=(2, 2, 2, 2),
                           perm_a=(((1, 1), (0, 1), (1, 0), (0, 3)), ((0, 0), (0, 2), (1, 3), (1, 2))),
                           perm_b=(((0, 0), (1, 1), (1, 2), (0, 2), (1, 0)), ((0, 1), (0, 3), (1, 3))))
# K unrolled, the part of N the threads don't cover upcast, then the threads as `threads` lists them
METAL_TC_OPTS = (("UNROLL", 2, 8), ("UPCAST", 0, 2), ("LOCAL", 0, 2), ("LOCAL", 1, 4), ("LOCAL", 0, 2), ("LOCAL", 1, 2))
METAL_TENSOR_CORES = tuple(TensorCore(dims=(8, 8, 8), dtype_in=di, dtype_out=do,
                                      threads=((0, 2), (1, 4), (0, 2), (1, 2)), thread_local_sizes=((2,), (2,), (2,)),
                                      opts=METAL_TC_OPTS, layout=METAL_TC_LAYOUT)
                           for di, do in ((dtypes.float, dtypes.float), (dtypes.half, dtypes.float),
                                          (dtypes.half, dtypes.half)))
_FIELDS = "xyzw"

class MetalRenderer(CStyleLanguage):
  caps = Capabilities(device="METAL", tensor_cores=METAL_TENSOR_CORES)
  suffix = "metal"

  kernel_prefix = "kernel "
  buffer_prefix = "device "
  smem_prefix = "threadgroup "
  arg_int_prefix = "constant int&"
  barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
  helper_prefix = "static inline"
  includes = ("#include <metal_stdlib>", "using namespace metal;")
  storage_floats = frozenset((dtypes.bfloat16,))
  code_for_workitem = {"g": lambda d: f"gid.{_FIELDS[d]}", "l": lambda d: f"lid.{_FIELDS[d]}"}
  type_map = {
    dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "uchar", dtypes.int16: "short", dtypes.uint16: "ushort",
    dtypes.int32: "int", dtypes.uint32: "uint", dtypes.int64: "long", dtypes.uint64: "ulong", dtypes.half: "half",
    dtypes.bfloat16: "ushort", dtypes.float32: "float"}

  def render_dtype(self, dt: DType) -> str:
    if isinstance(dt, ImageDType): raise UnsupportedError(f"{self.dialect_name} has no images (got {dt})")
    if dt.count > 1 and (dt.scalar() in (dtypes.bool, dtypes.bfloat16) or dt.count not in (2, 3, 4)):
      raise UnsupportedError(f"{self.dialect_name} has no vector type {dt}")
    return super().render_dtype(dt)

  def math_suffix(self, dt: DType) -> str: return ""   # Metal's math functions are overloaded

  def render_const(self, val: Any, dt: DType) -> str:
    if isinstance(val, tuple): val = val[0]   # the lowerer's DEFINE_ACC arg is (initial value, accumulator number)
    if dt == dtypes.half: return f"((half){super().render_const(val, dtypes.float32)})"
    return super().render_const(val, dt)

  def render_vectorize(self, dt: DType, elems: list[str]) -> str: return f"{self.render_dtype(dt)}({', '.join(elems)})"

  def render_cast(self, x: str, src: DType, dst: DType) -> str:
    if src.count == 1 and dst == dtypes.bfloat16 and src not in (dtypes.float32, dtypes.half, dtypes.bfloat16):
      x = f"((float){x})"   # no double: an int goes through float (exact below 2^24)
      src = dtypes.float32
    if dst in self.storage_floats and src.count == 1 and dst.count == 1:
      return self.round_storage(x, dst) if dtypes.is_float(src) else super().render_cast(x, src, dst)
    return super().render_cast(x, src, dst)

  def bitcast_bits(self, x: str, src: DType, dst: DType) -> str:
    # as_type needs an operand of src's exact size: char/short arithmetic is promoted to int, so cast it back first
    if dtypes.is_int(src) and src.itemsize < 4: x = f"(({self.render_dtype(src)}){x})"
    return f"as_type<{self.render_dtype(dst)}>({x})"

  def f2i_helper(self, src: DType, dst: DType) -> str:
    """float -> int truncation with bounds that are exact powers of two in float (Metal has no double literals)."""
    bits, name = 8 * dst.itemsize, f"ko_{self._suffix(src)}_to_{self._suffix(dst)}"
    lo = "x > -1.0f" if dtypes.is_unsigned(dst) else f"x >= -{float(1 << (bits - 1))!r}f"
    hi = f"x < {float(1 << (bits - int(not dtypes.is_unsigned(dst))))!r}f"
    t, s = self.render_dtype(dst), self.render_dtype(src)
    return self.helper(name, f"{self.helper_prefix} {t} {name}({s} x) {{ return ({lo} && {hi}) ? ({t})x : 0; }}")

  # ***** bfloat16 as a ushort bit pattern *****

  def to_storage(self, x: str, dt: DType) -> str:
    if dt != dtypes.bfloat16: return x
    return f"{self.helper('ko_f_to_bf16', _BF16['ko_f_to_bf16'])}({x})"

  def from_storage(self, x: str, dt: DType) -> str:
    if dt != dtypes.bfloat16: return x
    return f"{self.helper('ko_bf16_to_f', _BF16['ko_bf16_to_f'])}({x})"

  def round_storage(self, x: str, dt: DType) -> str: return self.from_storage(self.to_storage(f"((float){x})", dt), dt)

  # ***** signature *****

  def render_param(self, name: str, dt: DType, writable: bool) -> str:
    return f"{'' if writable else 'const '}device {self.render_dtype(dt)}* {name}"

  def render_load(self, buf: str, idx: str, dt: DType, buf_dt: DType) -> str:
    if dt.count > 1: return f"(*((const device {self.render_dtype(dt)}*)({buf}+{idx})))"
    return super().render_load(buf, idx, dt, buf_dt)

  def render_local(self, name: str, dt: DType, size: int) -> str:
    return f"threadgroup {self.render_dtype(dt)} {name}[{size}];"

  def render_kernel(self, name: str, params: list[str], body: list[str], preamble: list[str]) -> str:
    bound = [f"{p} [[buffer({i})]]" for i, p in enumerate(params)]
    bound += ["uint3 gid [[threadgroup_position_in_grid]]", "uint3 lid [[thread_position_in_threadgroup]]"]
    head = "\n".join([*self.includes, *preamble])
    return f"{head}\nkernel void {name}({', '.join(bound)}) {{\n" + "\n".join(body) + "\n}\n"

  # ***** tensor cores *****

  def render_wmma(self, u: UOp, srcs: list[str]) -> str:
    arg = u.arg
    pair = (arg.dtype_in, arg.dtype_out)
    if arg.dims != (8, 8, 8) or pair not in ((dtypes.float, dtypes.float), (dtypes.half, dtypes.float),
                                              (dtypes.half, dtypes.half)):
      raise UnsupportedError(f"{self.dialect_name} has no tensor core {arg.name} ({arg.dtype_in} -> {arg.dtype_out})")
    tin, tout = self.render_dtype(arg.dtype_in), self.render_dtype(arg.dtype_out)
    name = f"ko_simdgroup_mma_{tin}_{tout}"
    self.helper(name, "\n".join([
      f"{self.helper_prefix} {tout}2 {name}({tin}2 a, {tin}2 b, {tout}2 c) {{",
      f"  simdgroup_{tin}8x8 ma, mb; simdgroup_{tout}8x8 mc;",
      "  ma.thread_elements()[0] = a.x; ma.thread_elements()[1] = a.y;",
      "  mb.thread_elements()[0] = b.x; mb.thread_elements()[1] = b.y;",
      "  mc.thread_elements()[0] = c.x; mc.thread_elements()[1] = c.y;",
      "  simdgroup_multiply_accumulate(mc, ma, mb, mc);",
      f"  return {tout}2(mc.thread_elements()[0], mc.thread_elements()[1]);", "}"]))
    return f"{name}({', '.join(srcs)})"

_BF16 = {
  "ko_bf16_to_f": "static inline float ko_bf16_to_f(ushort b) { return as_type<float>(((uint)b) << 16); }",
  "ko_f_to_bf16": "static inline ushort ko_f_to_bf16(float f) { uint u = as_type<uint>(f); "
                  "if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u); "
                  "return (ushort)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); }"}
