"""Issue 18's reference benchmark on the reference's own ASTs: tinygrad 0.9.2's CLANG kernels (a subprocess in its venv
per row and round, benchmarks/reference/setup_reference.sh), kernopt's CPU device at 1 and 2 threads on the translated
ASTs (standard protocol), numpy at 1 and 2 BLAS threads (conv as im2col: sliding_window_view, one copy to
(Cin*9, Ho*Wo), one np.matmul), and two yardsticks measured in the same run: a peak-FMA loop (C, gcc -O3
-march=native, independent FMAs on vector registers) on 1 and 2 cores, and a 64 MiB np.copyto. Every round measures
every row once, row by row (the reference, kernopt, numpy back to back, each warmed up once, in an order that rotates
every round; kernopt's and numpy's 1-thread launches alternate one by one); ratios are taken within a round; the table
shows medians over rounds. Every kernopt result is checked against numpy and the reference's output first.
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are dropped for this command (the script re-executes itself without them).
  python benchmarks/reference/vs_reference_cpu.py [--rounds 3] [--repeats 5] [--rows a,b] [--device OPENCL]
                                                  [--json FILE]"""
from __future__ import annotations
import os
import sys
_DROP = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
if any(k in os.environ for k in _DROP):   # before numpy loads OpenBLAS
  os.execve(sys.executable, [sys.executable, *sys.argv], {k: v for k, v in os.environ.items() if k not in _DROP})
import argparse  # noqa: E402
import ctypes  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..")]
import numpy as np  # noqa: E402
from threadpoolctl import threadpool_info, threadpool_limits  # noqa: E402
from kernopt_rows import RowProgram, check_reference, row_inputs  # noqa: E402
from rows import BY_NAME, ROWS, Row  # noqa: E402
from translate import RefRow, load_rows  # noqa: E402
from kernopt.runtime import Device  # noqa: E402

TG_VENV = os.environ.get("TG_VENV", "/tmp/tgvenv")
TOL = 1e-4
# before each column: OpenBLAS's workers spin for a while after a call, and two of them on this 2-core host would
# share the cores with the next column (kernopt's conv measured 43.5 GF/s right after numpy, 62.6 alone)
SETTLE_S = 0.2

# ***** yardsticks *****

FMA_C = r"""
#include <pthread.h>
#if defined(__AVX512F__)
#define LANES 16
#define NACC 24
#elif defined(__AVX__)
#define LANES 8
#define NACC 12
#else
#define LANES 4
#define NACC 12
#endif
typedef float vf __attribute__((vector_size(4 * LANES)));
struct job { long iters; float out; };
static void *loop(void *p) {
  struct job *j = p;
  vf acc[NACC], a = {0}, b = {0};
  for (int l = 0; l < LANES; l++) { a[l] = 0.999999f; b[l] = 1e-7f; }
  for (int i = 0; i < NACC; i++) acc[i] = a * (float)i;
  for (long it = 0; it < j->iters; it++)
    /* NACC independent FMA chains, unrolled so that the accumulators live in registers: at 24 chains gcc 12 keeps
       acc[] in memory otherwise, and the loop measures store forwarding (70 instead of 115 GFLOP/s on a Zen 4) */
    _Pragma("GCC unroll 32") for (int i = 0; i < NACC; i++) acc[i] = acc[i] * a + b;
  float s = 0;
  for (int i = 0; i < NACC; i++) for (int l = 0; l < LANES; l++) s += acc[i][l];
  j->out = s;
  return 0;
}
int lanes(void) { return LANES; }
int naccs(void) { return NACC; }
float fma_peak(long iters, int threads) {
  pthread_t t[64]; struct job j[64]; float s = 0;
  for (int i = 0; i < threads; i++) { j[i].iters = iters; pthread_create(&t[i], 0, loop, &j[i]); }
  for (int i = 0; i < threads; i++) { pthread_join(t[i], 0); s += j[i].out; }
  return s;
}
"""

