"""The command line, `python -m kernopt` or `kernopt`: show, run and search AST files (`kernopt.save`), replay a
process-replay capture, manage the caches, list the devices. Bad arguments or files are one line on stderr and exit
status 2; a kernel that disagrees with its unoptimized form, or a replay that finds a change, exits 1. Imports debug,
errors, helpers, kernel, ops, opt, renderers, replay, runtime/, search, shape.symbolic and validation."""
from __future__ import annotations
import argparse, contextlib, math, os, shutil, sys
from typing import Any, NoReturn, Optional, Sequence
from kernopt.errors import KernoptError

CACHE_TABLES = {"program": ("program_cache",), "binary": ("cpu_binary", "opencl_binary"), "tuning": ("tuning",)}
BINARY_DIRS = ("cpu", "opencl")

class UsageError(Exception):
  """A bad command line: one line, exit status 2."""

class _Parser(argparse.ArgumentParser):
  def error(self, message: str) -> NoReturn: raise UsageError(message)

def _out(*lines: str) -> None:
  for line in lines: print(line)

# ***** kernels *****

def _load(path: str) -> Any:
  from kernopt.ops import load_ast
  return load_ast(path)

def _renderer(device: str, render_only: bool) -> tuple[Any, Any]:
  """(renderer, opened device or None): the device's own renderer when it is available here, else (render_only)
  the dialect's static profile."""
  from kernopt.renderers import get_renderer
  from kernopt.runtime import Device
  if Device.why_unavailable(device) is None:
    dev = Device[device]
    return dev.renderer, dev
  if not render_only: raise UsageError(f"device {device} is not available here: {Device.why_unavailable(device)}")
  return get_renderer(device), None

def _parse_opt(text: str) -> Any:
  from kernopt.opt import Opt, OptOps
  parts = text.replace("(", ":").replace(")", "").replace(",", ":").split(":")
  try:
    op, axis, amt = parts[0].upper(), int(parts[1]), (int(parts[2]) if len(parts) > 2 and parts[2] != "" else None)
    return Opt(OptOps[op], axis, amt)
  except (IndexError, KeyError, ValueError):
    raise UsageError(f"an Opt is OP:AXIS:AMT (e.g. UPCAST:0:4), got {text!r}") from None

def _kernel(ast: Any, renderer: Any, opts: Optional[Sequence[str]]) -> Any:
  """The Kernel of ast with opts applied in order, or the standard protocol's choice when opts is None."""
  from kernopt.kernel import Kernel
  k = Kernel(ast, opts=renderer)
  if opts is None:
    k.required_optimizations()
    if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  else:
    for o in opts: k.apply_opt(_parse_opt(o))
  return k

def _optimized_program(k: Any) -> Any:
  """k's Program (a separate step, so tests can inject a fault)."""
  return k.to_program()

def _shape(k: Any) -> str: return "(" + ", ".join(str(s) for s in k.full_shape) + ")"

def cmd_show(a: argparse.Namespace) -> int:
  from kernopt.debug import format_opts
  renderer, _ = _renderer(a.device, render_only=True)
  k = _kernel(_load(a.file), renderer, a.opts)
  prg = _optimized_program(k)
  _out(f"name   {prg.name}", f"device {renderer.caps.device} ({type(renderer).__name__})", f"shape  {_shape(k)}",
       f"opts   {format_opts(k.applied_opts)}")
  if (explain := getattr(k, "explain", None)) is not None: _out("explain", str(explain()))
  _out("source", prg.src)
  return 0

def _rate(prg: Any, seconds: float, var_vals: dict) -> str:
  from kernopt.shape.symbolic import sym_infer
  flops, nbytes = (float(x if isinstance(x, (int, float)) else sym_infer(x, var_vals))
                   for x in (prg.op_estimate, prg.mem_estimate))
  if seconds <= 0 or not math.isfinite(seconds): return "-"
  return f"{flops / seconds * 1e-9:.2f} GFLOP/s, {nbytes / seconds * 1e-9:.2f} GB/s"

