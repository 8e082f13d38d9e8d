"""Kernel construction, validation and the standard protocol's choices on realistic ASTs for each static dialect.
Every expectation below was worked by hand from the spec's rules (the comment beside it says which); nothing runs."""
from dataclasses import replace
import pytest
from catalogue import alu, buf, kernel, reduce, store, view
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError, VerifyError
from kernopt import refusals
from kernopt.heuristics_registry import register_heuristics
from kernopt.helpers import ansilen, ansistrip, config_override
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BinaryOps, BufferOps, KernelInfo, LazyOp, MemBuffer, ReduceOps, UnaryOps
from kernopt.renderers import get_renderer
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Variable

U, UM, UN, L, G, GT, NL = OptOps.UPCAST, OptOps.UPCASTMID, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, \
                          OptOps.NOLOCALS
COLOR = {"b": "blue", "B": "BLUE", "c": "cyan", "g": "green", "w": "white", "r": "red", "m": "magenta", "y": "yellow"}
GPUS = ("OPENCL", "CUDA", "METAL", "AMD")
N_SYM = Variable("n", 1, 1024)

# ***** the ASTs (sizes chosen so that each heuristic branch fires) *****

def ew_add(n=1024, m=1024): return kernel(store(alu(BinaryOps.ADD, buf(1, (n, m)), buf(2, (n, m)))))
def bcast_add():
  b = buf(2, (1024, 1024), st=view((1024, 1024), (0, 1)))  # a row vector broadcast down the rows
  return kernel(store(alu(BinaryOps.ADD, buf(1, (1024, 1024)), b)))
def sum_axis(axis, shape=(64, 128, 256), op=ReduceOps.SUM): return kernel(store(reduce(op, buf(1, shape), (axis,))))
def sum_all(): return kernel(store(reduce(ReduceOps.SUM, buf(1, (1024, 1024)), (0, 1))))
def matmul(N, M, K, dt=dtypes.float):
  """out[i, j] = sum_k a[i, k] * b[k, j] over the full shape (N, M, K); with a half dtype, cast to float first."""
  a, b = buf(1, (N, M, K), dt, st=view((N, M, K), (K, 0, 1))), buf(2, (N, M, K), dt, st=view((N, M, K), (0, 1, M)))
  mul = alu(BinaryOps.MUL, a, b)
  src = mul if dt == dtypes.float else LazyOp(UnaryOps.CAST, (mul,), dtypes.float)
  return kernel(store(reduce(ReduceOps.SUM, src, (2,))))
def matvec(N=4096, K=4096):
  a, x = buf(1, (N, K), st=view((N, K), (K, 1))), buf(2, (N, K), st=view((N, K), (0, 1)))
  return kernel(store(reduce(ReduceOps.SUM, alu(BinaryOps.MUL, a, x), (1,))))
def padded_add():
  """out(4, 4096) = pad(x(2, 4096), rows 1 before and after) + y: axis 0 is masked."""
  x = buf(1, (4, 4096), st=ShapeTracker.from_shape((2, 4096)).pad(((1, 1), (0, 0))))
  return kernel(store(alu(BinaryOps.ADD, x, buf(2, (4, 4096)))))
def image_in_sum():
  x = buf(1, (64, 256), dtypes.imagef((64, 64, 4)))
  return kernel(store(reduce(ReduceOps.SUM, x, (1,)), 0, dtype=dtypes.float))
def image_out_add():
  shp = (64, 64, 4)
  return kernel(store(alu(BinaryOps.ADD, buf(1, shp), buf(2, shp)), 0, dtype=dtypes.imagef(shp)))
def two_outputs():
  a, b = buf(2, (1024, 1024)), buf(3, (1024, 1024))
  return kernel(store(alu(BinaryOps.ADD, a, b), 0), store(alu(BinaryOps.MUL, a, b), 1))
def two_reduces():
  x = buf(2, (1024, 1024))
  return kernel(store(reduce(ReduceOps.SUM, x, (1,)), 0), store(reduce(ReduceOps.MAX, x, (1,)), 1))
def sym_add(): return kernel(store(alu(BinaryOps.ADD, buf(1, (N_SYM, 64)), buf(2, (N_SYM, 64)))))
def sym_sum(): return kernel(store(reduce(ReduceOps.SUM, buf(1, (64, N_SYM)), (1,))))

