"""Time Opt sequences for one workload against each other, interleaved on one device (medians of repeats), each
result checked against numpy: the tool for deciding a hand-coded rule.
Usage: python3 benchmarks/bench_opts.py [--device CPU|OPENCL|CUDA] [--repeats 15] W6 hand "UPCAST:1:16,UNROLL:0:2"
("hand" is the standard protocol's choice; otherwise comma-separated OP:axis:amount, applied after
required_optimizations; NOLOCALS takes no axis or amount.)"""
from __future__ import annotations
import argparse
import os
import statistics
import sys

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("..", "../tests")]
import numpy as np  # noqa: E402
from workloads import workloads  # noqa: E402
from kernopt.dtype import dtypes  # noqa: E402
from kernopt.errors import KernoptError  # noqa: E402
from kernopt.kernel import Kernel, Opt, OptOps  # noqa: E402
from kernopt.runtime import Buffer, Device  # noqa: E402

def parse(spec: str) -> list[Opt]:
  ret = []
  for part in filter(None, spec.split(",")):
    op, *rest = part.split(":")
    ret.append(Opt(OptOps[op], *(int(x) for x in rest)) if rest else Opt(OptOps[op]))
  return ret

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--device", default="CPU")
  ap.add_argument("--repeats", type=int, default=15)
  ap.add_argument("workload")
  ap.add_argument("variants", nargs="+")
  a = ap.parse_args()
  dev = Device.open(a.device)
  w = workloads()[a.workload]
  inputs = w.inputs(np.random.default_rng(0))
  bufs = {i: Buffer(dev.name, n, dtypes.float32) for i, n in w.buffers}
  for i, arr in inputs.items(): bufs[i].copyin(arr)
  ref = w.reference(inputs)
  runs = []
  for v in a.variants:
    try:
      k = Kernel(w.build(), opts=dev.renderer).required_optimizations()
      if v == "hand":
        if not k.apply_tensor_cores(): k.hand_coded_optimizations()
      else:
        for o in parse(v): k.apply_opt(o)
      prg = k.to_program()
      runner, args = dev.compile(prg), [bufs[x.idx] for x in prg.args]
      runner(*args, wait=True)
      np.testing.assert_allclose(bufs[0].numpy(), ref, rtol=w.tol, atol=w.tol * 10, err_msg=v)
    except (KernoptError, AssertionError, KeyError, ValueError) as e:
      print(f"{a.workload} {v}: {type(e).__name__}: {str(e).splitlines()[0][:150]}")
      continue
    runs.append((v, k, runner, args, []))
  for _ in range(a.repeats):
    for _, _, runner, args, times in runs: times.append(runner(*args, wait=True))
  amount, unit = (w.flops, "GFLOP/s") if w.bound == "compute" else (w.bytes, "GB/s")
  for v, k, _, _, times in runs:
    m = statistics.median(times)
    opts = ",".join(f"{o.op.name}:{o.axis}:{o.amt}" for o in k.applied_opts)
    print(f"{a.workload} {amount / m / 1e9:10.1f} {unit} (best {amount / min(times) / 1e9:.1f})  {v}  [{opts}]",
          flush=True)

if __name__ == "__main__":
  main()