def cmd_run(a: argparse.Namespace) -> int:
  from kernopt.validation import Validator
  if a.repeat < 1: raise UsageError(f"--repeat must be at least 1, got {a.repeat}")
  renderer, dev = _renderer(a.device, render_only=False)
  k = _kernel(_load(a.file), renderer, a.opts)
  vv = {v: (v.min + v.max) // 2 for v in k.vars}
  ref = Validator(k, dev, {v.expr: x for v, x in vv.items()}, None, a.seed)
  prg = _optimized_program(k)
  runner = dev.compile(prg)
  if (why := ref.check(runner)) is not None:
    print(f"{prg.name}: MISMATCH against the unoptimized kernel: {why}")
    return 1
  times = [runner(*ref.bufs, var_vals={v.expr: x for v, x in vv.items()}, wait=True) or math.inf
           for _ in range(a.repeat)]
  best = min(times)
  _out(f"{prg.name}: matches the unoptimized kernel on {dev.name}; best of {a.repeat}: {best * 1e3:.3f} ms, "
       f"{_rate(prg, best, vv)} (unoptimized: {ref.ref_time * 1e3:.3f} ms)")
  return 0

def cmd_search(a: argparse.Namespace) -> int:
  from kernopt.debug import format_opts
  from kernopt.helpers import diskcache_put
  from kernopt.kernel import Kernel
  from kernopt.search import TUNING_TABLE, SearchConfig, _entry, search, tuning_key
  if a.budget is not None and not a.budget > 0: raise UsageError(f"--budget must be positive, got {a.budget}")
  renderer, dev = _renderer(a.device, render_only=False)
  k = Kernel(_load(a.file), opts=renderer)
  cfg = SearchConfig(beam=a.beam, time_budget_s=a.budget, progress=not a.no_progress)
  res = search(k, config=cfg, device=dev)
  base = k.copy()
  if not base.apply_tensor_cores(): base.hand_coded_optimizations()
  _out(f"before {base.name}  opts={format_opts(base.applied_opts)}  {res.baseline_s * 1e6:.1f} us",
       f"after  {res.kernel.name}  opts={format_opts(res.kernel.applied_opts)}  {res.time_s * 1e6:.1f} us" +
       (f"  ({res.baseline_s / res.time_s:.2f}x)" if math.isfinite(res.baseline_s) and res.time_s > 0 else ""))
  diskcache_put(TUNING_TABLE, tuning_key(k, dev, cfg), _entry(res, cfg, dev))
  _out("written to the tuning cache")
  return 0

# ***** replay, caches, devices *****

def cmd_replay(a: argparse.Namespace) -> int:
  from kernopt import replay
  if not os.path.exists(a.capture): raise UsageError(f"no capture at {a.capture}")
  files = replay.read(a.capture)
  if not files: raise UsageError(f"{a.capture} holds no capture files (<profile>/<case>.json)")
  diffs = replay.replay(files)
  for rel, diff in diffs:
    _out(f"changed: {rel}")
    sys.stdout.write(diff)
  _out(f"replay: {len(diffs)} of {len(files)} kernels changed" if diffs else f"replay: {len(files)} kernels unchanged")
  return 1 if diffs else 0

def _tables(which: str) -> tuple[str, ...]:
  return tuple(t for w, ts in CACHE_TABLES.items() if which in (w, "all") for t in ts)

def cmd_cache(a: argparse.Namespace) -> int:
  from kernopt import helpers
  from kernopt.search import export_cache, import_cache
  if a.action == "export": _out(f"exported {export_cache(a.path)} tuning entries to {a.path}")
  elif a.action == "import": _out(f"imported {import_cache(a.path)} tuning entries from {a.path}")
  elif a.action == "info":
    _out(f"cache directory {helpers.getconfig().cache_dir}" + (" (DISABLE_CACHE)" if helpers.getconfig().DISABLE_CACHE
                                                              else ""))
    for which, tables in CACHE_TABLES.items():
      n = sum(len(helpers.diskcache_items(t)) for t in tables)
      _out(f"{which:<8} {n} entries")
    for d in BINARY_DIRS:
      folder = os.path.join(helpers.getconfig().cache_dir, d)
      files = [os.path.join(folder, f) for f in os.listdir(folder)] if os.path.isdir(folder) else []
      _out(f"binaries {d}: {len(files)} files, {sum(os.path.getsize(f) for f in files if os.path.isfile(f))} bytes")
  else:
    def drop(table: str) -> int:
      sql = lambda conn: int(conn.execute(f"DELETE FROM {helpers._table(conn, table)}").rowcount)  # noqa: E731
      return helpers._db_call(sql) or 0
    dropped = sum(drop(t) for t in _tables(a.which))
    removed = 0
    if a.which in ("binary", "all"):
      for d in BINARY_DIRS:
        if os.path.isdir(folder := os.path.join(helpers.getconfig().cache_dir, d)):
          removed += len(os.listdir(folder))
          shutil.rmtree(folder)
    _out(f"cleared {a.which}: {dropped} entries, {removed} binary files")
  return 0

def cmd_devices(a: argparse.Namespace) -> int:
  from kernopt.runtime import _DEVICES, Device
  ok = Device.available()
  _out(f"available: {', '.join(ok) or 'none'}")
  for name in _DEVICES:
    if name not in ok: _out(f"{name}: unavailable: {Device.why_unavailable(name)}")
  return 0

# ***** the parser *****

def parser() -> argparse.ArgumentParser:
  ap = _Parser(prog="kernopt", description="kernopt's command line: AST files are what kernopt.save writes.")
  sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)
  def kernel_cmd(name: str, help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help)
    p.add_argument("file", help="an AST file (kernopt.save)")
    p.add_argument("--device", default="CPU", type=str.upper, help="device or dialect (default CPU)")
    return p
  p = kernel_cmd("show", "name, shape, Opts, explain() and source of an AST's kernel")
  p.add_argument("--opts", nargs="+", metavar="OP:AXIS:AMT", help="apply these Opts instead of the heuristics'")
  p.set_defaults(fn=cmd_show)
  p = kernel_cmd("run", "run on random inputs, check against the unoptimized kernel, time it")
  p.add_argument("--repeat", type=int, default=10)
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--opts", nargs="+", metavar="OP:AXIS:AMT", help="apply these Opts instead of the heuristics'")
  p.set_defaults(fn=cmd_run)
  p = kernel_cmd("search", "beam search, print before and after, write the tuning cache")
  p.add_argument("--budget", type=float, default=None, metavar="S", help="seconds (default: until converged)")
  p.add_argument("--beam", type=int, default=None)
  p.add_argument("--no-progress", action="store_true")
  p.set_defaults(fn=cmd_search)
  p = sub.add_parser("replay", help="re-render a process-replay capture (file or folder), list the changed kernels")
  p.add_argument("capture")
  p.set_defaults(fn=cmd_replay)
  p = sub.add_parser("cache", help="the program, binary and tuning caches")
  csub = p.add_subparsers(dest="action", required=True, parser_class=_Parser)
  csub.add_parser("info", help="entries in each cache")
  c = csub.add_parser("clear", help="empty a cache")
  c.add_argument("which", nargs="?", default="all", choices=("program", "binary", "tuning", "all"))
  csub.add_parser("export", help="write the tuning cache to a file").add_argument("path")
  csub.add_parser("import", help="merge a tuning-cache file").add_argument("path")
  p.set_defaults(fn=cmd_cache)
  sub.add_parser("devices", help="the devices usable here, and why the others are not").set_defaults(fn=cmd_devices)
  return ap

def main(argv: Optional[Sequence[str]] = None) -> int:
  """Run one command; its exit status."""
  try:
    args = parser().parse_args(argv)
    return int(args.fn(args))
  except UsageError as e: why = str(e)
  except KernoptError as e: why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
  except OSError as e: why = f"{e.filename or ''}{': ' if e.filename else ''}{e.strerror or e}"
  except KeyboardInterrupt: why = "interrupted"
  with contextlib.suppress(OSError): print(f"kernopt: error: {why}", file=sys.stderr)
  return 2