def protocol(ast, dialect, **kw):
  k = Kernel(ast, opts=get_renderer(dialect, **kw)).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def check(k, opts, name, colors):
  assert list(k.applied_opts) == [Opt(*o) for o in opts]
  assert ansistrip(k.name) == name
  assert k.colors() == [COLOR[c] for c in colors]
  assert len(k.full_shape) == len(colors)

CPU_ONLY, GPU_ALL, GPU_NO_METAL = ("CPU",), GPUS, ("OPENCL", "CUDA", "AMD")

# (id, builder, dialects, opts, name, colors)
EXPECTED = [
  # no reduce: the upcast loop finds no stride-0 axis; the default upcast takes 4 of the last axis (1048576 % 4 == 0)
  ("add", ew_add, CPU_ONLY, [(U, 0, 4)], "E_262144_4", "by"),
  # ...then locals: axis 0 may take 32 (axis 0 and 262144 % 32 == 0, 32 <= 128)
  ("add", ew_add, GPU_ALL, [(U, 0, 4), (L, 0, 32)], "E_8192_32_4", "bcy"),
  # b is broadcast on axis 0 (stride 0): no merge; upcast loop: only axis 0 qualifies, 1024 % 4 == 0 -> UPCAST 0 4
  ("bcast_add", bcast_add, CPU_ONLY, [(U, 0, 4)], "E_256_1024_4", "bby"),
  # locals: axis 0 ranks first (expand); 32 for it, then axis 1 gets 4 (16 and 8 would pass 128 threads)
  ("bcast_add", bcast_add, GPU_ALL, [(U, 0, 4), (L, 0, 32), (L, 1, 4)], "E_8_256_32_4_4", "bbccy"),
  # sum over the last axis: the outputs merge to 8192; reduce 256 > 32 and 256 % 4 == 0 -> UNROLL 0 4
  ("sum_ax2", lambda: sum_axis(2), CPU_ONLY, [(UN, 0, 4)], "r_8192_64_4", "brm"),
  # 8192 outputs > 2048: no GROUPTOP; local 32 on axis 0
  ("sum_ax2", lambda: sum_axis(2), GPU_ALL, [(UN, 0, 4), (L, 0, 32)], "r_256_32_64_4", "bcrm"),
  # sum over the middle axis: the input's strides (32768, 1) keep (64, 256) apart; reduce 128 -> UNROLL 0 4
  ("sum_ax1", lambda: sum_axis(1), CPU_ONLY, [(UN, 0, 4)], "r_64_256_32_4", "bbrm"),
  # locals: no expand axis, so later axes first: axis 1 takes 16, then axis 0 only 8 (16 * 8 = 128)
  ("sum_ax1", lambda: sum_axis(1), GPU_ALL, [(UN, 0, 4), (L, 0, 8), (L, 1, 16)], "r_8_16_8_16_32_4", "bbccrm"),
  # sum over axis 0: (128, 256) merge to 32768 outputs; reduce 64 > 32 -> UNROLL 0 4
  ("sum_ax0", lambda: sum_axis(0), CPU_ONLY, [(UN, 0, 4)], "r_32768_16_4", "brm"),
  ("sum_ax0", lambda: sum_axis(0), GPU_ALL, [(UN, 0, 4), (L, 0, 32)], "r_1024_32_16_4", "bcrm"),
  # full reduce: one axis of 1048576; no locals on CPU -> UNROLL 0 4
  ("sum_all", sum_all, CPU_ONLY, [(UN, 0, 4)], "r_262144_4", "rm"),
  # 1 output <= 32 -> GROUPTOP 256 first (256 * 4 bytes of shared memory); grouping stops the heuristics
  ("sum_all", sum_all, GPU_ALL, [(GT, 0, 256)], "r_256_4096", "gr"),
  # max over rows: 1024 outputs <= 2048 but > 32 -> GROUPTOP 16
  ("max_rows", lambda: sum_axis(1, (1024, 1024), ReduceOps.MAX), CPU_ONLY, [(UN, 0, 4)], "r_1024_256_4", "brm"),
  ("max_rows", lambda: sum_axis(1, (1024, 1024), ReduceOps.MAX), GPU_ALL, [(GT, 0, 16)], "r_1024_16_64", "bgr"),
  # matmul: upcast loop picks (fewest strides > 0, smallest stride sum): axis 1 (3, 3) before axis 0 (4, 4096),
  # then axis 0; unroll 1024 % 4; locals: both axes expand, axis 1 first gets 16, axis 0 then 8
  ("matmul_1024", lambda: matmul(1024, 1024, 1024), CPU_ONLY, [(U, 1, 4), (U, 0, 4), (UN, 0, 4)],
   "r_256_256_256_4_4_4", "bbryym"),
  ("matmul_1024", lambda: matmul(1024, 1024, 1024), GPU_NO_METAL,
   [(U, 1, 4), (U, 0, 4), (UN, 0, 4), (L, 0, 8), (L, 1, 16)], "r_32_16_8_16_256_4_4_4", "bbccryym"),
  ("matmul_512", lambda: matmul(512, 512, 512), CPU_ONLY, [(U, 1, 4), (U, 0, 4), (UN, 0, 4)], "r_128_128_128_4_4_4",
   "bbryym"),
  ("matmul_512", lambda: matmul(512, 512, 512), GPU_NO_METAL,
   [(U, 1, 4), (U, 0, 4), (UN, 0, 4), (L, 0, 8), (L, 1, 16)], "r_16_8_8_16_128_4_4_4", "bbccryym"),
  # 64: after UPCAST 1 4 the output is 64*16 = 1024 >= 1024 so axis 0 is upcast too; LOCAL 1 16 takes all of axis 1
  ("matmul_64", lambda: matmul(64, 64, 64), CPU_ONLY, [(U, 1, 4), (U, 0, 4), (UN, 0, 4)], "r_16_16_16_4_4_4", "bbryym"),
  ("matmul_64", lambda: matmul(64, 64, 64), GPU_NO_METAL,
   [(U, 1, 4), (U, 0, 4), (UN, 0, 4), (L, 0, 8), (L, 1, 16)], "r_2_8_16_16_4_4_4", "bccryym"),
  # 100x37x53: only axis 0 (100 % 4) upcasts, then 25*37 < 1024 stops; 53 is neither <= 32 nor % 4; no local size
  # divides 25 or 37; METAL's float tensor core would need padding (TC_OPT 0 refuses)
  ("matmul_odd", lambda: matmul(100, 37, 53), CPU_ONLY + GPU_ALL, [(U, 0, 4)], "r_25_37_53_4", "bbry"),
  # half matmul (cast to float) off the tensor-core dialects: the same choices as float
  ("matmul_half", lambda: matmul(1024, 1024, 1024, dtypes.half), ("OPENCL",),
   [(U, 1, 4), (U, 0, 4), (UN, 0, 4), (L, 0, 8), (L, 1, 16)], "r_32_16_8_16_256_4_4_4", "bbccryym"),
  # matvec branch: strides0[first_reduce] == 1, only x expands, 4096 % 8 == 0, 4096 % (4*4) == 0
  ("matvec", matvec, GPU_ALL, [(G, 0, 8), (L, 0, 4), (U, 0, 4)], "r_256_4_8_512_4", "bcgry"),
  # CPU: upcast loop takes axis 0 (x broadcast), then 1024 outputs, axis 0 used -> stop; unroll 4096 by 4
  ("matvec", matvec, CPU_ONLY, [(U, 0, 4), (UN, 0, 4)], "r_1024_1024_4_4", "brym"),
  # masked axis 0 of size 4 <= 7 (4 <= 49 lanes) -> UPCAST 0 0 (all of it); then nothing else upcasts
  ("padded", padded_add, CPU_ONLY, [(U, 0, 0)], "E_4096_4", "by"),
  ("padded", padded_add, GPU_ALL, [(U, 0, 0), (L, 0, 32)], "E_128_32_4", "bcy"),
  # two outputs: "E" + "2_"; the same choices as add
  ("two_outputs", two_outputs, CPU_ONLY, [(U, 0, 4)], "E2_262144_4", "by"),
  ("two_outputs", two_outputs, GPU_ALL, [(U, 0, 4), (L, 0, 32)], "E2_8192_32_4", "bcy"),
  # two reduces: GROUPTOP refused (several reduces) and skipped; unroll 4, local 32
  ("two_reduces", two_reduces, CPU_ONLY, [(UN, 0, 4)], "r2_1024_256_4", "brm"),
  ("two_reduces", two_reduces, GPU_ALL, [(UN, 0, 4), (L, 0, 32)], "r2_32_32_256_4", "bcrm"),
  # symbolic: (n, 64) merges to 64n; 64n % 4 == 0 is provable -> UPCAST 0 4; locals: 16n % 32 is not provable, 16 is
  ("sym_add", sym_add, CPU_ONLY, [(U, 0, 4)], "E_(n*16)_4", "by"),
  ("sym_add", sym_add, GPU_ALL, [(U, 0, 4), (L, 0, 16)], "E_n_16_4", "bcy"),
  # symbolic reduce: n can't be unrolled or split; 64 outputs, n % 16 unprovable -> no GROUPTOP; local 32
  ("sym_sum", sym_sum, CPU_ONLY, [], "r_64_n", "br"),
  ("sym_sum", sym_sum, GPU_ALL, [(L, 0, 32)], "r_2_32_n", "bcr"),
  # image input on OpenCL: GROUPTOP 16 (64 outputs), then the image's unit-stride reduce axis (16 % 4) -> UNROLL 1 4
  ("image_in", image_in_sum, ("OPENCL",), [(GT, 0, 16), (UN, 1, 4)], "r_64_16_4_4", "bgrm"),
  # image output: required UPCAST 2 4 of the texel axis; the image axes are not merged; locals 8 and 16
  ("image_out", image_out_add, ("OPENCL",), [(U, 2, 4), (L, 0, 8), (L, 1, 16)], "E_8_4_8_16_4", "bbccy"),
]

