"""The one-call entry: `kernopt.compile(ast, device)` is the standard protocol (or a search, when beam or the BEAM
knob asks) and a compile, through the persistent program cache; `compile_many` builds many kernels with the
compilers running in parallel; `stats()` counts what this process did. Imports debug, errors, helpers, heuristics,
kernel, ops, program_cache, renderers, runtime/ and search; numpy only through the runtime, on first call."""
from __future__ import annotations
import concurrent.futures as cf
import contextvars
import os
from typing import TYPE_CHECKING, Any, Iterable, Literal, NamedTuple, Optional, Union, overload
from kernopt import debug, program_cache
from kernopt.errors import KernoptError, VerifyError
from kernopt.helpers import STATS, getconfig
from kernopt.ops import LazyOp
if TYPE_CHECKING:
  from kernopt.heuristics import Explanation
  from kernopt.kernel import Kernel
  from kernopt.renderers import Program
  from kernopt.runtime import Compiled, CompiledRunner

def _device(device: Union[str, Compiled, None]) -> Compiled:
  from kernopt.runtime import Compiled, Device
  if device is None: return Device[Device.DEFAULT]
  if isinstance(device, str): return Device[device]
  if isinstance(device, Compiled): return device
  raise VerifyError(f"device must be a device name or a Device[...] object, got {type(device).__name__} {device!r}")

def optimize(ast: LazyOp, renderer: Any, beam: int = 0, device: Optional[Compiled] = None) -> Kernel:
  """The Kernel of ast, optimized by the standard protocol (required_optimizations, then tensor cores, else the
  hand-coded rules), or by a beam search of width `beam` on `device` through the tuning cache."""
  from kernopt.kernel import Kernel
  k = Kernel(ast, opts=renderer)
  if beam:
    from kernopt.search import SearchConfig, search_or_cached
    return search_or_cached(k, config=SearchConfig(beam=beam), device=device)
  k.required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def program(ast: LazyOp, device: Union[str, Compiled, None] = None, *, beam: Optional[int] = None,
            cache: bool = True) -> Program:
  """The rendered Program `compile` would build (from the program cache when it holds it)."""
  return _program(ast, device, beam, cache, False)[0]

def _program(ast: LazyOp, device: Union[str, Compiled, None], beam: Optional[int], cache: bool,
             want_kernel: bool) -> tuple[Program, Optional[Kernel]]:
  """`program`, and the optimized Kernel when want_kernel (rebuilt without rendering on a program-cache hit)."""
  if not isinstance(ast, LazyOp): raise VerifyError(f"compile takes a LazyOp AST, got {type(ast).__name__}")
  if not isinstance(cache, bool): raise VerifyError(f"cache must be a bool, got {type(cache).__name__} {cache!r}")
  debug.forget_cache_events()   # DEBUG=1 reports the caches' answers for this kernel from here on
  dev = _device(device)
  width = getconfig().BEAM if beam is None else beam
  if not isinstance(width, int) or isinstance(width, bool) or width < 0:
    raise VerifyError(f"beam must be a non-negative int, got {width!r}")
  use_cache = cache and not dev.interprets_uops
  key = program_cache.program_key(ast, dev.renderer, f"beam{width}" if width else "protocol") if use_cache else ""
  if use_cache and (prg := program_cache.get(key)) is not None:
    return prg, optimize(ast, dev.renderer, width, dev) if want_kernel else None
  k = optimize(ast, dev.renderer, width, dev)
  prg = k.to_program()
  if use_cache: program_cache.put(key, prg)
  return prg, k

class Explained(NamedTuple):
  """What `compile(..., explain=True)` returns: the runner and the decisions that chose its Opts."""
  runner: CompiledRunner
  explanation: Explanation

@overload
def compile(ast: LazyOp, device: Union[str, Compiled, None] = None, *, beam: Optional[int] = None,
            cache: bool = True, explain: Literal[False] = False) -> CompiledRunner: ...
