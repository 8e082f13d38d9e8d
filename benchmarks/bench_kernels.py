"""Kernel benchmarks: for each workload (benchmarks/workloads.py), cold codegen (fresh AST: Kernel + standard protocol
+ linearize + render), first compile with the disk cache off, and kernel time (median, min-max over repeats) next to
single-threaded numpy on the same math, runs interleaved, plus this machine's copy bandwidth from the same run.
Usage: python3 benchmarks/bench_kernels.py [--device CPU|OPENCL] [--repeats N] [--workloads W1,W2] [--threads N]"""
from __future__ import annotations
import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any, Callable

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("..", "../tests")]
import numpy as np  # noqa: E402
from workloads import Workload, workloads  # noqa: E402
from kernopt.dtype import dtypes  # noqa: E402
from kernopt.helpers import config_override  # noqa: E402
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.runtime import Buffer, Device  # noqa: E402

def numpy_single_thread() -> tuple[Any, str]:
  """A context limiting numpy's BLAS to one thread, and a note saying how."""
  try:
    from threadpoolctl import threadpool_limits
    return threadpool_limits(1), "threadpoolctl: 1 thread"
  except ImportError:
    return contextlib.nullcontext(), "threadpoolctl missing: numpy's BLAS may use several threads"

def copy_bandwidth(repeats: int) -> float:
  """Bytes per second of np.copyto on 64 MiB of float32, counting read + write; median over repeats."""
  src = np.random.default_rng(0).standard_normal(16 << 20, dtype=np.float32)
  dst = np.empty_like(src)
  np.copyto(dst, src)
  times = []
  for _ in range(max(repeats, 5)):
    t0 = time.perf_counter()
    np.copyto(dst, src)
    times.append(time.perf_counter() - t0)
  return 2 * src.nbytes / statistics.median(times)

def optimize(ast: Any, renderer: Any) -> Kernel:
  k = Kernel(ast, opts=renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def cold_codegen_ms(w: Workload, renderer: Any, repeats: int) -> float:
  times = []
  for _ in range(repeats):
    ast = w.build()
    t0 = time.perf_counter()
    optimize(ast, renderer).to_program()
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)

def timed(fn: Callable[[], Any]) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0

def bench(w: Workload, dev: Any, repeats: int) -> dict[str, Any]:
  codegen = cold_codegen_ms(w, dev.renderer, repeats)
  k = optimize(w.build(), dev.renderer)
  prg = k.to_program()
  with config_override(DISABLE_CACHE=1):
    t0 = time.perf_counter()
    runner = dev.compile(prg)
    compile_ms = 1e3 * (time.perf_counter() - t0)
  rng = np.random.default_rng(0)
  inputs = w.inputs(rng)
  bufs = {idx: Buffer(dev.name, numel, dtypes.float32) for idx, numel in w.buffers}
  for idx, arr in inputs.items(): bufs[idx].copyin(arr)
  args = [bufs[a.idx] for a in prg.args]
  runner(*args, wait=True)
  ref = w.reference(inputs)
  got = bufs[0].numpy()
  scale = max(1.0, float(np.abs(ref).max()))
  np.testing.assert_allclose(got, ref, rtol=w.tol, atol=w.tol * scale, err_msg=f"{w.name} is wrong")
  ours, theirs = [], []
  for _ in range(repeats):  # interleaved, so both see the same machine load
    ours.append(runner(*args, wait=True))
    theirs.append(timed(lambda: w.reference(inputs)))
  return dict(codegen=codegen, compile=compile_ms, ours=ours, numpy=theirs, opts=k.applied_opts, name=prg.name)

def rate(w: Workload, secs: float) -> str:
  if w.bound == "memory": return f"{w.bytes / secs / 1e9:7.1f} GB/s"
  return f"{w.flops / secs / 1e9:7.1f} GFLOP/s"

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--device", default="CPU")
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--workloads", default="")
  ap.add_argument("--threads", type=int, default=None, help="CPU only: threads of our kernels (default: the device's)")
  a = ap.parse_args()
  all_w = workloads()
  names = [n.strip() for n in a.workloads.split(",") if n.strip()] or list(all_w)
  opts = {"threads": a.threads} if a.threads is not None and a.device.upper() == "CPU" else {}
  dev = Device.open(a.device, **opts)
  limit, note = numpy_single_thread()
  with limit:
    bw = copy_bandwidth(a.repeats)
    print(f"device {dev.name}: {dev.renderer!r}; numpy: {note}; repeats {a.repeats}")
    print(f"copy bandwidth (np.copyto 64 MiB, read+write): {bw / 1e9:.1f} GB/s")
    hdr = (f"{'wl':3s} {'workload':42s} {'codegen':>8s} {'compile':>8s} {'ours ms (min-max)':>24s} {'ours':>15s} "
           f"{'numpy ms':>9s} {'numpy':>15s} {'ours/np':>8s} {'ours/copy':>9s}")
    print(hdr)
    print("-" * len(hdr))
    applied = []
    for n in names:
      w = all_w[n]
      try: r = bench(w, dev, a.repeats)
      except Exception as e:  # a codegen, compile or correctness failure: report it and go on
        print(f"{w.name:3s} {w.desc:42s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
        continue
      om, nm = statistics.median(r["ours"]), statistics.median(r["numpy"])
      rng = f"{1e3 * om:8.2f} ({1e3 * min(r['ours']):.2f}-{1e3 * max(r['ours']):.2f})"
      vs_copy = f"{w.bytes / om / bw:9.2f}" if w.bound == "memory" else f"{'':>9s}"
      print(f"{w.name:3s} {w.desc:42s} {r['codegen']:6.1f}ms {r['compile']:6.0f}ms {rng:>24s} {rate(w, om):>15s} "
            f"{1e3 * nm:9.2f} {rate(w, nm):>15s} {nm / om:7.2f}x {vs_copy}", flush=True)
      applied.append(f"{w.name} {r['name']}: {list(r['opts'])}")
  print("ours/np > 1: ours is faster; ours/copy: the kernel's bandwidth over np.copyto's (memory-bound workloads)")
  print("applied opts:")
  for line in applied: print("  " + line)

if __name__ == "__main__":
  main()