@pytest.mark.parametrize("case,build,dialects,opts,name,colors", EXPECTED,
                         ids=[f"{e[0]}-{'/'.join(e[2])}" for e in EXPECTED])
def test_protocol(case, build, dialects, opts, name, colors):
  for d in dialects:
    check(protocol(build(), d), opts, name, colors)

def test_cuda_without_tensor_cores_uses_the_hand_coded_opts():
  # sm_75 has no tensor cores: the half matmul takes the same opts as on OpenCL
  k = protocol(matmul(1024, 1024, 1024, dtypes.half), "CUDA", arch="sm_75")
  check(k, [(U, 1, 4), (U, 0, 4), (UN, 0, 4), (L, 0, 8), (L, 1, 16)], "r_32_16_8_16_256_4_4_4", "bbccryym")

def test_nolocals_knob():
  with config_override(NOLOCALS=1):
    check(protocol(ew_add(), "OPENCL"), [(U, 0, 4), (NL,)], "E_262144_4", "By")

def test_mv_knobs():
  with config_override(MV=0):  # no matvec: 4096 outputs > 2048 (no GROUPTOP), then the CPU choices plus local 32
    check(protocol(matvec(), "OPENCL"), [(U, 0, 4), (UN, 0, 4), (L, 0, 32)], "r_32_32_1024_4_4", "bcrym")
  with config_override(MV_BLOCKSIZE=2):  # 4096 % (2*4) == 0
    check(protocol(matvec(), "OPENCL"), [(G, 0, 8), (L, 0, 2), (U, 0, 4)], "r_512_2_8_512_4", "bcgry")

