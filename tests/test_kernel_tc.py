"""Tensor cores: matching (dtypes, TC_OPT levels, padding), each vendor's warp layout worked by hand from the spec's
sequences, the WMMA op of the optimized AST, USE_TC=2, and all-or-nothing failure."""
from dataclasses import replace
import pytest
from test_kernel import L, U, check, matmul, protocol, ew_add
from kernopt.dtype import dtypes
from kernopt.helpers import ansistrip, config_override
from kernopt.kernel import Kernel, Opt, OptOps, TensorCoreOptions
from kernopt.ops import BufferOps, ReduceOps
from kernopt.renderers import get_renderer

TC = OptOps.TC
HALF = lambda: matmul(1024, 1024, 1024, dtypes.half)  # noqa: E731
FLOAT = lambda: matmul(1024, 1024, 1024)  # noqa: E731

def wmma_of(k):
  ast = k.get_optimized_ast()
  w = [x for x in ast.lazyops if x.op is ReduceOps.WMMA]
  return ast, w

def state(k): return (k.sts, k.applied_opts, k.upcasted, k.local_dims, k.tensor_core, k.tensor_core_opts)

# N is axis 1 (a is broadcast there), M axis 0, K axis 2. CUDA: UNROLL 8 and 2 of K, UPCAST N 2, LOCAL N 2 2,
# LOCAL M 2 2 2, UPCAST M 2, MERGE the last two upcasts; then late UPCAST M 4 (axis 0), UPCAST N 4, LOCAL N 4
CUDA_1024 = ([(TC, 0, 0), (U, 0, 4), (U, 1, 4), (L, 1, 4)], "r_16_8_2_2_2_2_2_4_64_8_2_4_4_4", "bbccccccrmmyyy")

@pytest.mark.parametrize("tc_opt", [0, 1, 2])
def test_cuda_half_matmul(tc_opt):
  with config_override(TC_OPT=tc_opt):
    k = protocol(HALF(), "CUDA")
  opts, name, colors = CUDA_1024
  check(k, [(TC, 0, tc_opt)] + opts[1:], name, colors)
  assert k.tensor_core is not None and str(k.tensor_core) == "WMMA_8_16_16_half_float"
  assert k.tensor_core_opts == TensorCoreOptions(axes=(1, 0, 2), axes_exist=(True, True), axis_pads=())
  assert dict(k.bufs_for_tensor_core) == {k.reduceop: (1, 2)}
  ast, (w,) = wmma_of(k)
  # tcd = 14 - 5 = 9: upcast (tcd, tcd+2, tcd+2), reduce (tcd, tcd+1); axis 8 (K's 64) stays a reduce loop
  assert (w.arg.dims, w.arg.dtype_in, w.arg.dtype_out, w.arg.device) == ((8, 16, 16), dtypes.half, dtypes.float, "CUDA")
  assert (w.arg.upcast_axes, w.arg.reduce_axes, w.arg.thread_local_sizes) == ((9, 11, 11), (9, 10), (8, 4, 4))
  assert w.arg.name == "WMMA_8_16_16_half_float"
  outer = [x for x in ast.lazyops if x.op is ReduceOps.SUM]
  assert len(outer) == 1 and outer[0].arg == (8,) and outer[0].src[0] is w
  assert all(s.op is BufferOps.LOAD and s.arg.st.shape == k.full_shape for s in w.src)

def test_cuda_pads_a_non_multiple_only_at_tc_opt_2():
  # N 37 % 8, M 100 % 16 and K 53 % 16 all need padding: refused below TC_OPT 2, the kernel untouched
  for level in (0, 1):
    k = Kernel(matmul(100, 37, 53, dtypes.half), opts=get_renderer("CUDA"))
    before = state(k)
    assert not k.apply_tensor_cores(tc_opt=level)
    assert state(k) == before and k.full_shape == (100, 37, 53)
  # level 2: pad to (112, 40, 64), the CUDA sequence leaves M 7 and N 5; late: 7 has no divisor in 5..2, N takes 5
  # whole (its axis vanishes, so no late LOCAL)
  k = Kernel(matmul(100, 37, 53, dtypes.half), opts=get_renderer("CUDA"))
  assert k.apply_tensor_cores(tc_opt=2)
  check(k, [(TC, 0, 2), (U, 1, 5)], "r_7_2_2_2_2_2_4_8_2_4_5", "bcccccrmmyy")
  assert k.tensor_core_opts == TensorCoreOptions(axes=(1, 0, 2), axes_exist=(False, True),
                                                 axis_pads=((1, 8), (0, 16), (2, 16)))
  _, (w,) = wmma_of(k)
  assert w.arg.upcast_axes == (7, 9, 9) and w.arg.reduce_axes == (7, 8)

