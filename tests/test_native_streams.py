"""Non-temporal stores on the native CPU profile: which kernels stream (big elementwise float32 outputs written once),
where the fence goes (end of a serial kernel; before each chunk is reported done in the thread pool), and that the
results are exactly numpy's on one thread and on several."""
import numpy as np
import pytest
from catalogue import alu, buf, get, kernel, store
from kernopt.dtype import dtypes
from kernopt.kernel import Kernel
from kernopt.ops import BinaryOps
from kernopt.passes import vectorize
from kernopt.passes.stream_stores import loop_streams as streams
from kernopt.renderers.native import POOL_SOURCE, STREAM_MIN, NativeCRenderer
from kernopt.runtime import Buffer, Device, cpu

needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
N = STREAM_MIN   # elements of the big elementwise output

def add_ast(n: int):
  return kernel(store(alu(BinaryOps.ADD, buf(1, (n,)), buf(2, (n,)))))

def protocol(ast, renderer) -> Kernel:
  return Kernel(ast, opts=renderer).required_optimizations().hand_coded_optimizations()

def uops_of(ast, renderer=None):
  """The lowered uops with their lanes packed, as the stream-store pass of a serial kernel sees them."""
  return vectorize(protocol(ast, renderer or NativeCRenderer(vector_width=8, threads=1)).linearize().lowered_uops, 8)

def test_only_big_elementwise_outputs_stream():
  assert streams(uops_of(add_ast(N)), 8)
  assert not streams(uops_of(add_ast(N // 2)), 8)            # fits the caches: the next kernel may read it there
  assert not streams(uops_of(get("matmul_1024", "large").ast), 8)   # a reduce
  assert not streams(uops_of(add_ast(N)), 16)                 # stores not of the vector width

def test_openmp_kernels_do_not_stream():
  src = protocol(add_ast(N), NativeCRenderer(vector_width=8, threads=2, parallel="openmp")).to_program().src
  assert "ko_stream" not in src

@needs_cc
@pytest.mark.parametrize("threads", [1, 2])
def test_streamed_add_equals_numpy(threads):
  dev = Device.open("CPU", threads=threads)
  prg = protocol(add_ast(N), dev.renderer).to_program()
  assert "ko_stream_float" in prg.src or dev.renderer.caps.vector_width != 8
  if threads == 1: assert "ko_stream_fence();\n}" in prg.src   # the serial kernel's last statement
  else:   # the pool fences each chunk's stores on the thread that made them, before it reports the chunk
    assert "ko_pool1_launch(" in prg.src and "ko_fence(); if (__atomic_add_fetch(&ko_done" in POOL_SOURCE
  rng = np.random.default_rng(0)
  a, b = rng.standard_normal(N, dtype=np.float32), rng.standard_normal(N, dtype=np.float32)
  out = Buffer("CPU", N, dtypes.float32)
  for _ in range(3):   # the output read back after each launch: every line written, none stale
    out.copyin(np.full(N, np.nan, np.float32))
    dev.compile(prg)(out, Buffer("CPU", N, dtypes.float32).copyin(a), Buffer("CPU", N, dtypes.float32).copyin(b))
    np.testing.assert_array_equal(out.numpy(), a + b)