def test_required_optimizations_upcasts_image_output():
  k = Kernel(image_out_add(), opts=get_renderer("OPENCL")).required_optimizations()
  assert k.full_shape == (64, 64, 4) and list(k.applied_opts) == [Opt(U, 2, 4)] and k.upcasted == 1
  k.required_optimizations()  # already upcast: nothing more
  assert list(k.applied_opts) == [Opt(U, 2, 4)]

def test_required_optimizations_refuses_image_without_float4_axis():
  out = MemBuffer(0, dtypes.imagef((64, 64, 4)), ShapeTracker.from_shape((64, 256)).shrink(((0, 64), (0, 255))))
  ast = kernel(LazyOp(BufferOps.STORE, (buf(1, (64, 255)),), out))
  with pytest.raises(UnsupportedError, match="unit-stride"):
    Kernel(ast, opts=get_renderer("OPENCL")).required_optimizations()

def test_unroll_whole_reduce_axis_after_local_keeps_local_dims():
  # LOCAL 0 4 makes (256, 4, 16); UNROLL 0 0 empties the axis at first_reduce, which simplify_ones would count as local
  k = Kernel(sum_axis(1, (1024, 16)), opts=get_renderer("OPENCL")).apply_opt(Opt(L, 0, 4)).apply_opt(Opt(UN, 0, 0))
  assert (k.full_shape, k.local_dims, k.upcasted, k.first_reduce) == ((256, 4, 16), 1, 1, 2)
  assert k.colors() == ["blue", "cyan", "magenta"]