def test_cuda_refuses_float_and_sm75():
  k = Kernel(FLOAT(), opts=get_renderer("CUDA"))
  assert not k.apply_tensor_cores(tc_opt=2) and k.applied_opts == ()  # dtype_in is half or bfloat16
  assert not Kernel(HALF(), opts=get_renderer("CUDA", arch="sm_75")).apply_tensor_cores()  # no tensor cores < sm_80

# METAL: UNROLL K 8, UPCAST N 2 (threads cover 4 of 8), LOCAL N 2, M 4, N 2, M 2; late UPCAST M 4, N 4, LOCAL N 4
METAL_1024 = ([(TC, 0, 0), (U, 0, 4), (U, 1, 4), (L, 1, 4)], "r_32_8_2_4_2_2_4_128_8_2_4_4", "bbcccccrmyyy")

@pytest.mark.parametrize("build,dtype_in", [(FLOAT, dtypes.float), (HALF, dtypes.half)])
def test_metal(build, dtype_in):
  k = protocol(build(), "METAL")
  check(k, *METAL_1024)
  ast, (w,) = wmma_of(k)
  # tcd = 12 - 4 = 8: every operand's fragment on tcd+1, the instruction reduces tcd; axis 7 (K's 128) is left
  assert (w.arg.dims, w.arg.dtype_in, w.arg.dtype_out) == ((8, 8, 8), dtype_in, dtypes.float)
  assert (w.arg.upcast_axes, w.arg.reduce_axes, w.arg.thread_local_sizes) == ((9, 9, 9), (8,), (2, 2, 2))
  assert [x.arg for x in ast.lazyops if x.op is ReduceOps.SUM] == [(7,)]

def test_amd_half():
  # AMD: UNROLL K 16, LOCAL N 8, N 2, M 2, then UPCAST M 8 (threads cover 2 of 16); late UPCAST M 4, N 4, LOCAL N 4
  k = protocol(HALF(), "AMD")
  check(k, [(TC, 0, 0), (U, 0, 4), (U, 1, 4), (L, 1, 4)], "r_16_4_8_2_2_4_64_16_8_4_4", "bbccccrmyyy")
  ast, (w,) = wmma_of(k)
  assert (w.arg.dims, w.arg.dtype_in, w.arg.dtype_out, w.arg.device) == ((16, 16, 16), dtypes.half, dtypes.float, "AMD")
  assert (w.arg.upcast_axes, w.arg.reduce_axes, w.arg.thread_local_sizes) == ((7, 7, 8), (7,), (16, 16, 8))
  assert [x.arg for x in ast.lazyops if x.op is ReduceOps.SUM] == [(6,)]

def test_use_tc_2_applies_the_shape_without_wmma():
  with config_override(USE_TC=2):
    k = protocol(FLOAT(), "METAL")
  # the same layout, but without a tensor core the late LOCAL of N is skipped
  check(k, [(TC, 0, 0), (U, 0, 4), (U, 1, 4)], "r_32_32_2_4_2_2_128_8_2_4_4", "bbccccrmyyy")
  assert k.tensor_core is None and k.tensor_core_opts is not None
  _, w = wmma_of(k)
  assert w == []

def test_use_tc_knob_and_argument():
  with config_override(USE_TC=0):
    assert not Kernel(FLOAT(), opts=get_renderer("METAL")).apply_tensor_cores()
  assert not Kernel(FLOAT(), opts=get_renderer("METAL")).apply_tensor_cores(use_tensor_cores=0)
  k = Kernel(FLOAT(), opts=get_renderer("METAL"))
  assert k.apply_tensor_cores(use_tensor_cores=2) and k.tensor_core is None
  with config_override(USE_TC=2):  # USE_TC=2 on a dialect without tensor cores: nothing matches
    assert not Kernel(HALF(), opts=get_renderer("OPENCL")).apply_tensor_cores()

def test_extra_opts_replace_the_late_opts():
  k = Kernel(FLOAT(), opts=get_renderer("METAL"))
  assert k.apply_tensor_cores(extra_opts=[Opt(U, 0, 4)])
  assert k.applied_opts == (Opt(TC, 0, 0), Opt(U, 0, 4))

def test_failed_extra_opt_undoes_everything():
  k = Kernel(FLOAT(), opts=get_renderer("METAL"))
  before = state(k)
  assert not k.apply_tensor_cores(extra_opts=[Opt(U, 0, 3)])  # 128 % 3 != 0
  assert state(k) == before and k.applied_opts == ()