@overload
def compile(ast: LazyOp, device: Union[str, Compiled, None] = None, *, beam: Optional[int] = None,
            cache: bool = True, explain: Literal[True]) -> Explained: ...
def compile(ast: LazyOp, device: Union[str, Compiled, None] = None, *, beam: Optional[int] = None,
            cache: bool = True, explain: bool = False) -> Union[CompiledRunner, Explained]:
  """The runner of ast on `device` (a name or a Device[...] object; default: the DEVICE knob, else CPU's native
  profile for this host). `beam` (default: the BEAM knob; 0 or unset: the standard protocol) searches with that
  beam width through the tuning cache. With `cache`, the rendered Program comes from the program cache when a
  process built it before (the AST, the device's capabilities, the codegen knobs and kernopt's source all equal),
  and binaries from the device's binary cache. Call the runner with one Buffer per MemBuffer index of the AST, in
  index order: `runner(*buffers, var_vals={...}, wait=True)`. With `explain=True` it returns `Explained(runner,
  explanation)`: `explanation` is the optimized Kernel's `explain()` (each heuristic's rule, the values that decided
  it and its Opt or why none; a searched kernel's Opts appear as "direct"); on a program-cache hit the Kernel is
  optimized again, without rendering, to explain it."""
  dev = _device(device)
  prg, k = _program(ast, dev, beam, cache, bool(explain))
  runner = dev.compile(prg)
  if not explain: return runner
  assert k is not None, "_program returns the kernel when asked"
  return Explained(runner, k.explain())

def compile_many(asts: Iterable[LazyOp], device: Union[str, Compiled, None] = None, *, beam: Optional[int] = None,
                 cache: bool = True, workers: Optional[int] = None) -> list[Union[CompiledRunner, KernoptError]]:
  """`compile` of every AST, in input order: the Programs are made here, one after the other, and each goes to the
  device compiler as soon as it is made, `workers` compiles at once (default: the usable cores; each compiler is its
  own process). A failed AST gives its KernoptError in its place; the others are unaffected."""
  if isinstance(asts, LazyOp): raise VerifyError("compile_many takes an iterable of ASTs, got one LazyOp: use compile")
  if isinstance(asts, (str, bytes)) or not hasattr(asts, "__iter__"):
    raise VerifyError(f"compile_many takes an iterable of ASTs, got {type(asts).__name__}")
  dev = _device(device)
  n = workers if workers is not None else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
  if not isinstance(n, int) or isinstance(n, bool) or n < 1:
    raise VerifyError(f"workers must be an int >= 1, got {n!r}")
  def build(prg: Union[Program, KernoptError]) -> Union[CompiledRunner, KernoptError]:
    if isinstance(prg, KernoptError): return prg
    try: return dev.compile(prg)
    except KernoptError as e: return e
  with cf.ThreadPoolExecutor(max_workers=n, thread_name_prefix="kernopt-compile") as pool:
    futs = []
    for ast in asts:   # each compile starts as soon as its Program is rendered, while the next one is made here
      try: prg: Union[Program, KernoptError] = program(ast, dev, beam=beam, cache=cache)
      except KernoptError as e: prg = e
      # in a copy of the caller's context, so config_override reaches the compile
      futs.append(pool.submit(contextvars.copy_context().run, build, prg))
    return [f.result() for f in futs]

def stats() -> dict[str, int]:
  """What this process did so far: lowerings, renders, compiles (compiler runs), binary_hits, program_cache_hits and
  program_cache_misses, tuning_cache_hits."""
  keys = ("lowerings", "renders", "compiles", "binary_hits", "program_cache_hits", "program_cache_misses",
          "tuning_cache_hits")
  return {k: STATS.get(k, 0) for k in keys} | {k: v for k, v in STATS.items() if k not in keys}

__all__ = ["compile", "compile_many", "program", "optimize", "stats", "Explained"]
