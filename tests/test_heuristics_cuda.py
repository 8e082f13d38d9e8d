"""The CUDA device profile's hand-coded rules (kernopt/heuristics_cuda.py): which Opts they choose, that the static
profile keeps the spec's, and that the chosen kernels compute the right numbers, run on PoCL (a device with local
threads and shared memory; CI has no GPU, scripts/gpu_run.sh runs them on one)."""
import numpy as np
import pytest
import catalogue
from catalogue import _matmul_ast, alu, buf, kernel, reduce, store
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BinaryOps, ReduceOps
from kernopt.renderers.cuda import CUDARenderer
from kernopt.errors import UnsupportedError

PROFILE, STATIC = CUDARenderer("sm_90", heuristics="cuda_gpu"), CUDARenderer("sm_90")

def row_sum(rows, cols): return kernel(store(reduce(ReduceOps.SUM, buf(1, (rows, cols)), (1,))))

def add(n): return kernel(store(alu(BinaryOps.ADD, buf(1, (n,)), buf(2, (n,)))))

def opts_of(ast, renderer):
  k = Kernel(ast, opts=renderer).required_optimizations().hand_coded_optimizations()
  return [(o.op, o.axis, o.amt) for o in k.applied_opts]

def test_many_rows_are_split_across_a_block():
  assert opts_of(row_sum(4096, 4096), PROFILE) == [(OptOps.GROUPTOP, 0, 128), (OptOps.UNROLL, 1, 4)]
  assert opts_of(row_sum(4096, 4096), STATIC) == [(OptOps.UNROLL, 0, 4), (OptOps.LOCAL, 0, 32)]   # the spec's
  # few rows: the spec's own GROUPTOP rule applies; a row not a multiple of 512: the spec's rules too
  assert opts_of(row_sum(1024, 4096), PROFILE) == opts_of(row_sum(1024, 4096), STATIC)
  assert opts_of(row_sum(4096, 4000), PROFILE) == opts_of(row_sum(4096, 4000), STATIC)

def test_elementwise_blocks_are_four_warps():
  assert opts_of(add(1 << 20), PROFILE) == [(OptOps.UPCAST, 0, 4), (OptOps.LOCAL, 0, 128)]
  assert opts_of(add(1 << 20), STATIC) == [(OptOps.UPCAST, 0, 4), (OptOps.LOCAL, 0, 32)]
  assert opts_of(add(512), PROFILE) == opts_of(add(512), STATIC)   # fewer than two blocks' worth

def test_matmul_tiles_widen_and_small_grids_split_the_reduce():
  spec = [(OptOps.UPCAST, 1, 4), (OptOps.UPCAST, 0, 4), (OptOps.UNROLL, 0, 4), (OptOps.LOCAL, 0, 8),
          (OptOps.LOCAL, 1, 16)]
  assert opts_of(_matmul_ast(1024, 1024, 1024), STATIC) == spec
  assert opts_of(_matmul_ast(1024, 1024, 1024), PROFILE) == spec + [(OptOps.UPCAST, 3, 2)]   # 512 blocks
  assert opts_of(_matmul_ast(512, 512, 512), PROFILE) == spec + [(OptOps.UPCAST, 3, 2), (OptOps.GROUPTOP, 0, 4)]
  conv = catalogue.get("conv2d").ast   # three local axes: no wider tile; a small grid: split
  assert opts_of(conv, PROFILE) == opts_of(conv, STATIC) + [(OptOps.GROUPTOP, 0, 4)]

def test_the_grid_threshold_scales_with_the_multiprocessors():
  """A 512^3 matmul's 128 blocks are a small grid for the 132 SMs the rules were measured on (and for an unknown
  GPU), not for 28 SMs (threshold 109)."""
  mm = _matmul_ast(512, 512, 512)
  split = (OptOps.GROUPTOP, 0, 4)
  assert split in opts_of(mm, PROFILE)
  assert split in opts_of(mm, CUDARenderer("sm_90", heuristics="cuda_gpu", sm_count=132))
  assert split not in opts_of(mm, CUDARenderer("sm_86", heuristics="cuda_gpu", sm_count=28))
  with pytest.raises(UnsupportedError): CUDARenderer("sm_90", sm_count=0)

def test_profile_is_part_of_the_capabilities():
  assert PROFILE.capabilities()["heuristics"] == "cuda_gpu" and STATIC.capabilities()["heuristics"] == "spec"
  with pytest.raises(UnsupportedError): CUDARenderer("sm_90", heuristics="fast")