def test_unroll_whole_group_axis_ungroups_it():
  k = Kernel(sum_all(), opts=get_renderer("OPENCL")).apply_opt(Opt(GT, 0, 16))
  assert (k.full_shape, k.group_for_reduces) == ((16, 65536), 1)
  k.apply_opt(Opt(UN, 0, 0))  # the whole grouped axis of 16 becomes an unrolled reduce
  assert (k.full_shape, k.group_for_reduces, k.local_dims, k.upcasted) == ((65536, 16), 0, 0, 1)
  assert k.colors() == ["red", "magenta"]

def test_upcastmid_on_an_image_output_reduce():
  # image (1, 64, 4) written as (64, 4, 1): the texel axis is the only unit stride; first_reduce == 2
  x = buf(1, (64, 4, 32))
  out = MemBuffer(0, dtypes.imagef((1, 64, 4)), ShapeTracker.from_shape((64, 4, 1)))
  k = Kernel(kernel(LazyOp(BufferOps.STORE, (reduce(ReduceOps.SUM, x, (2,)),), out)), opts=get_renderer("OPENCL"))
  assert k.full_shape == (64, 4, 32)
  # GROUP: (64, 4, 8, 4); UPCASTMID moves the 4 to first_reduce + group_for_reduces, after the group axis, and the
  # emptied axis 1 goes: first_reduce drops to 1
  k.apply_opt(Opt(G, 0, 8)).apply_opt(Opt(UM, 1, 4))
  assert (k.full_shape, k.group_for_reduces, k.first_reduce, k.upcast_in_mid_reduce_axes) == ((64, 8, 4, 4), 2, 1, [2])
  assert k.colors() == ["blue", "green", "white", "red"]

# ***** construction and validation *****

def test_default_renderer_comes_from_the_device_knob():
  assert Kernel(ew_add()).opts.caps.device == "CPU"
  with config_override(DEVICE="OPENCL"): assert Kernel(ew_add()).opts.caps.device == "OPENCL"

def test_stores_are_wrapped_in_a_kernel():
  s0, s1 = two_outputs().src
  k = Kernel(s0, s1, opts=get_renderer("CPU"))
  assert k.ast == two_outputs() and [b.idx for b in k.membufs] == [0, 2, 3, 1]

@pytest.mark.parametrize("args", [(), (1,), ("x",), (buf(1, (4,)),), (store(buf(1, (4,))), buf(1, (4,))),
                                  (LazyOp(BufferOps.STORE, (buf(1, (4, 4)),), MemBuffer(0, dtypes.float,
                                                                                        ShapeTracker.from_shape((4,)))),),
                                  (kernel(store(alu(BinaryOps.ADD, buf(1, (4, 4)), buf(2, (4, 8))))),)])
def test_malformed_asts_raise_verify_error(args):
  with pytest.raises(VerifyError):
    Kernel(*args, opts=get_renderer("CPU"))

def test_nested_reduce_is_one_kernel():  # issue 17: tests/test_fusion.py runs such kernels
  inner = reduce(ReduceOps.SUM, buf(1, (16, 32)), (1,))
  k = Kernel(kernel(store(reduce(ReduceOps.MAX, alu(BinaryOps.ADD, inner, buf(2, (16, 1))), (0,)))),
             opts=get_renderer("CPU"))
  assert len(k.reduceops) == 2 and k.full_shape == (16, 32) and k.first_reduce == 0

def test_an_ast_to_optimize_holds_nothing_only_opts_make():
  # a GROUPTOP's local buffer and a tensor core's WMMA appear in optimized ASTs only; kernopt.check says the same
  grouped = Kernel(sum_axis(1), opts=get_renderer("OPENCL")).apply_opt(Opt(GT, 0, 16)).get_optimized_ast()
  with pytest.raises(VerifyError, match="local buffer"): Kernel(grouped, opts=get_renderer("OPENCL"))
  tc = Kernel(matmul(1024, 1024, 1024, dtypes.half), opts=get_renderer("CUDA"))
  assert tc.apply_tensor_cores(1)
  with pytest.raises(UnsupportedError, match="WMMA"): Kernel(tc.get_optimized_ast(), opts=get_renderer("CUDA"))
  assert len(refusals.check(grouped)) == 1 and "local buffer" in refusals.check(grouped)[0]

