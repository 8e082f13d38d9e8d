"""Parallel launch on the CPU device: the outermost non-reduce loop is split across threads (OpenMP, or the process's
one pthread pool that every parallel kernel calls); every output element is computed by one thread in the same order,
so results are bit-identical to one thread for ints and floats alike."""
import numpy as np
import pytest
from catalogue import get, run_program
from kernopt.dtype import dtypes
from kernopt.helpers import config_override
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.renderers.native import NativeCRenderer
from kernopt.runtime import Buffer, Device
from kernopt.runtime import cpu
from kernopt.uops import UOp, UOps

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")

def run_case(name: str, scale: str = "small", **device_options):
  """(source, outputs) of catalogue case `name` under the standard protocol on Device.open("CPU", **options)."""
  case, dev = get(name, scale), Device.open("CPU", min_parallel_work=0, **device_options)
  k = Kernel(case.ast, opts=dev.renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  prg = k.to_program()
  outs = []
  for _, got, ref in run_program(dev, case, prg, seed=7):
    for b in case.outputs:
      np.testing.assert_allclose(got[b.idx].astype(np.float64), ref[b.idx].astype(np.float64),
                                 rtol=max(case.tol * 10, 0), atol=case.tol * 10)
      outs.append(got[b.idx])
  return prg.src, outs

BIT_EXACT = ["int_ops", "max_reduce_int", "idiv_mod", "matmul_512", "sum_axis0", "sum_axis1", "max_axis1", "conv2d",
             "two_outputs", "sym_add", "sym_sum", "pad", "matmul_half"]

@pytest.mark.parametrize("name", BIT_EXACT)
def test_threads_bit_identical(name):
  src1, one = run_case(name, threads=1)
  src2, omp = run_case(name, threads=2, parallel="openmp")
  src3, pth = run_case(name, threads=3, parallel="pthread")
  assert "#pragma omp" not in src1 and "ko_pool1_launch(" not in src1
  assert "num_threads(2)" in src2 and "ko_pool1_launch(" in src3
  for a, b, c in zip(one, omp, pth):
    assert a.tobytes() == b.tobytes() == c.tobytes()

def test_thread_count_is_in_the_source():
  """so the compiled-binary cache key changes with it"""
  src2, _ = run_case("add", threads=2, parallel="openmp")
  src4, _ = run_case("add", threads=4, parallel="openmp")
  assert "num_threads(2)" in src2 and "num_threads(4)" in src4
  src3, _ = run_case("add", threads=3, parallel="pthread")
  assert ", 3);" in src3 and "ko_pool1_launch(" in src3

def test_threads_default_from_config():
  with config_override(CPU_THREADS=3): assert NativeCRenderer().caps.threads == 3
  with config_override(CPU_THREADS=0): assert NativeCRenderer().caps.threads >= 1
  assert NativeCRenderer(threads=1).caps.parallel == "none"

def test_small_kernels_run_on_one_thread():
  src, _ = Device.open("CPU", threads=2).renderer, None
  k = Kernel(get("add").ast, opts=src).required_optimizations().hand_coded_optimizations()
  assert "pthread" not in k.to_program().src
  big = NativeCRenderer(threads=2, min_parallel_work=0)
  assert "ko_pool1_launch(" in Kernel(get("add").ast, opts=big).hand_coded_optimizations().to_program().src

def test_no_parallel_loop_without_global_loops():
  """A full reduce has only its reduce loop: running it on several threads would change the order of the sum."""
  src, _ = run_case("sum_all", threads=2)
  assert "#pragma omp" not in src

def test_no_parallel_loop_when_an_accumulator_is_outside():
  from kernopt.passes.parallel import parallel_loop
  zero, four = UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 4)
  rng = UOp(UOps.RANGE, dtypes.int32, (zero, four), (0, False))
  acc = UOp(UOps.DEFINE_ACC, dtypes.float32, (rng,), (0.0, 0))
  assert parallel_loop([zero, four, rng, UOp(UOps.ENDRANGE, None, (rng,))]) is rng
  assert parallel_loop([zero, four, acc, rng, UOp(UOps.ENDRANGE, None, (rng,))]) is None
  red = UOp(UOps.RANGE, dtypes.int32, (zero, four), (0, True))
  assert parallel_loop([zero, four, red, UOp(UOps.ENDRANGE, None, (red,))]) is None

