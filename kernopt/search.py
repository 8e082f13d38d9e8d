"""Beam search over Opts, timed on a device and validated against the unoptimized kernel, and the tuning cache that
remembers its results (on disk; exportable as one JSON file). Candidates are rendered and compiled in worker
processes of any concurrent.futures.Executor, then timed one at a time here; tqdm (progress) and dask (tune_all on a
cluster) only when present and asked for. Beside it, and re-exported here: its settings and report
(kernopt.search_config), the action space (kernopt.search_space), validation (kernopt.validation), the worker side
(kernopt.search_workers) and the export file (kernopt.tuning_file). Imports debug, errors, helpers, kernel, ops,
renderers, runtime, search_config, search_space, search_workers, tuning_file and validation."""
from __future__ import annotations
import concurrent.futures as cf
import contextvars
import dataclasses
import hashlib
import json
import math
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence
import kernopt
from kernopt import debug, ops
from kernopt.errors import KernelOptError, KernoptError, VerifyError
from kernopt.helpers import ansistrip, config_override, count, diskcache_get, diskcache_put, getconfig
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import LazyOp
from kernopt.renderers import Program
from kernopt.runtime import Buffer, Compiled, CompiledRunner, Device
from kernopt.search_config import SearchConfig, SearchResult, SearchStats
from kernopt.search_space import GROUP_AMTS, LOCAL_AMTS, PADTO_AMTS, TC_AXES, TC_OPT_LEVEL, UNROLL_AMTS, \
  UPCAST_AMTS, _interleave, _upcast_size, actions, expand  # noqa: F401 (re-exported)
from kernopt.search_workers import RenderTask, device_spec, noop, process_pool, render_task, stop_pool, worker_knobs
from kernopt.tuning_file import EXPORT_FORMAT, EXPORT_VERSION, TUNING_TABLE, export_cache, import_cache  # noqa: F401
from kernopt.validation import Validator, _as_float, _reference_kernel, random_array, tolerance  # noqa: F401

KEY_VERSION = 1   # bump when the meaning of a tuning entry changes

# seconds a finished search waits for its workers' running builds (PoCL's can't be interrupted)
SHUTDOWN_GRACE_S = 1.0

# ***** Opts as plain data *****

def opt_to_json(o: Opt) -> list[Any]: return [o.op.name, o.axis, o.amt]

def opt_from_json(x: Sequence[Any]) -> Opt:
  """[op name, axis, amt] -> Opt; raises KernelOptError on an unknown op name."""
  if len(x) != 3 or x[0] not in OptOps.__members__: raise KernelOptError(f"not a serialized Opt: {x!r}")
  return Opt(OptOps[x[0]], x[1], x[2])

# ***** progress *****

class _Progress:
  """tqdm on stderr when installed, else one plain line per round; nothing when off."""
  def __init__(self, on: bool, name: str):
    self.on, self.name, self.bar = on, name, None
    if on:
      try:
        from tqdm import tqdm
        self.bar = tqdm(desc=f"search {name}", file=sys.stderr, leave=False, unit="cand")
      except ImportError: pass

  def round(self, rnd: int, n: int, best: float) -> None:
    if not self.on: return
    if self.bar is not None:
      self.bar.reset(total=n)
      self.bar.set_description(f"search round {rnd}, best {best * 1e6:.1f} us")
    else: print(f"search {self.name}: round {rnd}, best {best * 1e6:.1f} us, {n} candidates", file=sys.stderr)

  def step(self) -> None:
    if self.bar is not None: self.bar.update(1)

  def close(self) -> None:
    if self.bar is not None: self.bar.close()

# ***** the search *****

@dataclass
class _Cand:
  digest: str
  kernel: Kernel
  runner: Optional[CompiledRunner] = None
  time_s: float = math.inf
  valid: Optional[bool] = None