def test_snapshot_and_restore_undo_opts_and_their_decisions():
  k = Kernel(matmul(64, 64, 64), opts=get_renderer("OPENCL"))
  before = k.snapshot()
  k.hand_coded_optimizations()
  assert k.applied_opts and k.trace and k.full_shape != (64, 64, 64)
  k.restore(before)
  assert k.applied_opts == () and k.trace == () and k.full_shape == (64, 64, 64) and k.upcasted == k.local_dims == 0
  assert k.get_optimized_ast() == Kernel(matmul(64, 64, 64), opts=get_renderer("OPENCL")).get_optimized_ast()
  assert k.hand_coded_optimizations().applied_opts == protocol(matmul(64, 64, 64), "OPENCL").applied_opts

def test_real_axis_counts_unroll_from_the_reduce_and_group_from_its_ungrouped_part():
  k = Kernel(matvec(), opts=get_renderer("OPENCL"))  # full shape (4096, 4096), first_reduce 1
  assert [k.real_axis(o) for o in (Opt(U, 0, 4), Opt(UN, 0, 4), Opt(G, 0, 8), Opt(NL))] == [0, 1, 1, -1]
  k.apply_opt(Opt(G, 0, 8))  # (4096, 8, 512): axis 1 is grouped, so GROUP's axis 0 is now the 512
  assert k.full_shape == (4096, 8, 512) and k.real_axis(Opt(G, 0, 4)) == 2 and k.real_axis(Opt(UN, 0, 4)) == 1

def test_hand_coded_runs_the_renderers_registered_profile_then_the_spec_rules():
  seen = []
  def declines(k):  # a profile that looks and chooses nothing: the spec's rules decide
    seen.append(k.full_shape)
    return False
  register_heuristics("test_declines", declines)
  r = get_renderer("OPENCL")
  r.caps = replace(r.caps, heuristics="test_declines")
  assert Kernel(ew_add(), opts=r).hand_coded_optimizations().applied_opts == protocol(ew_add(), "OPENCL").applied_opts
  assert seen == [(1024 * 1024,)]  # called once, on the kernel (its two contiguous axes merged)
  r.caps = replace(r.caps, heuristics="no_such_profile")
  with pytest.raises(UnsupportedError, match="no_such_profile"): Kernel(ew_add(), opts=r).hand_coded_optimizations()

def test_permute_reduce_axes_last_and_bufs_order():
  k = Kernel(sum_axis(1), opts=get_renderer("CPU"))
  assert k.full_shape == (64, 256, 128) and k.output_shape == (64, 256, 1) and k.first_reduce == 2
  assert k.full_buf_index == 1 and len(k.sts) == 2 + 2 and k.reduceop is k.reduceops[0]

def test_name_is_deterministic_and_copy_is_independent():
  a = protocol(matmul(64, 64, 64), "OPENCL")
  Kernel(ew_add(), opts=get_renderer("OPENCL")).name  # building other kernels changes nothing
  b = protocol(matmul(64, 64, 64), "OPENCL")
  assert a.name == b.name and "\x1b[" not in a.name and "\x1b[" in a.display_name
  assert ansistrip(a.display_name) == a.name
  c = a.copy()
  c.apply_opt(Opt(U, 0, 2))
  assert a.applied_opts != c.applied_opts and a.full_shape == (2, 8, 16, 16, 4, 4, 4)
  assert c.full_shape == (8, 16, 16, 4, 4, 4, 2)  # the global axis of 2 is upcast whole and dropped

def test_colored_shape_pads_to_width():
  k = protocol(matvec(), "OPENCL")
  s = k.colored_shape(pad=60)
  assert ansilen(s) == 60 and ansistrip(s).split() == ["256", "4", "8", "512", "4"]

# ***** the optimized AST *****

def find(op, pred):
  return [x for x in op.lazyops if pred(x)]

def test_optimized_ast_of_matvec_has_a_local_buffer():
  k = protocol(matvec(), "OPENCL")  # (256, 4, 8, 512, 4): global, local, group, reduce, upcast
  ast = k.get_optimized_ast()
  assert ast.arg == KernelInfo(local_dims=1, upcasted=1, dont_use_locals=False)
  store_op = ast.src[0]
  second = store_op.src[0]
  assert second.op is ReduceOps.SUM and second.arg == (2,)  # the group axes
  local_load = second.src[0]
  assert local_load.op is BufferOps.LOAD and local_load.arg.idx == -1
  # (1,)*global + local and group sizes + (1,)*reduce loops + upcasted sizes
  assert local_load.arg.st.shape == (1, 4, 8, 1, 4) and local_load.arg.st.contiguous
  first = local_load.src[0].src[0]
  assert local_load.src[0].op is BufferOps.STORE and first.op is ReduceOps.SUM and first.arg == (3,)
  assert store_op.arg.st.shape == (256, 4, 1, 1, 4)
  assert {x.arg.st.shape for x in find(first, lambda x: x.op is BufferOps.LOAD)} == {(256, 4, 8, 512, 4)}
  assert k.get_optimized_ast() is ast
  k.apply_opt(Opt(U, 0, 2))
  assert k.get_optimized_ast() is not ast