def test_fewer_iterations_than_threads():
  """An outer loop of 2 iterations on 5 threads: idle workers, every element written once."""
  case, dev = get("matmul_64"), Device.open("CPU", threads=5, parallel="pthread", min_parallel_work=0,
                                                 vector_width=8)
  k = Kernel(case.ast, opts=dev.renderer)
  for o in (Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 8)): k.apply_opt(o)
  prg = k.to_program()
  assert prg.name.startswith("r_2_") and "ko_pool1_launch(" in prg.src
  ins = case.inputs(np.random.default_rng(0))
  out = Buffer("CPU", 64 * 64, dtypes.float).copyin(np.full(64 * 64, np.nan, np.float32))
  a, b = (Buffer("CPU", 64 * 64, dtypes.float).copyin(ins[i]) for i in (1, 2))
  dev.compile(prg)(out, a, b)
  np.testing.assert_allclose(out.numpy().reshape(64, 64), case.reference(ins, {})[0].reshape(64, 64), rtol=1e-4,
                             atol=1e-4)

def test_pool_repeated_and_concurrent_launches():
  """The pool serves many launches in a row and launches from several Python threads at once (ctypes releases the
  GIL), each result complete and exact."""
  import threading
  case, dev = get("matmul_64"), Device.open("CPU", threads=3, parallel="pthread", min_parallel_work=0)
  k = Kernel(case.ast, opts=dev.renderer).required_optimizations().hand_coded_optimizations()
  runner = dev.compile(k.to_program())
  ins = case.inputs(np.random.default_rng(2))
  a, b = (Buffer("CPU", 64 * 64, dtypes.float).copyin(ins[i]) for i in (1, 2))
  first = Buffer("CPU", 64 * 64, dtypes.float)
  runner(first, a, b)
  want = first.numpy().tobytes()
  outs = [Buffer("CPU", 64 * 64, dtypes.float) for _ in range(4)]
  bad: list[int] = []
  def work(out: Buffer) -> None:
    for i in range(25):
      out.copyin(np.full(64 * 64, np.nan, np.float32))
      runner(out, a, b)
      if out.numpy().tobytes() != want: bad.append(i)
  threads = [threading.Thread(target=work, args=(o,)) for o in outs]
  for t in threads: t.start()
  for t in threads: t.join()
  assert not bad and all(o.numpy().tobytes() == want for o in outs)

def test_short_outer_loop_collapsed_with_the_next():
  """conv2d's outer loop (few channel tiles) is split together with the row loop inside it: one flat index, many
  small chunks, every output element still computed by one thread in the same order. (The large conv: the small
  one's 8 channels are one tile, leaving a single loop.)"""
  src1, one = run_case("conv2d", "large", threads=1)
  src3, pth = run_case("conv2d", "large", threads=3, parallel="pthread")
  assert "for (int64_t ridx0_f = " in src3 and "int32_t ridx1 = (int32_t)(0) + (int32_t)(ridx0_f % " in src3
  assert all(a.tobytes() == b.tobytes() for a, b in zip(one, pth))
  src2, _ = run_case("conv2d", "large", threads=2, parallel="openmp")
  assert "_f /" not in src2

def test_collapse_rules():
  """Only a non-reduce loop with constant bounds, nested right inside the parallel loop, and never a reduce block."""
  from kernopt.renderers.native import collapsed_loop, native_context
  from kernopt.uops import Mark
  r = NativeCRenderer(vector_width=8, threads=2, min_parallel_work=0, l2_bytes=512 << 10)   # K = 1024 in 4 blocks
  zero, four = UOp.const(dtypes.int32, 0), UOp.const(dtypes.int32, 4)
  outer = UOp(UOps.RANGE, dtypes.int32, (zero, four), (0, False))
  inner = UOp(UOps.RANGE, dtypes.int32, (zero, four), (1, False))
  red = UOp(UOps.RANGE, dtypes.int32, (zero, four), (1, True))
  def nest(i: UOp) -> list[UOp]:
    return [zero, four, outer, i, UOp(UOps.ENDRANGE, None, (i,)), UOp(UOps.ENDRANGE, None, (outer,))]
  assert collapsed_loop(nest(inner), outer) is inner
  assert collapsed_loop(nest(red), outer) is None
  par = UOp(UOps.RANGE, dtypes.int32, (zero, four), (0, False, Mark.PARALLEL))
  marked = [zero, four, par, inner, UOp(UOps.ENDRANGE, None, (inner,)), UOp(UOps.ENDRANGE, None, (par,))]
  assert native_context(marked, "pthread").inner is inner and native_context(marked, "openmp").inner is None
  case = get("matmul_1024", "large")
  k = Kernel(case.ast, opts=r).required_optimizations().hand_coded_optimizations()
  ctx = native_context(k.linearize().uops, "pthread")   # the passes split its reduce into blocks
  assert ctx.loop is not None and ctx.blocks and ctx.inner is None