class Yardsticks:
  def __init__(self) -> None:
    d = tempfile.mkdtemp(prefix="fma_peak_")
    src, lib = os.path.join(d, "fma.c"), os.path.join(d, "fma.so")
    with open(src, "w") as f: f.write(FMA_C)
    subprocess.run(["gcc", "-O3", "-march=native", "-ffp-contract=fast", "-shared", "-fPIC", "-pthread", src, "-o",
                    lib], check=True)
    self.lib = ctypes.CDLL(lib)
    self.lib.fma_peak.argtypes, self.lib.fma_peak.restype = [ctypes.c_long, ctypes.c_int], ctypes.c_float
    self.lanes, self.naccs = self.lib.lanes(), self.lib.naccs()
    self.iters = 20_000_000
    self.src, self.dst = np.ones(16 << 20, np.float32), np.zeros(16 << 20, np.float32)   # 64 MiB each, touched

  def fma(self, threads: int) -> float:
    """GFLOP/s of the FMA loop on `threads` cores."""
    st = time.perf_counter()
    self.lib.fma_peak(self.iters, threads)
    return 2 * self.lanes * self.naccs * self.iters * threads / (time.perf_counter() - st) / 1e9

  def copy(self, repeats: int) -> float:
    """GB/s (bytes read + written) of np.copyto over 64 MiB, median of `repeats`."""
    ts = []
    for _ in range(repeats):
      st = time.perf_counter()
      np.copyto(self.dst, self.src)
      ts.append(time.perf_counter() - st)
    return 2 * self.src.nbytes / statistics.median(ts) / 1e9

# ***** numpy baselines: a callable per row, on preallocated outputs, and its result *****

def numpy_baseline(row: Row, ins: list[np.ndarray]) -> tuple[dict, object]:
  """(named steps -> callables, the function giving the result) for `row` in numpy float32."""
  if row.conv is not None:
    c = row.conv
    x, w = ins
    ho, wo = c.out_hw
    g, cig, cog = c.groups, c.cin // c.groups, c.cout // c.groups
    xp = np.pad(x, ((0, 0), (0, 0), (c.padding,) * 2, (c.padding,) * 2))   # padded once, outside the timing
    win = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))[:, :, ::c.stride, ::c.stride]
    win = win.reshape(c.n, g, cig, ho, wo, 3, 3).transpose(0, 1, 2, 5, 6, 3, 4)   # (n, g, cig, 3, 3, ho, wo)
    col = np.empty((c.n, g, cig * 9, ho * wo), np.float32)
    wm = np.ascontiguousarray(w.reshape(g, cog, cig * 9))
    out = np.empty((c.n, g, cog, ho * wo), np.float32)
    steps = {"copy": lambda: np.copyto(col.reshape(c.n, g, cig, 3, 3, ho, wo), win),
             "matmul": lambda: np.matmul(wm, col, out=out)}
    return steps, lambda: out.reshape(c.n, c.cout, ho, wo)
  if row.name.startswith(("matmul", "bmm")):
    a, b = ins
    out = np.empty((*a.shape[:-1], b.shape[-1]), np.float32)
    return {"matmul": lambda: np.matmul(a, b, out=out)}, lambda: out
  if row.name == "sum_axis1":
    out = np.empty(ins[0].shape[0], np.float32)
    return {"sum": lambda: np.sum(ins[0], axis=1, out=out)}, lambda: out
  if row.name == "add":
    out = np.empty_like(ins[0])
    return {"add": lambda: np.add(ins[0], ins[1], out=out)}, lambda: out
  if row.name == "relu_fma":
    a, b, c3 = ins
    out = np.empty_like(a)
    def relu_fma() -> None:
      np.multiply(a, b, out=out)
      np.add(out, c3, out=out)
      np.maximum(out, 0, out=out)
    return {"relu_fma": relu_fma}, lambda: out
  x = ins[0]
  out, red = np.empty_like(x), np.empty((x.shape[0], 1), np.float32)
  if row.name == "softmax":
    def softmax() -> None:
      np.max(x, axis=-1, keepdims=True, out=red)
      np.subtract(x, red, out=out)
      np.exp(out, out=out)
      np.sum(out, axis=-1, keepdims=True, out=red)
      np.divide(out, red, out=out)
    return {"softmax": softmax}, lambda: out
  if row.name == "layernorm":
    def layernorm() -> None:
      np.mean(x, axis=-1, keepdims=True, out=red)
      np.subtract(x, red, out=out)
      np.mean(np.square(out), axis=-1, keepdims=True, out=red)
      red[:] = 1 / np.sqrt(red + 1e-5)
      np.multiply(out, red, out=out)
    return {"layernorm": layernorm}, lambda: out
  raise KeyError(f"no numpy baseline for row {row.name}")

