"""Kernel benchmarks: for each workload (benchmarks/workloads.py) and each thread count, cold codegen (fresh AST:
Kernel + standard protocol + linearize + render), first compile with the disk cache off, and kernel time (median,
min-max over repeats) next to numpy on the same math at the same thread count (threadpoolctl), all runs of a workload
interleaved (ours and numpy at every thread count, and for memory-bound workloads np.copyto of 64 MiB, whose
bandwidth the kernel is compared with), so every figure sees the same machine load.
Usage: python3 benchmarks/bench_kernels.py [--device CPU|OPENCL] [--repeats N] [--workloads W1,W2] [--threads 1,2]
                                          [--profile native|static]
The workloads `softmax` and `layernorm` are rows of their own: one fused kernel against the split version.
(--profile static: the spec's C dialect on one thread, with the spec's own choice of opts.)"""
from __future__ import annotations
import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any, Callable, Optional

sys.path[:0] = [os.path.join(os.path.dirname(os.path.abspath(__file__)), p) for p in ("..", "../tests")]
# numpy's OpenBLAS workers spin on the other core for ~0.1 s after each call, which takes that core from our next
# (interleaved) launch; let them sleep after 4 time units instead (numpy then pays for waking them, as a caller would)
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
import numpy as np  # noqa: E402
from workloads import Workload, workloads  # noqa: E402
from kernopt.dtype import dtypes  # noqa: E402
from kernopt.helpers import config_override  # noqa: E402
from kernopt.kernel import Kernel  # noqa: E402
from kernopt.runtime import Buffer, Device  # noqa: E402

def numpy_threads(n: Optional[int]) -> Any:
  """A context limiting numpy's BLAS (and OpenMP) pools to n threads (no limit for None)."""
  if n is None: return contextlib.nullcontext()
  from threadpoolctl import threadpool_limits
  return threadpool_limits(n)

def threadpool_note() -> str:
  try:
    import threadpoolctl
    return f"threadpoolctl {threadpoolctl.__version__}: numpy at our thread count"
  except ImportError:
    return "threadpoolctl missing: numpy's BLAS uses its own thread count"

class Copy:
  """np.copyto of 64 MiB of float32; bandwidth counts read + write."""
  def __init__(self) -> None:
    self.src = np.random.default_rng(0).standard_normal(16 << 20, dtype=np.float32)
    self.dst = np.empty_like(self.src)
    np.copyto(self.dst, self.src)
  def __call__(self) -> float: return timed(lambda: np.copyto(self.dst, self.src))
  def bandwidth(self, secs: float) -> float: return 2 * self.src.nbytes / secs

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

def prepare(w: Workload, dev: Any, repeats: int, inputs: dict[int, np.ndarray]) -> dict[str, Any]:
  """Codegen and compile figures, a checked runner and its arguments."""
  codegen = cold_codegen_ms(w, dev.renderer, repeats)
  k = optimize(w.build(), dev.renderer)
  prg = k.to_program()
  with config_override(DISABLE_CACHE=1):
    t0 = time.perf_counter()
    runner = dev.compile(prg)
    compile_ms = 1e3 * (time.perf_counter() - t0)
  bufs = {idx: Buffer(dev.name, numel, dtypes.float32) for idx, numel in w.buffers}
  for idx, arr in inputs.items(): bufs[idx].copyin(arr)
  args = [bufs[a.idx] for a in prg.args]
  runner(*args, wait=True)
  ref = w.reference(inputs)
  got = bufs[0].numpy()
  scale = max(1.0, float(np.abs(ref).max()))
  np.testing.assert_allclose(got, ref, rtol=w.tol, atol=w.tol * scale, err_msg=f"{w.name} is wrong")
  return dict(codegen=codegen, compile=compile_ms, run=lambda: runner(*args, wait=True), opts=k.applied_opts,
              name=prg.name, ours=[], numpy=[])

