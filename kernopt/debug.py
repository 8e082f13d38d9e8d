"""What the DEBUG knob prints, and nothing else: 1, a line per kernel built (name, Opts, codegen and compile time,
cache hits) and per search; 2, a line per launch (time, GFLOP/s, GB/s) and a total at exit; 3, the optimized AST and
the heuristics' trace; 4, the source; 5, the UOps; 6, each lowering step's UOp count and time. Every line goes to
stderr, coloured only when it is a terminal and NO_COLOR is unset. Imports the standard library and helpers."""
from __future__ import annotations
import atexit, contextlib, contextvars, math, os, sys, threading
from typing import Any, Iterator, Optional, Sequence, TextIO
from kernopt.helpers import ansistrip, colored, getconfig, take_thread_counts

_quiet: contextvars.ContextVar[bool] = contextvars.ContextVar("kernopt_debug_quiet", default=False)

def level() -> int:
  """The DEBUG level in force here (0 inside `quiet()`)."""
  return 0 if _quiet.get() else getconfig().DEBUG

def on(n: int) -> bool: return level() >= n

@contextlib.contextmanager
def quiet() -> Iterator[None]:
  """No DEBUG output in the body (a search's candidates are not kernels the user built)."""
  token = _quiet.set(True)
  try: yield
  finally: _quiet.reset(token)

def use_color(stream: TextIO) -> bool:
  """Escapes only for a terminal, and never when NO_COLOR is set (https://no-color.org)."""
  if os.environ.get("NO_COLOR"): return False
  try: return bool(stream.isatty())
  except (AttributeError, ValueError): return False

def emit(text: str, stream: Optional[TextIO] = None) -> None:
  """Print text (any number of lines) to stream (default: stderr), without escapes unless use_color(stream)."""
  stream = sys.stderr if stream is None else stream
  if not use_color(stream): text = ansistrip(text)
  stream.write(text + "\n")
  stream.flush()

def log(n: int, text: str) -> None:
  """emit(text) when DEBUG >= n."""
  if on(n): emit(text)

def _tag(what: str) -> str: return colored("kernopt", "cyan") + " " + colored(f"{what:<6}", "GREEN")
def _ms(s: Optional[float]) -> str: return "-" if s is None else f"{s * 1e3:.2f} ms"
def _rate(n: float, s: float, unit: str) -> str: return f"{n / s * 1e-9:.2f} {unit}" if s > 0 else f"- {unit}"
def _dims(d: Optional[Sequence[Any]]) -> str: return "-" if d is None else "[" + ",".join(str(x) for x in d) + "]"

def format_opts(opts: Optional[Sequence[Any]]) -> str:
  """Opts (or their [op, axis, amt] lists) as `[UPCAST(0,4), LOCAL(1,16)]`; `?` when unknown."""
  if opts is None: return "?"
  def one(o: Any) -> str:
    if isinstance(o, str): return o
    op, axis, amt = (o.op.name, o.axis, o.amt) if hasattr(o, "op") else o
    return f"{op}({axis},{amt})"
  return "[" + ", ".join(one(o) for o in opts) + "]"

# ***** level 1: kernels built *****

def cache_events() -> dict[str, str]:
  """What the caches did for the kernel this thread just built, since its last such report: program cache, binary
  cache and tuning cache each "hit", "miss" or "-" (not consulted)."""
  c = take_thread_counts()
  program = "hit" if c.get("program_cache_hits") else "miss" if c.get("program_cache_misses") else "-"
  binary = "hit" if c.get("binary_hits") else "miss" if c.get("compiles") else "-"
  return {"program": program, "binary": binary, "tuning": "hit" if c.get("tuning_cache_hits") else "-"}

def forget_cache_events() -> None:
  """Start the next kernel's cache report afresh."""
  take_thread_counts()

def kernel_line(name: str, device: str, opts: Optional[Sequence[Any]], codegen_s: Optional[float],
                compile_s: Optional[float], cache: dict[str, str]) -> str:
  hits = " ".join(f"{k}={v}" for k, v in cache.items())
  return f"{_tag('built')} {device:<7} {colored(name, 'yellow')}  opts={format_opts(opts)}  " \
         f"codegen {_ms(codegen_s)}  compile {_ms(compile_s)}  cache {hits}"

_built = 0

def kernel_built(name: str, device: str, opts: Optional[Sequence[Any]], codegen_s: Optional[float],
                 compile_s: Optional[float], cache: dict[str, str]) -> None:
  """DEBUG>=1: the line of a kernel compiled (or found compiled) for a device."""
  global _built
  if not on(1): return
  _built += 1
  emit(kernel_line(name, device, opts, codegen_s, compile_s, cache))

def search_line(name: str, best_s: float, baseline_s: float, opts: Sequence[Any], rounds: int, compiled: int,
                timed: int, wall_s: float) -> str:
  base = f"baseline {baseline_s * 1e6:.1f} us ({baseline_s / best_s:.2f}x)" \
    if math.isfinite(baseline_s) and best_s > 0 else "baseline -"
  return f"{_tag('search')} {colored(name, 'yellow')}  best {best_s * 1e6:.1f} us  {base}  opts={format_opts(opts)}  " \
         f"{rounds} rounds, {compiled} compiled, {timed} timed, {wall_s:.1f} s"

# ***** level 2: launches, and their total at exit *****

_totals = {"launches": 0, "seconds": 0.0, "flops": 0.0, "bytes": 0.0}
_totals_lock = threading.Lock()
_exit_registered = False

def launch_line(name: str, device: str, global_size: Optional[Sequence[int]], local_size: Optional[Sequence[int]],
                seconds: float, flops: float, nbytes: float) -> str:
  return f"{_tag('launch')} {device:<7} {colored(name, 'yellow')}  global={_dims(global_size)} " \
         f"local={_dims(local_size)}  {seconds * 1e3:.3f} ms  {_rate(flops, seconds, 'GFLOP/s')}  " \
         f"{_rate(nbytes, seconds, 'GB/s')}"

def launched(name: str, device: str, global_size: Optional[Sequence[int]], local_size: Optional[Sequence[int]],
             seconds: float, flops: float, nbytes: float) -> None:
  """DEBUG>=2: the line of one launch (flops and nbytes: the Program's estimates at this launch's var_vals), added
  to the process total printed at exit (registered here, on the first launch)."""
  global _exit_registered
  if not on(2): return
  emit(launch_line(name, device, global_size, local_size, seconds, flops, nbytes))
  with _totals_lock:
    _totals["launches"] += 1
    _totals["seconds"] += seconds
    _totals["flops"] += flops
    _totals["bytes"] += nbytes
    if not _exit_registered:
      _exit_registered = True
      atexit.register(_print_total)

def total_line() -> str:
  t = _totals
  return f"{_tag('total')} {t['launches']} launches  {t['seconds'] * 1e3:.3f} ms  " \
         f"{_rate(t['flops'], t['seconds'], 'GFLOP/s')}  {_rate(t['bytes'], t['seconds'], 'GB/s')}  " \
         f"{_built} kernels built"

def _print_total() -> None:
  with contextlib.suppress(Exception): emit(total_line())

# ***** level 6: lowering steps *****

def step_line(step: str, n_uops: int, seconds: float) -> str:
  return f"{_tag('step')} {step:<10} {n_uops:6d} uops  {seconds * 1e3:.3f} ms"