def _seconds(fn: object) -> float:
  st = time.perf_counter()
  fn()  # type: ignore[operator]
  return time.perf_counter() - st

def _kernopt_times(e: dict, col: str, per: list[list[float]], kernels: int) -> None:
  """A kernopt column's medians over launches: the row's total, and each kernel's (key col + "_k")."""
  e[col] = statistics.median(sum(x) for x in per)
  e[col + "_k"] = [statistics.median(x[k] for x in per) for k in range(kernels)]

def median_time(fn: object, repeats: int) -> float:
  ts = []
  for _ in range(repeats):
    st = time.perf_counter()
    fn()  # type: ignore[operator]
    ts.append(time.perf_counter() - st)
  return statistics.median(ts)

def check(what: str, got: np.ndarray, want: np.ndarray) -> float:
  err = float(np.abs(got.reshape(want.shape) - want).max() / max(1.0, float(np.abs(want).max())))
  if not err <= TOL: raise SystemExit(f"{what}: max error {err:.2e} (relative to max |numpy|) exceeds {TOL}")
  return err

# ***** the reference, in its venv *****

def reference_times(rows: list[str], repeats: int) -> dict:
  env = {**os.environ, "PATH": f"{TG_VENV}/shim:{os.environ['PATH']}", "CLANG": "1"}
  cmd = [f"{TG_VENV}/bin/python", os.path.join(HERE, "export_asts.py"), "--time", "--rows", ",".join(rows),
         "--repeats", str(repeats)]
  r = subprocess.run(cmd, env=env, capture_output=True, text=True)
  if r.returncode: raise SystemExit(f"the reference failed ({' '.join(cmd)}):\n{r.stderr[-3000:]}")
  return json.loads(r.stdout.strip().splitlines()[-1])

# ***** main *****