def test_tc_opt_through_apply_opt_and_replay():
  k = Kernel(FLOAT(), opts=get_renderer("METAL")).apply_opt(Opt(TC, 0, 0))
  # before the late opts: (128, 128, 2, 4, 2, 2, 128, 8, 2)
  assert k.full_shape == (128, 128, 2, 4, 2, 2, 128, 8, 2) and k.applied_opts == (Opt(TC, 0, 0),)
  done = protocol(FLOAT(), "METAL")
  replay = Kernel(FLOAT(), opts=get_renderer("METAL"))
  for o in done.applied_opts: replay.apply_opt(o)
  assert replay.sts == done.sts and ansistrip(replay.name) == ansistrip(done.name)
  assert replay.get_optimized_ast() == done.get_optimized_ast()

def test_the_dialects_tensor_core_data_drives_the_shaping():
  # METAL's Opt sequence (UNROLL K 8, UPCAST N 2, LOCAL N 2, M 4, N 2, M 2) is data on its TensorCore: without it,
  # or without its layout, the kernel has no vendor knowledge to fall back on and refuses, untouched
  for change in ({"opts": ()}, {"layout": None}):
    r = get_renderer("METAL")
    r.caps = replace(r.caps, tensor_cores=tuple(replace(tc, **change) for tc in r.caps.tensor_cores))
    k = Kernel(FLOAT(), opts=r)
    before = state(k)
    assert not k.apply_tensor_cores() and state(k) == before
    last = k.explain().decisions[-1]
    assert last.rule == "tc.refused" and "no Opt sequence or layout" in last.reason

def test_tc_never_from_hand_coded():
  k = Kernel(FLOAT(), opts=get_renderer("METAL")).hand_coded_optimizations()
  assert k.tensor_core is None and all(o.op is not TC for o in k.applied_opts)

def test_tc_refused_on_elementwise():
  k = Kernel(ew_add(), opts=get_renderer("METAL"))
  assert not k.apply_tensor_cores() and k.applied_opts == ()

# ***** padded M / N / K on the PYTHON device emulating each vendor, against numpy *****

PADDED = [(16, 40, 24), (24, 40, 16), (20, 24, 36), (8, 16, 16)]   # (rows, K, cols) of a half matmul

@pytest.mark.parametrize("tc_opt", [0, 1, 2])
@pytest.mark.parametrize("device", ["AMD", "CUDA", "METAL"])
def test_padded_tensor_cores_match_numpy(device, tc_opt):
  """Half matmuls whose rows (axis 0), columns (axis 1, which A is broadcast along) or K are no multiple of the
  tensor core's dims: at TC_OPT 2 the tensor core pads them and applies (AMD's WMMA sees lanes 16-31 replicate A and
  B, which the emulator checks), below it the kernel falls back; every result matches numpy (float32 products on
  the tensor core, half products rounded before the float32 sum otherwise)."""
  import numpy as np
  from kernopt.runtime import Buffer, Device
  dev = Device.open("PYTHON", emulate=device)
  dims = {"AMD": (16, 16, 16), "CUDA": (8, 16, 16), "METAL": (8, 8, 8)}[device]   # tc.dims: (N cols, M rows, K)
  rng = np.random.default_rng(7)
  for rows, k_, cols in PADDED:
    with config_override(TC_OPT=tc_opt):
      k = Kernel(matmul(rows, cols, k_, dtypes.half), opts=dev.renderer).required_optimizations()
      applied = k.apply_tensor_cores()
    fits = cols % dims[0] == 0 and rows % dims[1] == 0 and k_ % dims[2] == 0
    assert applied == (fits or tc_opt == 2), (rows, k_, cols)
    a = rng.standard_normal((rows, k_)).astype(np.float16)
    b = rng.standard_normal((k_, cols)).astype(np.float16)
    out, bufs = Buffer(dev, rows * cols, dtypes.float), [Buffer(dev, x.size, dtypes.half).copyin(x) for x in (a, b)]
    dev.compile(k.to_program())(out, *bufs, wait=True)
    if applied: ref = a.astype(np.float32) @ b.astype(np.float32)
    else: ref = (a[:, :, None] * b[None]).astype(np.float32).sum(1)   # numpy's half products round like the kernel's
    np.testing.assert_allclose(out.numpy().reshape(rows, cols), ref, atol=1e-4, rtol=1e-4,
                               err_msg=str((rows, k_, cols)))