def bench(w: Workload, devs: dict[Optional[int], Any], repeats: int, copy: Copy) -> tuple[dict, list[float]]:
  """Every thread count's runner, numpy at that thread count and (memory-bound) the copy, interleaved."""
  inputs = w.inputs(np.random.default_rng(0))
  rs = {t: prepare(w, dev, repeats, inputs) for t, dev in devs.items()}
  copies: list[float] = []
  for _ in range(repeats):
    for t, r in rs.items():
      r["ours"].append(r["run"]())
      with numpy_threads(t if t is not None else 1): r["numpy"].append(timed(lambda: w.reference(inputs)))
    if w.bound == "memory": copies.append(copy())
  return rs, copies

def rate(w: Workload, secs: float) -> str:
  if w.bound == "memory": return f"{w.bytes / secs / 1e9:6.1f} GB/s"
  return f"{w.flops / secs / 1e9:6.1f} GF/s"

def spread(xs: list[float]) -> str:
  return f"{1e3 * statistics.median(xs):8.2f} ({1e3 * min(xs):.2f}-{1e3 * max(xs):.2f})"

# ***** fused against split: softmax and layernorm in one kernel, and as the kernels emitted without fusion *****

F32 = dtypes.float32
LOG2E = 1.4426950408889634

def _rowview(n: int, m: int, shape: tuple, axis: int) -> Any:
  """Buffer 1, x of shape (n, m), over `shape`: rows on axis 0, columns on `axis`, stride 0 elsewhere."""
  from kernopt import ast as A
  strides = [m if a == 0 else 1 if a == axis else 0 for a in range(len(shape))]
  return A.load(1, F32, A.view(shape, strides))

def _exp(x: Any) -> Any:
  from kernopt import ast as A
  return A.exp2(A.mul(x, LOG2E))

def softmax_fused(n: int, m: int) -> Any:
  """docs/fusion.md's softmax: one kernel over the full shape (n, o, j, k), buffer 0 = softmax(x) (n, m)."""
  from kernopt import ast as A
  total = A.sum(_exp(A.sub(_rowview(n, m, (n, m, m, 1), 2), A.max(_rowview(n, m, (n, m, m, m), 3), 3))), 2)
  centred = A.sub(_rowview(n, m, (n, m, 1, 1), 1), A.max(_rowview(n, m, (n, m, 1, m), 3), 3))
  return A.kernel(A.store(0, A.div(_exp(centred), total)))

def softmax_split(n: int, m: int) -> list[tuple[Any, dict[int, str]]]:
  """max, then exp-sum, then normalize: three kernels, each AST with its buffers' names (x, mx, s, y)."""
  from kernopt import ast as A
  x, bcast = A.load(1, F32, (n, m)), A.view((n, m), (1, 0))
  mx = A.kernel(A.store(0, A.max(x, 1)))
  s = A.kernel(A.store(0, A.sum(_exp(A.sub(x, A.load(2, F32, bcast))), 1)))
  y = A.kernel(A.store(0, A.div(_exp(A.sub(x, A.load(2, F32, bcast))), A.load(3, F32, bcast))))
  return [(mx, {0: "mx", 1: "x"}), (s, {0: "s", 1: "x", 2: "mx"}), (y, {0: "y", 1: "x", 2: "mx", 3: "s"})]

def layernorm_fused(n: int, m: int) -> Any:
  """(x - mean) / sqrt(var + 1e-5) per row in one kernel: the mean (over k) nested in the variance (over j)."""
  from kernopt import ast as A
  def mean(shape: tuple) -> Any: return A.mul(A.sum(_rowview(n, m, shape, 3), 3), 1.0 / m)
  dev = A.sub(_rowview(n, m, (n, m, m, 1), 2), mean((n, m, m, m)))
  var = A.mul(A.sum(A.mul(dev, dev), 2), 1.0 / m)
  centred = A.sub(_rowview(n, m, (n, m, 1, 1), 1), mean((n, m, 1, m)))
  return A.kernel(A.store(0, A.mul(centred, A.recip(A.sqrt(A.add(var, 1e-5))))))