def host() -> str:
  model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
  flags = next((ln for ln in open("/proc/cpuinfo") if ln.startswith("flags")), "")
  isa = "avx512f" if " avx512f" in flags else "avx2" if " avx2" in flags else "sse"
  return f"{model}, {len(os.sched_getaffinity(0))} cores, {isa}"

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--repeats", type=int, default=5, help="launches per measurement (median)")
  ap.add_argument("--rows", default="", help="comma-separated row names (default: every exported row)")
  ap.add_argument("--device", default="", help="also run kernopt's OPENCL device on the same ASTs")
  ap.add_argument("--json", default="", help="write every round's measurements (seconds) to this file")
  a = ap.parse_args()
  refrows = load_rows()
  names = [n for n in a.rows.split(",") if n] or [r.name for r in ROWS if r.name in refrows]
  devs = {"ko1": Device.open("CPU", threads=1), "ko2": Device.open("CPU", threads=2)}
  if a.device: devs["cl"] = Device.open(a.device.upper())
  yard = Yardsticks()
  blas = [f"{i.get('internal_api')} {i.get('version')} kernel {i.get('architecture')}" for i in threadpool_info()
          if i.get("user_api") == "blas"]
  width = devs['ko1'].renderer.caps.vector_width
  print(f"host: {host()}; kernopt CPU vector width {width}; FMA loop {yard.lanes} lanes x "
        f"{yard.naccs} chains; numpy {np.__version__}, BLAS: {'; '.join(blas) or 'none'}; "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}")
  if "cl" in devs: print(f"OPENCL: {getattr(getattr(devs['cl'], 'cl_device', None), 'name', '?')} vector width "
                         f"{devs['cl'].renderer.caps.vector_width}")

  progs: dict[str, dict[str, RowProgram]] = {}
  base: dict[str, tuple] = {}
  for n in names:
    rr: RefRow = refrows[n]
    row, inputs = BY_NAME[n], row_inputs(refrows[n])
    want = row.numpy(*inputs.values())
    progs[n] = {}
    for col, dev in devs.items():
      p = progs[n][col] = RowProgram(dev, rr, True, inputs)
      p.run()
      check(f"{n} kernopt {col}", p.output(), want)
      check_reference(rr, p.output())
    steps, result = numpy_baseline(row, list(inputs.values()))
    for s in steps.values(): s()
    check(f"{n} numpy", np.asarray(result()), want)   # type: ignore[operator]
    base[n] = (steps, row)
  print(f"all {len(names)} rows checked against numpy (max error <= {TOL} of max |numpy|) and the reference's outputs")

  rounds: list[dict] = []
  for r in range(a.rounds):
    m: dict = {"fma1": yard.fma(1), "fma2": yard.fma(2), "copy": yard.copy(a.repeats)}
    for n in names:   # row by row: the reference (a process of its own), kernopt, numpy, back to back
      rr = refrows[n]
      e = m[n] = {}
      # each column warmed up once, then timed; the order rotates every round, so that no column always runs right
      # after the reference's process or numpy's BLAS threads. ko1 and np1 (one BLAS thread: no workers left
      # spinning) alternate launch by launch, so that the host's fast and slow spells fall on both alike; the
      # 2-thread columns stay blocks apart, SETTLE_S after numpy's workers
      steps, _ = base[n]
      cols = ["ref", "ko1+np1", *[c for c in progs[n] if c != "ko1"], "np2"]
      for col in cols[r % len(cols):] + cols[:r % len(cols)]:
        time.sleep(SETTLE_S)
        if col == "ref":
          ref = reference_times([n], a.repeats)
          m["compiler"] = ref["compiler"]
          e["ref"], e["ref_k"] = ref["rows"][n]["seconds"], ref["rows"][n]["kernel_seconds"]
        elif col == "ko1+np1":
          p = progs[n]["ko1"]
          with threadpool_limits(limits=1, user_api="blas"):
            p.run()
            for fn in steps.values(): fn()
            per, np_per = [], []
            for i in range(a.repeats):
              for which in ((0, 1) if i % 2 == 0 else (1, 0)):
                if which == 0: per.append(p.run())
                else: np_per.append({s: _seconds(fn) for s, fn in steps.items()})
          _kernopt_times(e, "ko1", per, len(rr.kernels))
          st = {s: statistics.median(x[s] for x in np_per) for s in steps}
          e["np1"], e["np1_steps"] = sum(st.values()), st
        elif col == "np2":
          with threadpool_limits(limits=2, user_api="blas"):
            for fn in steps.values(): fn()   # wakes the BLAS threads up at this count
            st = {s: median_time(fn, a.repeats) for s, fn in steps.items()}
          e["np2"], e["np2_steps"] = sum(st.values()), st
        else:
          p = progs[n][col]
          p.run()
          _kernopt_times(e, col, [p.run() for _ in range(a.repeats)], len(rr.kernels))
    rounds.append(m)
    print(f"round {r + 1}/{a.rounds} done, {time.strftime('%H:%M:%S', time.gmtime())} UTC, load average "
          f"{os.getloadavg()[0]:.1f}: FMA peak "
          f"{m['fma1']:.1f} / {m['fma2']:.1f} GFLOP/s (1 / 2 cores), copy {m['copy']:.1f} GB/s", flush=True)
  if a.json:
    with open(a.json, "w") as f: json.dump({"host": host(), "rounds": rounds}, f, indent=1)
  report(names, refrows, rounds, list(devs))