def _threads_now() -> int:
  import os
  return len(os.listdir(f"/proc/{os.getpid()}/task"))

@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_every_parallel_kernel_shares_one_pool():
  """Parallel kernels call one pool per process (renderers/native.py POOL_SOURCE, loaded once by the CPU device), so
  loading many kernels adds no threads (before, each shared object started its own threads - 1 workers: a framework's
  few hundred kernels kept hundreds of idle threads). 12 distinct kernels at 3 threads, each checked against numpy."""
  from kernopt import ast as A
  dev = Device.open("CPU", threads=3, parallel="pthread", min_parallel_work=0)
  x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
  inp = Buffer(dev, x.size, dtypes.float).copyin(x)
  counts = []
  for i in range(12):
    ast = A.kernel(A.store(0, A.mul(A.load(1, dtypes.float, (64, 64)), float(i) + 0.5)))
    prg = Kernel(ast, opts=dev.renderer).hand_coded_optimizations().to_program()
    assert "ko_pool1_launch(" in prg.src and "pthread_create" not in prg.src
    out = Buffer(dev, x.size, dtypes.float)
    dev.compile(prg)(out, inp, wait=True)
    np.testing.assert_array_equal(out.numpy(), x * np.float32(i + 0.5))
    counts.append(_threads_now())
  assert max(counts) == counts[0], counts

def test_pool_workers_spin_briefly_then_sleep():
  """A worker spins for the next launch for POOL_SPIN_NS (0.1 ms), then sleeps: launches back to back and after
  gaps longer than the spin all give numpy's numbers, and over a 0.3 s pause after them the process uses almost no
  CPU (a worker that never stopped spinning would use the whole pause; the bound leaves 0.1 s for the host)."""
  import time
  from kernopt import ast as A
  from kernopt.renderers.native import POOL_SPIN_NS
  n = 1 << 16
  dev = Device.open("CPU", threads=2, parallel="pthread", min_parallel_work=0)
  runner = dev.compile(Kernel(A.kernel(A.store(0, A.add(A.load(1, dtypes.float, (n,)), 1.0))),
                              opts=dev.renderer).hand_coded_optimizations().to_program())
  x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
  xb = Buffer(dev, n, dtypes.float).copyin(x)
  for gap in (0, 0, 10 * POOL_SPIN_NS / 1e9, 0, 2 * POOL_SPIN_NS / 1e9, 0.02):
    time.sleep(gap)
    out = Buffer(dev, n, dtypes.float)
    runner(out, xb, wait=True)
    np.testing.assert_array_equal(out.numpy(), x + np.float32(1))
  c0 = time.process_time()
  time.sleep(0.3)
  assert time.process_time() - c0 < 0.1

@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_child_forked_during_a_launch_on_another_thread_can_launch():
  """fork while another thread is inside a parallel launch (an independent tester: the child inherited the pool's
  launch lock held and hung in about half of 20 forks). The pool's fork handlers wait for that launch and give the
  child free locks and no workers; each child's own parallel launch must finish, right, within 20 s."""
  import os
  import threading
  import time
  from kernopt import ast as A
  n = 1 << 18
  dev = Device.open("CPU", threads=2, parallel="pthread", min_parallel_work=0)
  ast = A.kernel(A.store(0, A.mul(A.load(1, dtypes.float, (n,)), 3.0)))
  runner = dev.compile(Kernel(ast, opts=dev.renderer).hand_coded_optimizations().to_program())
  x = np.arange(n, dtype=np.float32)
  xb = Buffer(dev, n, dtypes.float).copyin(x)
  stop = threading.Event()
  def busy():
    out = Buffer(dev, n, dtypes.float)
    while not stop.is_set(): runner(out, xb, wait=True)
  th = threading.Thread(target=busy, daemon=True)
  th.start()
  try:
    for _ in range(8):
      time.sleep(0.005)
      if (pid := os.fork()) == 0:
        import signal
        signal.alarm(20)   # a hung child dies of SIGALRM instead of hanging the test
        out = Buffer(dev, n, dtypes.float)
        runner(out, xb, wait=True)
        os._exit(0 if np.array_equal(out.numpy(), x * 3) else 3)
      _, status = os.waitpid(pid, 0)
      assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
  finally:
    stop.set()
    th.join()