class _Search:
  def __init__(self, kernel: Kernel, buffers: Optional[Sequence[Buffer]], cfg: SearchConfig, var_vals: Optional[dict],
               device: Optional[Compiled]):
    self.kernel, self.cfg = kernel, cfg
    self.dev = _device(kernel, buffers, device)
    self.stats = SearchStats()
    self.t0 = time.perf_counter()
    self.deadline = self.t0 + cfg.time_budget_s if cfg.time_budget_s is not None else math.inf
    self.var_vals = dict(var_vals) if var_vals is not None else {v.expr: (v.min + v.max) // 2 for v in kernel.vars}
    self.validator: Optional[Validator] = None
    sizes = [b.size for b in buffers] if buffers else None
    if cfg.validate or not buffers: self.validator = Validator(kernel, self.dev, self.var_vals, sizes, cfg.seed)
    self.bufs = list(buffers) if buffers else self.validator.bufs  # type: ignore[union-attr]
    self.executor, self.own_executor = cfg.executor, False
    self.threads: Optional[cf.ThreadPoolExecutor] = None
    self.inflight: set[cf.Future] = set()   # builds submitted to the executor and not collected
    self.ast_json = ops.ast_to_json(kernel.ast)
    self.ast_digest = ops.ast_digest(kernel.ast)
    self.progress = _Progress(cfg.progress is True, ansistrip(kernel.name))
    self.best_time = math.inf
    self.chunk = max(4, 2 * cfg.workers)
    self.timing_reserve = 0.0   # builds stop waiting this long before the deadline, to leave time to time them
    self.budget_bound = False   # the last build wait was limited by the budget, not by compile_timeout_s

  def out_of_time(self) -> bool:
    """True once the search's part of the budget is spent (the final re-timing has its own reserve after it)."""
    if time.perf_counter() >= self.deadline: self.stats.out_of_budget = True
    return self.stats.out_of_budget

  def _measure_cost(self, t: float) -> float:
    """Seconds one _measure(cutoff=False) of a kernel that runs t seconds takes: a warm-up, then repeats runs
    spanning at least min_time_s."""
    return t + max(self.cfg.repeats * t, self.cfg.min_time_s) if math.isfinite(t) else 0.0

  def _reserve(self, best: _Cand, baseline: Optional[_Cand]) -> None:
    """Move the deadline earlier by what one pass of the final interleaved re-timing (it does as many of its 3 passes
    as fit) and shutting down (the workers' last builds) take, so the whole search ends within time_budget_s."""
    if self.cfg.time_budget_s is None: return
    confirm = 1.5 * (self._measure_cost(best.time_s) + (self._measure_cost(baseline.time_s) if baseline else 0.0))
    grace = min(SHUTDOWN_GRACE_S, 0.1 * self.cfg.time_budget_s) if self.executor is not None else 0.0
    self.deadline = self.t0 + self.cfg.time_budget_s - confirm - grace - 0.02 * self.cfg.time_budget_s - 0.05

  # -- build --
  def start_pool(self) -> None:
    """Start the private worker pool, if the search will have one, without waiting for its workers to come up."""
    if self.executor is None and self.cfg.workers > 0 and not self.dev.interprets_uops:
      self.executor, self.own_executor = process_pool(self.cfg.workers), True
      for _ in range(self.cfg.workers): self.executor.submit(noop)

  def build(self, cands: list[_Cand], force: bool = False, here: bool = False) -> list[_Cand]:
    """Render and compile cands (in workers when there are any and not `here`; compiles run in parallel either way);
    those that fail or take over compile_timeout_s are dropped."""
    if self.executor is None and self.cfg.workers > 0 and len(cands) > 1 and not self.dev.interprets_uops and \
       not here:
      self.executor, self.own_executor = process_pool(self.cfg.workers), True
    if self.executor is None or here: programs = self._render_here(cands, force)
    else:
      try: programs = self._build_remote(cands, force)
      except cf.BrokenExecutor as e:  # e.g. a script without `if __name__ == "__main__":` under spawn/forkserver
        warnings.warn(f"search: the executor broke ({e}); building candidates in this process", RuntimeWarning)
        self._drop_executor()
        return self.build(cands, force)
    ret, started = [], []
    if self.threads is None: self.threads = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kernopt-search")
    for c, prg, err in programs:
      # each compile runs in a copy of this context, so config_override (CACHE_DIR, COMPILE_TIMEOUT, ...) holds there
      fut = self.threads.submit(contextvars.copy_context().run, self.dev.compile, prg) if prg is not None else None
      started.append((c, prg, err, fut))
    for c, prg, err, fut in started:
      if fut is not None:
        try: c.runner = fut.result(timeout=self._wait_limit(force))
        except KernoptError as e: prg, err = None, f"{type(e).__name__}: {e}"
        except cf.TimeoutError:
          fut.cancel()   # still queued behind slow builds: never started
          prg, err = None, "compile timed out"
          self._note_budget(force)
      if prg is None:
        self.stats.failed += 1
        if getconfig().DEBUG >= 2: debug.emit(f"search: {list(c.kernel.applied_opts)} failed: {err}")
        continue
      self.stats.compiled += 1
      ret.append(c)
    order = {id(c): i for i, c in enumerate(cands)}
    return sorted(ret, key=lambda c: order[id(c)])

  def _note_budget(self, force: bool) -> None:
    """A build wait that the budget (not compile_timeout_s) cut short spends the budget: the search ends there."""
    if not force and self.budget_bound: self.stats.out_of_budget = True

  def _wait_limit(self, force: bool) -> float:
    left = self.deadline - self.timing_reserve - time.perf_counter() if not force else math.inf
    self.budget_bound = left < self.cfg.compile_timeout_s
    return max(min(self.cfg.compile_timeout_s, left), 0.0)

  def _render_here(self, cands: list[_Cand], force: bool) -> list[tuple[_Cand, Optional[Program], str]]:
    ret: list[tuple[_Cand, Optional[Program], str]] = []
    for c in cands:
      if not force and self.out_of_time(): break
      try: ret.append((c, c.kernel.copy().to_program(), ""))
      except Exception as e: ret.append((c, None, f"{type(e).__name__}: {e}"))  # a codegen bug costs one candidate
    return ret

  def _build_remote(self, cands: list[_Cand], force: bool) -> list[tuple[_Cand, Optional[Program], str]]:
    spec = device_spec(self.dev) if self.dev.caches_binaries else None
    # a worker's compiler is killed once it outlives the wait for it (at the latest when the budget ends)
    knobs = {**worker_knobs(), "COMPILE_TIMEOUT": max(self._wait_limit(force), 0.05)}
    assert self.executor is not None
    futs = {self.executor.submit(render_task, RenderTask(self.ast_json, self.ast_digest, c.kernel.applied_opts,
                                                           c.kernel.opts, spec, knobs, self.dev.interprets_uops,
                                                           spec is not None and self.dev.warmup_launch)): c
            for c in cands}
    pending, ret = set(futs), []
    self.inflight |= pending
    while pending:  # until the budget ends or no candidate finishes for compile_timeout_s
      done, pending = cf.wait(pending, timeout=self._wait_limit(force), return_when=cf.FIRST_COMPLETED)
      if not done: break
      for f in done:
        try: prg, err = f.result()
        except cf.BrokenExecutor: raise
        except Exception as e: prg, err = None, f"{type(e).__name__}: {e}"
        ret.append((futs[f], prg, err))
    for f in pending: f.cancel()
    self.inflight = {f for f in self.inflight if not f.done()}
    self.stats.failed += len(pending)
    if pending: self._note_budget(force)
    self.out_of_time()
    return ret

  # -- measure --
  def time_all(self, cands: list[_Cand], force: bool = False) -> list[_Cand]:
    """Time each candidate (min of repeats; one run when clearly slower than the best); fastest first."""
    ret = []
    for c in cands:
      if not force and self.out_of_time(): break
      assert c.runner is not None
      try: c.time_s = self._measure(c.runner)
      except KernoptError as e:
        self.stats.failed += 1
        if getconfig().DEBUG >= 2: debug.emit(f"search: {list(c.kernel.applied_opts)} failed to run: {e}")
        continue
      self.stats.timed += 1
      self.best_time = min(self.best_time, c.time_s)
      self.progress.step()
      ret.append(c)
    return sorted(ret, key=lambda c: c.time_s)

  def _measure(self, runner: CompiledRunner, cutoff: bool = True) -> float:
    """After one warm-up run, the minimum of at least `repeats` runs spread over at least `min_time_s` (a preempted
    run is an outlier, not the answer); just the warm-up when it is over `cutoff` times the best so far."""
    first = runner(*self.bufs, var_vals=self.var_vals, wait=True)  # warm-up: the first call pays page faults
    if first is None: return math.inf
    if cutoff and first > self.cfg.cutoff * self.best_time: return first
    best, runs, st = math.inf, 0, time.perf_counter()
    while True:
      t = runner(*self.bufs, var_vals=self.var_vals, wait=True)
      best, runs = min(best, t if t is not None else math.inf), runs + 1
      if (cutoff and best > self.cfg.cutoff * self.best_time) or runs >= 64 * self.cfg.repeats: break
      if runs >= self.cfg.repeats and time.perf_counter() - st >= self.cfg.min_time_s: break
    return best

  def winners(self, timed: list[_Cand], n: int, force: bool = False) -> list[_Cand]:
    """The n fastest candidates that pass validation (every candidate passes when validation is off)."""
    ret: list[_Cand] = []
    for c in timed:
      if len(ret) >= n or (not force and self.out_of_time()): break
      if self.validator is not None and self.cfg.validate and c.valid is None:
        assert c.runner is not None
        why = self.validator.check(c.runner)
        self.stats.validated += 1
        c.valid = why is None
        if why is not None:
          self.stats.rejected += 1
          warnings.warn(f"search: candidate {list(c.kernel.applied_opts)} of AST {self.ast_digest[:16]} (optimized AST "
                        f"{c.digest[:16]}) differs from the unoptimized kernel: {why}; dropped", RuntimeWarning)
      if c.valid is not False: ret.append(c)
    return ret

  def _drop_executor(self, wait: bool = False) -> None:
    """Stop using the worker pool. With `wait` (the end of a search), builds still running get up to
    SHUTDOWN_GRACE_S to end (a CPU compile is killed at the budget's end by COMPILE_TIMEOUT), so they don't compete
    with whatever the caller times next."""
    for f in self.inflight: f.cancel()
    if wait and self.inflight:
      left = self.t0 + self.cfg.time_budget_s - time.perf_counter() if self.cfg.time_budget_s is not None else math.inf
      cf.wait(self.inflight, timeout=max(0.1, min(SHUTDOWN_GRACE_S, left)))
    busy = any(not f.done() for f in self.inflight)
    self.inflight = set()
    if self.own_executor and self.executor is not None: stop_pool(self.executor, terminate=busy)
    # queued local builds never start (a build already compiling ends by COMPILE_TIMEOUT)
    if self.threads is not None: self.threads.shutdown(wait=False, cancel_futures=True)
    self.threads = None
    self.executor, self.own_executor = None, False
    self.cfg = dataclasses.replace(self.cfg, executor=None, workers=0)

  def _confirm(self, best: _Cand, baseline: _Cand) -> _Cand:
    """best and the standard protocol's kernel timed again, interleaved: a winner by noise must not beat hand-coded."""
    assert best.runner is not None and baseline.runner is not None
    t = {id(best): math.inf, id(baseline): math.inf}
    end = self.t0 + self.cfg.time_budget_s if self.cfg.time_budget_s is not None else math.inf
    for i in range(3):
      st = time.perf_counter()
      for c in (best, baseline): t[id(c)] = min(t[id(c)], self._measure(c.runner, cutoff=False))  # type: ignore
      if i < 2 and time.perf_counter() + (time.perf_counter() - st) * 1.2 > end - 0.05: break
    best.time_s, baseline.time_s = t[id(best)], t[id(baseline)]
    if best.time_s <= baseline.time_s or self.winners([baseline], 1, force=True) == []: return best
    return baseline

  def _restart(self, pool: list[_Cand], expanded: set[str], best: _Cand, width: int) -> list[_Cand]:
    """The next beam of a converged budgeted search: the `width` fastest valid timed candidates not expanded yet,
    within `cutoff` of the best; [] ends the search."""
    rest = sorted({c.digest: c for c in pool if c.digest not in expanded and c.runner is not None and
                   c.time_s <= self.cfg.cutoff * best.time_s}.values(), key=lambda c: c.time_s)
    return self.winners(rest, width)

  def _near(self, beam: list[_Cand]) -> list[_Cand]:
    """beam without the kernels over `cutoff` times slower than its best: their children are rarely worth building."""
    return [c for c in beam if c.time_s <= self.cfg.cutoff * beam[0].time_s] if beam else beam

  def run(self) -> SearchResult:
    try: res = self._run()
    finally: self._drop_executor(wait=True)
    self.stats.wall_s = time.perf_counter() - self.t0
    self.progress.close()
    return res

  def _run(self) -> SearchResult:
    cfg, width = self.cfg, max(self.cfg.width, 1)
    seen: set[str] = set()
    start = _Cand(ops.ast_digest(self.kernel.get_optimized_ast()), self.kernel.copy())
    seen.add(start.digest)
    seeds = [start]
    baseline: Optional[_Cand] = None  # the standard protocol's choice, timed first so the cutoff spares a slow start
    if not self.kernel.applied_opts:
      hc = self.kernel.copy()
      try:
        if not hc.apply_tensor_cores(tc_opt=TC_OPT_LEVEL): hc.hand_coded_optimizations()
        baseline = _Cand(ops.ast_digest(hc.get_optimized_ast()), hc)
        if baseline.digest in seen: baseline = start
        else: seeds.insert(0, baseline)
        seen.add(baseline.digest)
      except KernoptError: baseline = None
    # round 0 (the start and the standard protocol) always completes, whatever the budget
    self.start_pool()   # its workers come up while round 0 builds here
    built = self.build(seeds, force=True, here=True)
    timed = self.time_all([c for c in built if c is not start], force=True)
    ref_t = self.validator.ref_time if self.validator is not None else math.inf
    ref_digest = ops.ast_digest(_reference_kernel(self.kernel).get_optimized_ast())
    good = self.winners(timed, 1, force=True)
    if start in built and not (good and start.digest == ref_digest and ref_t > cfg.cutoff * good[0].time_s):
      timed = self.time_all([start], force=True) + timed   # (else its reference run already showed it slow)
      timed.sort(key=lambda c: c.time_s)
    beam = self._near(self.winners(timed, width, force=True))
    best = beam[0] if beam else start
    self._reserve(best, baseline)
    rnd, stale = 0, 0
    expanded: set[str] = set()
    pool: list[_Cand] = list(timed)   # every timed candidate: with a budget, a converged search goes on from them
    max_rounds = cfg.max_rounds if cfg.max_rounds is not None else 12 if cfg.time_budget_s is None else math.inf
    while beam and rnd < max_rounds and not self.out_of_time():
      rnd += 1
      expanded.update(c.digest for c in beam)
      cands = _interleave([[_Cand(d, k) for d, k in expand(c.kernel, cfg, seen, self.stats)] for c in beam])
      if not cands:
        beam = self._restart(pool, expanded, best, width) if cfg.time_budget_s is not None else []
        continue
      self.progress.round(rnd, len(cands), best.time_s)
      timed = []
      for i in range(0, len(cands), self.chunk):  # build a chunk, time it: a budget ending mid-round wastes no build
        chunk = cands[i:i + self.chunk]
        self.timing_reserve = len(chunk) * self._measure_cost(self.best_time)
        timed += self.time_all(self.build(chunk))
        if self.out_of_time(): break
      timed.sort(key=lambda c: c.time_s)
      pool += timed
      new = self._near(self.winners(timed, width))
      self.stats.rounds = rnd
      improved = bool(new) and new[0].time_s < best.time_s * (1 - cfg.min_progress)
      if new and new[0].time_s < best.time_s: best = new[0]
      stale = 0 if improved else stale + 1
      if not new or stale > (cfg.patience if cfg.time_budget_s is not None else 0):
        if cfg.time_budget_s is None: break
        # converged with budget left: continue from the fastest candidates not expanded yet
        beam, stale = self._restart(pool, expanded, best, width), 0
        continue
      beam = new
    if baseline is not None and baseline is not best and baseline.runner is not None and best.runner is not None and \
       baseline.valid is not False:
      best = self._confirm(best, baseline)
    valid = bool(cfg.validate and self.validator is not None and best.valid)
    base_t = baseline.time_s if baseline is not None else math.inf
    return SearchResult(best.kernel, best.time_s, base_t, valid, self.stats)

def _device(kernel: Kernel, buffers: Optional[Sequence[Buffer]], device: Optional[Compiled]) -> Compiled:
  """device, else the open device whose renderer the kernel uses, else the buffers' device, else the dialect's."""
  if device is not None: return device
  for d in Device.opened():
    if d.renderer is kernel.opts: return d
  return buffers[0].dev if buffers else Device[kernel.opts.caps.device]

def _check_call(what: str, kernel: Any, buffers: Any, config: Any, device: Any) -> None:
  """VerifyError naming the first argument of a search entry point that is not what it takes."""
  if not isinstance(kernel, Kernel):
    raise VerifyError(f"{what} takes a Kernel (Kernel(ast, opts=...)), got {type(kernel).__name__}")
  if buffers is not None and not (isinstance(buffers, (list, tuple)) and all(isinstance(b, Buffer) for b in buffers)):
    raise VerifyError(f"{what}: buffers must be None or a list of Buffers, got {type(buffers).__name__} "
                      f"{str(buffers)[:60]}")
  if config is not None and not isinstance(config, SearchConfig):
    raise VerifyError(f"{what}: config must be a SearchConfig or None, got {type(config).__name__}")
  if device is not None and not isinstance(device, Compiled):
    raise VerifyError(f"{what}: device must be an opened device (Device.open) or None, got {type(device).__name__}")

def search(kernel: Kernel, buffers: Optional[Sequence[Buffer]] = None, config: Optional[SearchConfig] = None,
           var_vals: Optional[dict] = None, device: Optional[Compiled] = None) -> SearchResult:
  """Beam search from kernel's current Opts (and, when it has none, also from the standard protocol's choice, so the
  result is never slower than hand-coded as measured here). Timed on `buffers` (in MemBuffer index order; their
  outputs are overwritten) or on seeded random buffers when None, on `device` (default: the buffers' device, else
  the kernel's dialect's). var_vals default to each variable's midpoint. Tensor cores are tried, and the standard
  protocol applies them, at TC_OPT level TC_OPT_LEVEL (2), whatever the knob. No cache."""
  _check_call("search", kernel, buffers, config, device)
  cfg = config if config is not None else SearchConfig()
  with debug.quiet():   # candidates are no kernels of the user's: no DEBUG line each
    res = _Search(kernel, buffers, cfg, var_vals, device).run()
  if cfg.progress is True or debug.on(1):
    st = res.stats
    debug.emit(debug.search_line(ansistrip(res.kernel.name), res.time_s, res.baseline_s, res.kernel.applied_opts,
                                 st.rounds, st.compiled, st.timed, st.wall_s))
  debug.forget_cache_events()
  return res

def beam_search(kernel: Kernel, buffers: Optional[Sequence[Buffer]] = None, config: Optional[SearchConfig] = None,
                var_vals: Optional[dict] = None, device: Optional[Compiled] = None) -> Kernel:
  """The best kernel `search` finds (a new Kernel; `kernel` is unchanged). Never consults the tuning cache: use
  `search_or_cached` for that."""
  return search(kernel, buffers, config, var_vals, device).kernel

# ***** the tuning cache *****

def tuning_key(kernel: Kernel, device: Optional[Compiled] = None, config: Optional[SearchConfig] = None) -> str:
  """The tuning-cache key: everything that can change a search's result. The AST's digest and the kernel's starting
  Opts, the dialect's capabilities, the device's compiler id (compiler, version, flags, ISA), the search fields that
  change what may win (beam width, validation), the knobs that change codegen, and kernopt's version."""
  cfg = config if config is not None else SearchConfig()
  dev = _device(kernel, None, device)
  knobs = getconfig()
  material = {"key": KEY_VERSION, "ast": ops.ast_digest(kernel.ast),
              "start": [opt_to_json(o) for o in kernel.applied_opts],
              "renderer": kernel.opts.capabilities(), "device": dev.name, "compiler": dev.compiler_id(),
              "beam": cfg.width, "validate": cfg.validate, "use_tc": knobs.USE_TC, "nolocals": knobs.NOLOCALS,
              "kernopt": kernopt.__version__}
  return "tune-" + hashlib.sha256(json.dumps(material, sort_keys=True, default=repr).encode()).hexdigest()

def _usable(entry: Any, cfg: SearchConfig) -> bool:
  """A complete search's entry always serves; one cut short by its budget only serves requests with no more budget."""
  if not isinstance(entry, dict) or not isinstance(entry.get("opts"), list): return False
  if entry.get("complete", True): return True
  return cfg.time_budget_s is not None and cfg.time_budget_s <= (entry.get("budget_s") or 0.0)

def _reapply(kernel: Kernel, opts: list) -> Optional[Kernel]:
  """kernel's copy with the stored opts beyond its own applied; None if they don't apply."""
  try:
    stored = [opt_from_json(o) for o in opts]
    n = len(kernel.applied_opts)
    if tuple(stored[:n]) != kernel.applied_opts: return None
    k = kernel.copy()
    for o in stored[n:]: k.apply_opt(o)
    return k
  except (KernoptError, TypeError): return None

def _entry(res: SearchResult, cfg: SearchConfig, dev: Compiled) -> dict[str, Any]:
  return {"opts": [opt_to_json(o) for o in res.kernel.applied_opts], "validated": res.validated, "time_s": res.time_s,
          "baseline_s": res.baseline_s if math.isfinite(res.baseline_s) else None, "searched_at": time.time(),
          "complete": not res.stats.out_of_budget, "budget_s": cfg.time_budget_s, "imported": False,
          "device": dev.name, "kernel": ansistrip(res.kernel.name), "compiled": res.stats.compiled,
          "timed": res.stats.timed}

def lookup(kernel: Kernel, device: Optional[Compiled] = None, config: Optional[SearchConfig] = None) -> Optional[dict]:
  """The tuning-cache entry for kernel on device under config, or None."""
  return diskcache_get(TUNING_TABLE, tuning_key(kernel, device, config))

def search_or_cached(kernel: Kernel, buffers: Optional[Sequence[Buffer]] = None, config: Optional[SearchConfig] = None,
                     var_vals: Optional[dict] = None, device: Optional[Compiled] = None) -> Kernel:
  """The tuned kernel: a cache hit re-applies the stored Opts (milliseconds; an imported entry is validated on
  first use); a miss searches and stores the result."""
  _check_call("search_or_cached", kernel, buffers, config, device)
  cfg = config if config is not None else SearchConfig()
  dev = _device(kernel, buffers, device)
  key = tuning_key(kernel, dev, cfg)
  entry = diskcache_get(TUNING_TABLE, key)
  if _usable(entry, cfg) and (k := _reapply(kernel, entry["opts"])) is not None:
    if not (entry.get("imported") and not entry.get("validated") and cfg.validate):
      count("tuning_cache_hits")
      return k
    sizes = [b.size for b in buffers] if buffers else None
    vv = dict(var_vals) if var_vals is not None else {v.expr: (v.min + v.max) // 2 for v in kernel.vars}
    why = Validator(kernel, dev, vv, sizes, cfg.seed).check(dev.compile(k.to_program()))
    if why is None:
      diskcache_put(TUNING_TABLE, key, {**entry, "validated": True, "imported": False})
      return k
    warnings.warn(f"search: imported tuning entry {list(entry['opts'])} for AST {ops.ast_digest(kernel.ast)[:16]} "
                  f"fails validation ({why}); searching again", RuntimeWarning)
  res = search(kernel, buffers, cfg, var_vals, dev)
  diskcache_put(TUNING_TABLE, key, _entry(res, cfg, dev))
  return res.kernel

# ***** many kernels, possibly on a cluster *****

def _tune_task(ast_json: dict, device: str, device_options: tuple, cfg: SearchConfig,
               knobs: dict) -> tuple[str, str, dict]:
  """Worker side of tune_all: search one AST fully (building and timing here), return (digest, key, entry)."""
  with config_override(**knobs):
    dev = Device.open(device, **dict(device_options))
    k = Kernel(ops.ast_from_json(ast_json), opts=dev.renderer)
    res = search(k, None, cfg, None, dev)
    key = tuning_key(k, dev, cfg)
    entry = _entry(res, cfg, dev)
    diskcache_put(TUNING_TABLE, key, entry)
    return ops.ast_digest(k.ast), key, entry

def tune_all(asts: Iterable[LazyOp], device: str = "CPU", executor: Optional[cf.Executor] = None,
             config: Optional[SearchConfig] = None, device_options: Optional[dict] = None) -> dict[str, list[Opt]]:
  """Tune every AST (from no Opts) and merge the results into this process's tuning cache; returns {AST digest:
  Opts}. One task searches one AST completely, compiling in-process and timing on its worker's own device, so two
  tasks on one machine time at once: a local executor should have one worker. A dask.distributed cluster's
  `client.get_executor()` works; an AST already in the cache is not searched again."""
  cfg = config if config is not None else SearchConfig(progress=False)
  cfg = dataclasses.replace(cfg, executor=None, workers=0, progress=cfg.progress and executor is None)
  opts_t = tuple(sorted((device_options or {}).items()))
  dev = Device.open(device, **dict(opts_t))
  ret: dict[str, list[Opt]] = {}
  todo = []
  for ast in asts:
    k = Kernel(ast, opts=dev.renderer)
    entry = diskcache_get(TUNING_TABLE, tuning_key(k, dev, cfg))
    if _usable(entry, cfg) and _reapply(k, entry["opts"]) is not None:
      ret[ops.ast_digest(ast)] = [opt_from_json(o) for o in entry["opts"]]
    else: todo.append(ast)
  tasks = [(ops.ast_to_json(ast), dev.name, opts_t, cfg, worker_knobs()) for ast in todo]
  if executor is None: results = [_tune_task(*t) for t in tasks]
  else: results = [f.result() for f in [executor.submit(_tune_task, *t) for t in tasks]]
  for digest, key, entry in results:
    diskcache_put(TUNING_TABLE, key, entry)
    ret[digest] = [opt_from_json(o) for o in entry["opts"]]
  return ret