def layernorm_split(n: int, m: int) -> list[tuple[Any, dict[int, str]]]:
  """mean, then variance, then normalize: three kernels."""
  from kernopt import ast as A
  x, bcast = A.load(1, F32, (n, m)), A.view((n, m), (1, 0))
  mean = A.kernel(A.store(0, A.mul(A.sum(x, 1), 1.0 / m)))
  d = A.sub(x, A.load(2, F32, bcast))
  var = A.kernel(A.store(0, A.mul(A.sum(A.mul(d, d), 1), 1.0 / m)))
  y = A.kernel(A.store(0, A.mul(A.sub(x, A.load(2, F32, bcast)), A.recip(A.sqrt(A.add(A.load(3, F32, bcast),
                                                                                              1e-5))))))
  return [(mean, {0: "mean", 1: "x"}), (var, {0: "var", 1: "x", 2: "mean"}),
          (y, {0: "y", 1: "x", 2: "mean", 3: "var"})]

def _softmax_np(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max(1, keepdims=True))
  return e / e.sum(1, keepdims=True)

def _layernorm_np(x: np.ndarray) -> np.ndarray:
  return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)

# name -> (fused AST, split ASTs, numpy reference)
FUSION: dict[str, tuple[Callable, Callable, Callable]] = {
  "softmax": (softmax_fused, softmax_split, _softmax_np),
  "layernorm": (layernorm_fused, layernorm_split, _layernorm_np)}
FUSION_SHAPE = (4096, 1024)