CASES = {"row_sum": (row_sum(4096, 512), lambda x: {1: x(4096 * 512)}, lambda xs: xs[1].reshape(4096, 512).sum(1)),
         "add": (add(1 << 16), lambda x: {1: x(1 << 16), 2: x(1 << 16)}, lambda xs: xs[1] + xs[2]),
         "matmul": (_matmul_ast(1024, 1024, 32), lambda x: {1: x(1024 * 32), 2: x(32 * 1024)},
                    lambda xs: (xs[1].reshape(1024, 32) @ xs[2].reshape(32, 1024)).reshape(-1)),
         "matmul_split": (_matmul_ast(512, 512, 64), lambda x: {1: x(512 * 64), 2: x(64 * 512)},
                          lambda xs: (xs[1].reshape(512, 64) @ xs[2].reshape(64, 512)).reshape(-1))}

@pytest.mark.parametrize("name", CASES)
def test_the_chosen_kernels_match_numpy_on_pocl(name):
  """The profile's Opts, applied to the same AST for PoCL's static OpenCL profile (local threads, shared memory,
  the spec's float4 accesses) and run there, the output filled with NaN first."""
  pytest.importorskip("pyopencl", reason="pyopencl is not installed")
  from kernopt.dtype import dtypes
  from kernopt.renderers.opencl import OpenCLRenderer
  from kernopt.runtime import Buffer, Device
  from kernopt.runtime.opencl import OpenCLDevice
  ok, why = OpenCLDevice.availability()
  if not ok: pytest.skip(f"no OpenCL platform: {why}")
  ast, make_inputs, reference = CASES[name]
  dev = Device["OPENCL"]
  opts = opts_of(ast, PROFILE)
  assert opts != opts_of(ast, STATIC)
  c = dev.renderer.caps
  k = Kernel(ast, opts=OpenCLRenderer(local_max=c.local_max, max_local_size=c.max_local_size))
  for o in opts: k.apply_opt(Opt(*o))
  prg = k.to_program()
  rng = np.random.default_rng(5)
  xs = make_inputs(lambda n: rng.standard_normal(n, dtype=np.float32))
  want = reference(xs)
  out = Buffer("OPENCL", want.size, dtypes.float32).copyin(np.full(want.size, np.nan, np.float32))
  bufs = {0: out, **{i: Buffer("OPENCL", x.size, dtypes.float32).copyin(x) for i, x in xs.items()}}
  dev.compile(prg)(*[bufs[a.idx] for a in prg.args], wait=True)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-4, atol=1e-3)

CHANGED = [c.name for c in catalogue.catalogue("small") if "image" not in c.name and c.var_vals == ({},) and
           opts_of(c.ast, PROFILE) != opts_of(c.ast, STATIC)]

@pytest.mark.parametrize("name", CHANGED)
def test_catalogue_kernels_the_profile_changes_match_numpy_on_pocl(name):
  """Every small-catalogue case whose Opts the profile changes, run with those Opts on PoCL's static profile."""
  pytest.importorskip("pyopencl", reason="pyopencl is not installed")
  from kernopt.renderers.opencl import OpenCLRenderer
  from kernopt.runtime import Buffer, Device
  from kernopt.runtime.opencl import OpenCLDevice
  ok, why = OpenCLDevice.availability()
  if not ok: pytest.skip(f"no OpenCL platform: {why}")
  case, dev = catalogue.get(name), Device["OPENCL"]
  r = dev.renderer
  k = Kernel(case.ast, opts=OpenCLRenderer(local_max=r.caps.local_max, max_local_size=r.caps.max_local_size))
  for o in opts_of(case.ast, PROFILE): k.apply_opt(Opt(*o))
  prg = k.to_program()
  inputs = case.inputs(np.random.default_rng(3))
  bufs = {b.idx: Buffer("OPENCL", b.numel, b.dtype).copyin(np.full(b.numel, np.nan, b.np_dtype) if b.output else
                                                          inputs[b.idx]) for b in case.buffers}
  dev.compile(prg)(*[bufs[a.idx] for a in prg.args], wait=True)
  for idx, want in case.reference(inputs).items():
    np.testing.assert_allclose(bufs[idx].numpy().reshape(want.shape), want, rtol=max(case.tol, 1e-4), atol=1e-4)
