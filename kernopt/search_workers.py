"""Building a search's candidates in other processes: the task a worker gets (the AST as JSON, the Opts, the
renderer, the knobs), the worker's side (rebuild, apply, render, precompile into the on-disk cache), and the process
pool itself (started by forkserver or spawn, never fork; its workers ended when a build outlives the search).
Imports debug, dtype, helpers, kernel, ops, renderers, runtime and shape/."""
from __future__ import annotations
import concurrent.futures as cf
import dataclasses
import multiprocessing
from dataclasses import dataclass
from typing import Any, Optional
import numpy as np
from kernopt.debug import level as debug_level
from kernopt.dtype import ImageDType
from kernopt.helpers import config_override, getconfig
from kernopt.kernel import Kernel, Opt
from kernopt.ops import LazyOp, ast_from_json
from kernopt.renderers import Program, Renderer
from kernopt.runtime import Buffer, Compiled, CompiledRunner, Device, np_dtype
from kernopt.shape.symbolic import sym_infer

@dataclass(frozen=True)
class RenderTask:
  ast: dict
  digest: str
  opts: tuple[Opt, ...]
  renderer: Renderer
  device: Optional[tuple[str, tuple]]   # (name, options) to precompile into the on-disk cache, or None
  knobs: dict
  keep_uops: bool
  warm: bool = False   # launch once after compiling (PoCL builds each kernel's work-group code on first launch, into
                       # its on-disk kernel cache, so this process's first launch is then cheap)

_ast_memo: dict[str, LazyOp] = {}

def _decode(ast_json: dict, digest: str) -> LazyOp:
  if (ast := _ast_memo.get(digest)) is None:
    if len(_ast_memo) > 64: _ast_memo.clear()
    ast = _ast_memo[digest] = ast_from_json(ast_json)
  return ast

def render_task(task: RenderTask) -> tuple[Optional[Program], str]:
  """Worker side: rebuild the kernel, apply the opts, render, and precompile into the disk cache when asked.
  Returns (Program, "") or (None, why it failed)."""
  with config_override(**task.knobs):
    try:
      k = Kernel(_decode(task.ast, task.digest), opts=task.renderer)
      for o in task.opts: k.apply_opt(o)
      prg = k.to_program()
      if task.device is not None:
        runner = Device.open(task.device[0], **dict(task.device[1])).compile(prg)
        if task.warm and not prg.vars: _warm_up(runner, prg)
      return (prg if task.keep_uops else dataclasses.replace(prg, uops=None)), ""
    except Exception as e:  # a codegen bug must cost one candidate, not the search
      return None, f"{type(e).__name__}: {e}"

def noop() -> None: pass

def _warm_up(runner: CompiledRunner, prg: Program) -> None:
  """One launch on zeroed buffers of the program's sizes; a failure here is left for the timing to report."""
  try:
    bufs = [Buffer(runner.device.name, sym_infer(a.min_size, {}), a.dtype) for a in prg.args]
    for b in bufs: b.copyin(np.zeros(b.size, np_dtype(b.dtype.base if isinstance(b.dtype, ImageDType) else b.dtype)))
    runner(*bufs, wait=True)
  except Exception: pass

def device_spec(dev: Compiled) -> Optional[tuple[str, tuple]]:
  """(name, options) that reopen dev with Device.open in another process, or None if dev wasn't opened that way."""
  return (dev.name, tuple(sorted(dev.options.items()))) if dev in Device.opened() else None

def worker_knobs() -> dict[str, Any]:
  cfg = getconfig()
  ret = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
  ret["DEBUG"] = debug_level()   # 0 in a search: its workers print nothing either
  if not ret["CACHE_DIR"]: del ret["CACHE_DIR"]  # a remote worker keeps its own default
  return ret

def stop_pool(pool: cf.Executor, terminate: bool) -> None:
  """Shut down a pool the search started; with `terminate`, end its workers now: a build still running past the
  grace period (PoCL's, inside the worker, can't be interrupted) would otherwise hold a core for seconds after the
  search returns, and the caller's next timings would see it."""
  workers = list((getattr(pool, "_processes", None) or {}).values()) if terminate else []
  pool.shutdown(wait=False, cancel_futures=True)
  for proc in workers:
    if proc.is_alive(): proc.terminate()

def process_pool(workers: int) -> cf.ProcessPoolExecutor:
  methods = multiprocessing.get_all_start_methods()
  ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")  # never fork
  return cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