def test_optimized_ast_reduce_args_without_group():
  k = protocol(matmul(1024, 1024, 1024), "CPU")  # (256, 256, 256, 4, 4, 4): axes 2 and 5 are reduced
  ast = k.get_optimized_ast()
  assert find(ast, lambda x: x.op is ReduceOps.SUM)[0].arg == (2, 5)
  assert ast.arg == KernelInfo(0, 3, False)

def test_optimized_ast_grouptop_full_reduce():
  k = protocol(sum_all(), "OPENCL")  # (256, 4096), GROUPTOP
  ast = k.get_optimized_ast()
  local = find(ast, lambda x: x.op is BufferOps.LOAD and x.arg.idx == -1)[0]
  assert local.arg.st.shape == (256, 1)
  reduces = find(ast, lambda x: x.op is ReduceOps.SUM)
  assert [r.arg for r in reduces] == [(1,), (0,)]

def test_optimized_ast_marks_nolocals():
  with config_override(NOLOCALS=1):
    assert protocol(ew_add(), "OPENCL").get_optimized_ast().arg == KernelInfo(0, 1, True)

# ***** linearize and to_program (the lowerer and uopgraph are other modules; these check the Kernel's part) *****

def test_to_program_signature_on_cpu(capsys):
  k = protocol(ew_add(), "CPU")
  p = k.to_program()
  assert p.name == "E_262144_4" and p.device == "CPU" and "E_262144_4" in p.src
  assert p.global_size is None and p.local_size is None and k.global_size is None
  assert [(a.idx, a.dtype, a.min_size, a.writable) for a in p.args] == \
         [(0, dtypes.float, 1 << 20, True), (1, dtypes.float, 1 << 20, False), (2, dtypes.float, 1 << 20, False)]
  assert p.vars == () and p.uops == tuple(k.uops) and p.op_estimate > 0 and p.mem_estimate > 0
  assert capsys.readouterr() == ("", "")  # DEBUG=0 prints nothing

@pytest.mark.parametrize("debug", [3, 4, 5])
def test_debug_levels_print_as_the_spec(debug, capsys):
  """DEBUG>=3: the name with its coloured shape, the applied opts and the optimized AST; >=4 the source too;
  >=5 every uop as well."""
  with config_override(DEBUG=debug):
    k = protocol(ew_add(), "CPU")
    p = k.to_program()
  printed = capsys.readouterr()
  assert printed.out == ""   # DEBUG output goes to stderr
  out = printed.err
  assert k.name in out and "Opt(op=OptOps.UPCAST" in out and "STORE" in out
  assert (p.src in out) == (debug >= 4)
  assert ("UOp(DEFINE_GLOBAL" in out) == (debug >= 5)

def test_to_program_launch_sizes_from_specials():
  k = protocol(ew_add(), "OPENCL")  # E_8192_32_4: one global axis of 8192, one local of 32
  p = k.to_program()
  assert p.global_size == (8192, 1, 1) and p.local_size == (32, 1, 1)
  assert k.linearize() is k

def test_to_program_vars_and_knobs(tmp_path):
  import json
  from kernopt import replay
  with config_override(CACHE_DIR=str(tmp_path), RUN_PROCESS_REPLAY=1, GRAPHUOPS=1):
    p = protocol(sym_add(), "OPENCL").to_program()
    replays = [json.loads(t) for t in replay.read(str(tmp_path / "process_replay")).values()]
  assert [v.expr for v in p.vars] == ["n"]
  assert len(replays) == 1 and replays[0]["name"] == p.name and "\n".join(replays[0]["src"]) == p.src
  assert replays[0]["capabilities"]["dialect"] == "OpenCLRenderer"
  dots = list(tmp_path.glob("graphs/*.dot"))
  assert len(dots) == 1 and dots[0].read_text().startswith("digraph")
