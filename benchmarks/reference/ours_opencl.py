"""Our hand-coded kernels (standard protocol) on the OPENCL device for every workload: median and best of REPS
launches, in the units of tinygrad_opencl.py, which benchmarks/reference/vs_reference.sh alternates with this."""
import os
import statistics
import sys
sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("../..", "..", "../../tests")]
import numpy as np  # noqa: E402
from workloads import workloads  # noqa: E402
from kernopt.dtype import dtypes  # noqa: E402
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.runtime import Buffer, Device  # noqa: E402

REPS = int(os.environ.get("REPS", 15))
dev = Device.open("OPENCL")
only = [n for n in os.environ.get("WORKLOADS", "").split(",") if n]
for name, w in workloads().items():
  if only and name not in only: continue
  inputs = w.inputs(np.random.default_rng(0))
  bufs = {i: Buffer(dev.name, n, dtypes.float32) for i, n in w.buffers}
  for i, arr in inputs.items(): bufs[i].copyin(arr)
  k = Kernel(w.build(), opts=dev.renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  prg = k.to_program()
  runner, args = dev.compile(prg), [bufs[a.idx] for a in prg.args]
  runner(*args, wait=True)
  np.testing.assert_allclose(bufs[0].numpy(), w.reference(inputs), rtol=w.tol, atol=w.tol * 10)
  times = [runner(*args, wait=True) for _ in range(REPS)]
  amount, unit = (w.flops, "GF/s") if w.bound == "compute" else (w.bytes, "GB/s")
  print(f"ours {name} {amount / statistics.median(times) / 1e9:7.1f} {unit} (best {amount / min(times) / 1e9:.1f})",
        flush=True)