def fusion_rows(names: list[str], devs: dict[Optional[int], Any], repeats: int) -> None:
  """One fused kernel against the split kernels run back to back, both on the same buffers and interleaved; GB/s
  counts distinct bytes (x read once, y written once) for both, so the split version's extra passes show as less."""
  n, m = FUSION_SHAPE
  x = np.random.default_rng(0).standard_normal((n, m), dtype=np.float32)
  moved = 2 * x.nbytes
  print(f"\nfused against split, x of shape {FUSION_SHAPE} float32, {moved / 2**20:.0f} MiB distinct bytes "
        f"(x read + y written); medians of {repeats}")
  hdr = (f"{'kernel':10s} {'thr':>3s} {'fused ms':>9s} {'fused':>11s} {'split ms':>9s} {'split':>11s} "
         f"{'fused/split':>11s}")
  print(hdr)
  print("-" * len(hdr))
  for name in names:
    fused_ast, split_asts, ref = FUSION[name]
    want = ref(x.astype(np.float64))
    for t, dev in devs.items():
      bufs = {k: Buffer(dev.name, x.size if k in ("x", "y") else n, F32) for k in ("x", "y", "a", "b")}
      bufs["x"].copyin(x.reshape(-1))
      def runner(ast: Any, names_by_idx: dict[int, str]) -> Callable[[], float]:
        prg = optimize(ast, dev.renderer).to_program()
        r, args = dev.compile(prg), [bufs[names_by_idx[a.idx]] for a in prg.args]
        return lambda: r(*args, wait=True)
      fused = runner(fused_ast(n, m), {0: "y", 1: "x"})
      aliases = {"mx": "a", "mean": "a", "s": "b", "var": "b", "x": "x", "y": "y"}
      split = [runner(ast, {i: aliases[v] for i, v in bn.items()}) for ast, bn in split_asts(n, m)]
      ft, st = [], []
      for _ in range(repeats):
        ft.append(fused())
        st.append(sum(r() for r in split))
      for label, run in (("fused", fused), ("split", lambda: [r() for r in split])):
        run()
        np.testing.assert_allclose(bufs["y"].numpy().reshape(n, m), want, rtol=1e-3, atol=1e-4,
                                   err_msg=f"{name} {label} is wrong")
      fm, sm = statistics.median(ft), statistics.median(st)
      print(f"{name:10s} {t if t is not None else '-':>3} {1e3 * fm:9.2f} {moved / fm / 1e9:6.1f} GB/s "
            f"{1e3 * sm:9.2f} {moved / sm / 1e9:6.1f} GB/s {sm / fm:10.2f}x", flush=True)
  print("fused/split > 1: the fused kernel is faster than its split version")

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--device", default="CPU")
  ap.add_argument("--repeats", type=int, default=7)
  ap.add_argument("--workloads", default="")
  ap.add_argument("--threads", default="", help="CPU only: comma-separated thread counts (default: 1 and the "
                                                  "device's)")
  ap.add_argument("--profile", default="native", choices=("native", "static"),
                  help="CPU only: native (the host profile, the default) or static (the spec's C dialect, one thread)")
  ap.add_argument("--no-workarounds", action="store_true",
                  help="CPU only: build without the compiler-miscompile flags (runtime/cpu.py MISCOMPILES), to "
                       "measure what they cost")
  a = ap.parse_args()
  wk = {"workarounds": False} if a.no_workarounds else {}
  all_w = workloads()
  names = [n.strip() for n in a.workloads.split(",") if n.strip()] or list(all_w) + list(FUSION)
  fusion_names, names = [n for n in names if n in FUSION], [n for n in names if n not in FUSION]
  cpu = a.device.upper() == "CPU"
  if cpu and a.profile == "static": devs: dict[Optional[int], Any] = {1: Device.open("CPU", profile="static", **wk)}
  elif cpu:
    default = Device.open("CPU").renderer
    counts = [int(t) for t in a.threads.split(",") if t.strip()] or sorted({1, default.caps.threads})
    devs = {t: Device.open("CPU", threads=t, **wk) for t in counts}
  else: devs = {None: Device.open(a.device)}
  copy = Copy()
  if cpu: print("compiler flags: " + " ".join(next(iter(devs.values())).flags()))
  print(f"device {a.device.upper()}: {', '.join(repr(d.renderer) for d in devs.values())}; {threadpool_note()}; "
        f"repeats {a.repeats}")
  with numpy_threads(1): bw = copy.bandwidth(statistics.median([copy() for _ in range(max(a.repeats, 5))]))
  print(f"copy bandwidth (np.copyto 64 MiB, read+write), before the workloads: {bw / 1e9:.1f} GB/s")
  hdr = (f"{'wl':3s} {'workload':40s} {'thr':>3s} {'codegen':>8s} {'compile':>8s} {'ours ms (min-max)':>24s} "
         f"{'ours':>12s} {'numpy ms (min-max)':>24s} {'numpy':>12s} {'ours/np':>7s} {'vs 1thr':>7s} {'/copy':>6s}")
  print(hdr)
  print("-" * len(hdr))
  applied = []
  for n in names:
    w = all_w[n]
    try: rs, copies = bench(w, devs, a.repeats, copy)
    except Exception as e:  # a codegen, compile or correctness failure: report it and go on
      print(f"{w.name:3s} {w.desc:40s} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:150]}", flush=True)
      continue
    wbw = copy.bandwidth(statistics.median(copies)) if copies else bw
    base = statistics.median(rs[min(rs, key=lambda t: t or 0)]["ours"])
    for t, r in rs.items():
      om, nm = statistics.median(r["ours"]), statistics.median(r["numpy"])
      vs_copy = f"{w.bytes / om / wbw:6.2f}" if w.bound == "memory" else f"{'':>6s}"
      print(f"{w.name:3s} {w.desc:40s} {t if t is not None else '-':>3} {r['codegen']:6.1f}ms {r['compile']:6.0f}ms "
            f"{spread(r['ours']):>24s} {rate(w, om):>12s} {spread(r['numpy']):>24s} {rate(w, nm):>12s} "
            f"{nm / om:6.2f}x {base / om:6.2f}x {vs_copy}", flush=True)
      applied.append(f"{w.name} thr={t} {r['name']}: {list(r['opts'])}")
    if copies: print(f"{'':3s} {'copy bandwidth interleaved with ' + w.name:40s} {wbw / 1e9:.1f} GB/s", flush=True)
  print("ours/np > 1: ours is faster; vs 1thr: our median at the lowest thread count over this one; /copy: the "
        "kernel's bandwidth over np.copyto's, interleaved with it (memory-bound workloads)")
  print("applied opts:")
  for line in applied: print("  " + line)
  if fusion_names: fusion_rows(fusion_names, devs, a.repeats)

if __name__ == "__main__":
  main()