def report(names: list[str], refrows: dict, rounds: list[dict], cols: list[str]) -> None:
  med = statistics.median
  f1, f2, cp = (med(m[k] for m in rounds) for k in ("fma1", "fma2", "copy"))
  print(f"\nreference compiler: {rounds[0]['compiler']}; yardsticks (medians of {len(rounds)} rounds): FMA peak "
        f"{f1:.1f} GFLOP/s on 1 core, {f2:.1f} on 2; copy {cp:.1f} GB/s (np.copyto 64 MiB, 1 thread)")
  hdr = (f"{'row':26s} {'unit':6s} {'ref':>7s} {'ko1':>7s} {'ko2':>7s} {'np1':>7s} {'np2':>7s} {'ko1/ref':>8s} "
         f"{'ko1/np1':>8s} {'ko2/np2':>8s} {'ko1%yd':>7s} {'ko2%yd':>7s}" + ("   cl  cl/ref" if "cl" in cols else ""))
  print(hdr)
  for n in names:
    row, rr = BY_NAME[n], refrows[n]
    compute = row.bound == "compute"
    amount = row.amount if compute else sum(k.nbytes for k in rr.kernels)
    unit = "GF/s" if compute else "GB/s"
    rate = lambda t: amount / t / 1e9  # noqa: E731
    def mrate(key: str) -> float: return med(rate(m[n][key]) for m in rounds)
    def ratio(x: str, y: str) -> float: return med(m[n][y] / m[n][x] for m in rounds)   # speed of x over y
    yd1 = med(rate(m[n]["ko1"]) / (m["fma1"] if compute else m["copy"]) for m in rounds)
    yd2 = med(rate(m[n]["ko2"]) / (m["fma2"] if compute else m["copy"]) for m in rounds)
    line = (f"{n:26s} {unit:6s} {mrate('ref'):7.1f} {mrate('ko1'):7.1f} {mrate('ko2'):7.1f} {mrate('np1'):7.1f} "
            f"{mrate('np2'):7.1f} {ratio('ko1', 'ref'):7.2f}x {ratio('ko1', 'np1'):7.2f}x {ratio('ko2', 'np2'):7.2f}x "
            f"{100 * yd1:6.0f}% {100 * yd2:6.0f}%")
    if "cl" in cols: line += f" {mrate('cl'):6.1f} {ratio('cl', 'ref'):5.2f}x"
    print(line)
    if row.conv is not None:
      st = {s: med(m[n]["np1_steps"][s] for m in rounds) for s in rounds[0][n]["np1_steps"]}
      print(f"{'':26s} numpy 1 thread: copy to (Cin*9, Ho*Wo) {1e3 * st['copy']:.3f} ms + matmul "
            f"{1e3 * st['matmul']:.3f} ms (pad excluded)")
    if len(rr.kernels) > 1:
      for k, kern in enumerate(rr.kernels):
        kamount = kern.nbytes if not compute else amount
        def krate(key: str) -> float: return med(kamount / m[n][key + "_k"][k] / 1e9 for m in rounds)
        kr = med(m[n]["ref_k"][k] / m[n]["ko1_k"][k] for m in rounds)
        line = (f"  {n}[{k}]".ljust(27) + f"{unit:6s} {krate('ref'):7.1f} {krate('ko1'):7.1f} {krate('ko2'):7.1f} "
                f"{'-':>7s} {'-':>7s} {kr:7.2f}x {'-':>8s} {'-':>8s} "
                f"{100 * med(kamount / m[n]['ko1_k'][k] / 1e9 / m['copy'] for m in rounds):6.0f}% "
                f"{100 * med(kamount / m[n]['ko2_k'][k] / 1e9 / m['copy'] for m in rounds):6.0f}%")
        if "cl" in cols: line += f" {krate('cl'):6.1f} {med(m[n]['ref_k'][k] / m[n]['cl_k'][k] for m in rounds):5.2f}x"
        print(line)
  print("ko1/ko2: kernopt CPU at 1/2 threads; np1/np2: numpy at 1/2 BLAS threads (elementwise numpy is 1 thread); "
        "ratios: speed of the first over the second, within each round; %yd: of the FMA peak at the same core count "
        "(compute rows) or of the copy bandwidth (memory rows)")

if __name__ == "__main__":
  main()
