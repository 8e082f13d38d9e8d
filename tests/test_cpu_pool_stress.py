"""The native CPU pool under many small launches: a worker that wakes after a launch has returned must not run that
launch's job (its arguments lived in the launcher's stack frame, and the job's loads hoisted above the parallel loop
read through them). Run in a subprocess, so a crash is a failure of this test, not of the test runner."""
import os
import subprocess
import sys
import pytest
from kernopt.runtime import cpu

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")

_STRESS = r"""
import sys
import numpy as np
from catalogue import alu, buf, kernel, reduce, store, view
from kernopt.dtype import dtypes
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BinaryOps, ReduceOps
from kernopt.runtime import Buffer, Device

launches, threads = int(sys.argv[1]), int(sys.argv[2])
dev = Device.open("CPU", threads=threads, parallel="pthread", min_parallel_work=0)
N = 2048
# (2, N) broadcast multiply, UPCAST(0, 0): the two loads of buffer 1 are hoisted above the parallel loop
col, row = buf(1, (2, N), st=view((2, N), (1, 0))), buf(2, (2, N), st=view((2, N), (0, 1)))
mul = kernel(store(alu(BinaryOps.MUL, col, row)))
k = Kernel(mul, opts=dev.renderer)
k.apply_opt(Opt(OptOps.UPCAST, 0, 0))
prg_mul = k.to_program()
assert "ko_pool1_claim" in prg_mul.src and prg_mul.src.index("data1[0]") < prg_mul.src.index("ko_pool1_claim(ko_ctx)")
# a row sum of (64, 32): an accumulator inside the parallel loop
rows = kernel(store(reduce(ReduceOps.SUM, buf(1, (64, 32)), (1,))))
prg_sum = Kernel(rows, opts=dev.renderer).to_program()
assert "ko_pool1_claim" in prg_sum.src
run_mul, run_sum = dev.compile(prg_mul), dev.compile(prg_sum)
rng = np.random.default_rng(0)
pairs = []
for _ in range(3):
  a, b = rng.standard_normal(2).astype(np.float32), rng.standard_normal(N).astype(np.float32)
  pairs.append((Buffer("CPU", 2, dtypes.float).copyin(a), Buffer("CPU", N, dtypes.float).copyin(b),
                (a[:, None] * b[None, :]).ravel()))
m = rng.integers(-8, 8, (64, 32)).astype(np.float32)
M, want_sum = Buffer("CPU", 64 * 32, dtypes.float).copyin(m), m.sum(axis=1)
bad = 0
for i in range(launches):
  A, B, want = pairs[i % 3]
  out = Buffer("CPU", 2 * N, dtypes.float)   # a fresh allocation each time: a stale pointer does not stay valid
  run_mul(out, A, B)
  bad += not np.array_equal(out.numpy(), want)
  if i % 4 == 0:
    s = Buffer("CPU", 64, dtypes.float)
    run_sum(s, M)
    bad += not np.array_equal(s.numpy(), want_sum)
print("launches", launches + (launches + 3) // 4, "wrong", bad)
sys.exit(1 if bad else 0)
"""

@pytest.mark.parametrize("threads", [2, 3])
def test_pool_survives_many_small_launches(threads):
  """25,000 launches of two small parallel kernels, every result compared with numpy. Before the fix
  (a late worker ran the finished launch's job) this died of SIGSEGV within about 30,000 launches of a 2x1024 one."""
  tests = os.path.dirname(os.path.abspath(__file__))
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
  p = subprocess.run([sys.executable, "-c", _STRESS, "20000", str(threads)], env=env, capture_output=True, text=True,
                     timeout=120)
  assert p.returncode == 0, f"rc {p.returncode}\n{p.stdout}\n{p.stderr[-3000:]}"
  assert "wrong 0" in p.stdout
