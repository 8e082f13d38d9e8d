"""The Kernel: the public face of a loop nest being optimized (DESIGN.md's `Kernel`). Built from a KERNEL AST and a
renderer, it applies Opts all or nothing (the shape Opts in kernopt.shape_opts, tensor cores in
kernopt.tensor_core_fit), runs the standard protocol's steps (required optimizations, tensor cores, the heuristics
profile the renderer names in kernopt.heuristics_registry), explains its choices, and lowers, passes and renders its
optimized AST (kernopt.optimized_ast). Imports dtype, helpers, debug, errors, shape/, ops, uops, renderers, uopgraph,
passes, lowerer, capture, opt, decisions, loop_nest, shape_opts, tensor_core_fit, optimized_ast and
heuristics_registry; the lowerer, passes, uopgraph, uops and capture inside `linearize` and `to_program`."""
from __future__ import annotations
from dataclasses import replace
from typing import Any, Optional
from kernopt import debug, decisions, heuristics_registry, ops, shape_opts, tensor_core_fit
from kernopt.decisions import Decision, Explanation
from kernopt.dtype import ImageDType
from kernopt.errors import KernelOptError, UnsupportedError, VerifyError
from kernopt.helpers import ansistrip, count, getconfig, to_function_name
from kernopt.loop_nest import LoopNest, divides
from kernopt.opt import Opt, OptOps, TensorCoreOptions
from kernopt.optimized_ast import optimized_ast
from kernopt.ops import BufferOps, LazyOp, MemBuffer, MetaOps
from kernopt.renderers import BufferArg, Program, Renderer, VarArg, get_renderer, var_dtype
from kernopt.shape.shapetracker import bounds_union
from kernopt.shape.symbolic import sint

__all__ = ["Kernel", "Opt", "OptOps", "TensorCoreOptions", "RULES", "default_renderer"]

# the rules kernel.py itself records (the heuristics modules declare theirs), as Decisions cite them
RULES: dict[str, str] = {
  "direct": "an Opt applied by the caller (apply_opt, apply_tensor_cores' extra_opts, a search), not by a rule",
  "required.image_output": "an image output: UPCAST its first unit-stride axis divisible by 4 (float4 texels)",
  "kernel.empty": "an axis of size 0: no heuristic runs",
  "tc.off": "the dialect has no tensor cores and USE_TC != 2",
  "tc.no_match": "a tensor core tried, and why it does not fit the reduce",
  "tc.refused": "why no tensor core applied: the check that refused it, or an Opt after it that was refused",
  "tc.apply": "the first tensor core that fits: TC with its N, M, K axes and pads",
  "tc.upcast": "after a tensor core: UPCAST M, then N, by their largest divisor of at most 5",
  "tc.local": "after a tensor core: LOCAL N by 4 or 2",
}

def default_renderer() -> Renderer:
  """What `Kernel(ast)` targets without `opts`: with DEVICE unset or CPU, the native CPU profile of this host (its
  vector width, FMA and cores; no device is opened, no numpy imported); with another DEVICE, that dialect's static
  profile. The spec's static C dialect stays `get_renderer("CPU")`."""
  device = (getconfig().DEVICE or "CPU").upper()
  if device == "CPU":
    from kernopt.renderers.native import NativeCRenderer
    return NativeCRenderer()
  return get_renderer(device)

class Kernel(LoopNest):
  """The loop nest of one KERNEL AST (kernopt.loop_nest) and the Opts that shape it. Every buffer (and each reduce's
  input and output) has a ShapeTracker of the same rank; Opts split, move and pad axes of all of them together. The
  state is a few immutable fields, so `copy()` shares them, a refused Opt restores them exactly, and a heuristic that
  tries something can undo it with `snapshot()` / `restore()`."""

  def __init__(self, *ast: LazyOp, opts: Optional[Renderer] = None):
    if not ast: raise VerifyError("Kernel needs a KERNEL op or one or more STOREs")
    if any(not isinstance(x, LazyOp) for x in ast):
      raise VerifyError(f"Kernel takes LazyOps, got {[type(x).__name__ for x in ast]}")
    if len(ast) == 1 and ast[0].op is MetaOps.KERNEL: root = ast[0]
    elif all(x.op is BufferOps.STORE for x in ast): root = LazyOp(MetaOps.KERNEL, tuple(ast))
    else: raise VerifyError(f"Kernel takes one KERNEL op or only STOREs, got {[x.op for x in ast]}")
    if opts is not None and not isinstance(opts, Renderer):
      hint = f"{type(opts).__name__}.renderer" if isinstance(getattr(opts, "renderer", None), Renderer) else \
        f"get_renderer({opts!r})" if isinstance(opts, str) else "Device[name].renderer or get_renderer(name)"
      raise UnsupportedError(f"Kernel opts must be a Renderer (e.g. {hint}), got {type(opts).__name__}")
    super().__init__(root, opts if opts is not None else default_renderer())
    self._opt_ast: Optional[tuple[tuple, LazyOp]] = None

  def explain(self) -> Explanation:
    """The decisions that chose applied_opts, in order: each heuristic step's rule, the values that decided it and
    its Opt or why none; an Opt applied directly (apply_opt, a search) appears as rule "direct". Applying
    `explain().opts` in order to a fresh Kernel of the same AST and renderer reproduces applied_opts."""
    out: list[Decision] = []
    done = 0
    def direct(upto: int) -> None:
      nonlocal done
      for o in self.applied_opts[done:upto]: out.append(Decision("direct", {}, o, "applied by the caller"))
      done = max(done, upto)
    for n, d in self.trace:
      direct(n - 1 if d.opt is not None else n)
      out.append(d)
      if d.opt is not None: done += 1
    direct(len(self.applied_opts))
    return Explanation(tuple(out))

  def copy(self) -> Kernel:
    """A kernel with the same AST, dialect and optimization state; Opts applied to it leave self unchanged."""
    ret = type(self).__new__(type(self))
    ret.__dict__.update({k: v for k, v in self.__dict__.items() if k not in ("uops", "global_size", "local_size")})
    return ret

  def __repr__(self) -> str: return f"<Kernel {ansistrip(self.name)} opts={list(self.applied_opts)}>"

  # ***** Opts *****

  def apply_opt(self, opt: Opt, append_opt: bool = True) -> Kernel:
    """Apply opt in place and return self. All or nothing: a refused Opt raises KernelOptError and leaves the
    kernel exactly as it was."""
    if not isinstance(opt, Opt) or not isinstance(opt.op, OptOps):
      raise KernelOptError(f"not an Opt of an OptOps: {opt!r}")
    if opt.op is OptOps.TC: tensor_core_fit.apply_tc(self, opt, getconfig().USE_TC)
    else: shape_opts.apply(self, opt)
    if append_opt: self.applied_opts += (opt,)
    return self

  # ***** tensor cores *****

  def apply_tensor_cores(self, use_tensor_cores: Optional[int] = None, extra_opts: Optional[list[Opt]] = None,
                         axis: int = 0, tc_opt: Optional[int] = None) -> bool:
    """Try to make the reduce a tensor-core matmul: True if it applied (with extra_opts, or the hand-coded upcasts
    and locals after it), False with the kernel unchanged otherwise (but for the decisions added to its trace).
    use_tensor_cores (default: USE_TC knob): 0 never; 1 tensor cores; 2 their shape Opts without the WMMA op.
    tc_opt (default: TC_OPT knob): 0 one reduce axis and direct loads into a MUL; 1 also several reduce axes and
    casts of loads; 2 also N, M, K that are not multiples of the tensor core's dims (padded)."""
    cfg = getconfig()
    use_tc = cfg.USE_TC if use_tensor_cores is None else use_tensor_cores
    level = cfg.TC_OPT if tc_opt is None else tc_opt
    shape, knobs = self.full_shape, {"USE_TC": use_tc, "TC_OPT": level}
    def note(rule: str, why: str, opt: Optional[Opt] = None, **facts: Any) -> None:
      self.record(Decision(rule, {"full_shape": shape, **knobs, **facts}, opt, why))
    if not self.opts.caps.tensor_cores and use_tc != 2:
      note("tc.off", f"{self.opts.caps.device} has no tensor cores and USE_TC != 2")
      return False
    snap = self.snapshot()
    tried: list[tuple[str, str]] = []
    try:
      tc_op = Opt(OptOps.TC, axis, level)
      tc = tensor_core_fit.apply_tc(self, tc_op, use_tc, tried)
      for name, why in tried: note("tc.no_match", why, tensor_core=name)
      tco = self.tensor_core_opts
      assert tco is not None, "a tensor core applied without its options"
      self.applied_opts += (tc_op,)
      note("tc.apply", f"{tc} matches" + (" (its shape Opts only: USE_TC=2)" if use_tc == 2 else ""), tc_op,
           tensor_core=str(tc), axes=tco.axes, pads=tco.axis_pads)
      if extra_opts is not None:
        for o in extra_opts: self.apply_opt(o)
        return True
      for d in (1, 0):  # upcast M, then N, by their largest small divisor
        tco = self.tensor_core_opts
        if tco is not None and tco.axes_exist[d]:
          div = next(u for u in (5, 4, 3, 2, 1) if divides(self.full_shape[tco.axes[d]], u))
          ax, dim = tco.axes[d], "NM"[d]
          if div != 1: decisions.apply(self, "tc.upcast", Opt(OptOps.UPCAST, ax, div), f"{dim} by its largest "
                                       "divisor of at most 5", axis=ax, size=self.full_shape[ax])
          else: decisions.decide(self, "tc.upcast", f"no divisor of at most 5 divides {dim}", axis=ax,
                                 size=self.full_shape[ax])
      tco = self.tensor_core_opts
      if self.tensor_core and tco is not None and tco.axes_exist[0]:
        ax = tco.axes[0]
        if (upc := next((u for u in (4, 2) if divides(self.full_shape[ax], u)), None)) is not None:
          decisions.apply(self, "tc.local", Opt(OptOps.LOCAL, ax, upc), "N by 4 or 2", axis=ax,
                          size=self.full_shape[ax])
        else: decisions.decide(self, "tc.local", "neither 4 nor 2 divides N", axis=ax, size=self.full_shape[ax])
      return True
    except KernelOptError as e:
      self.restore(snap)
      for name, why in tried: note("tc.no_match", why, tensor_core=name)
      note("tc.refused", str(e))
      return False

  # ***** heuristics *****

  def required_optimizations(self) -> Kernel:
    """The Opts a kernel can't run without: an image output is written as float4 texels along a unit-stride axis."""
    if isinstance(self.bufs[0].dtype, ImageDType):
      st = self.sts[0]
      axes = [i for i in st.unit_stride_axes(ignore_valid=True) if divides(st.shape[i], 4)]
      if not axes: raise UnsupportedError(f"image output {self.bufs[0].dtype} needs a unit-stride axis divisible by 4, "
                                          f"shape {st.shape}")
      if all(x < self.shape_len - self.upcasted for x in axes) and axes[0] not in self.upcast_in_mid_reduce_axes:
        decisions.apply(self, "required.image_output", Opt(OptOps.UPCAST, axes[0], 4), "the image output is "
                        "written as float4 texels", axis=axes[0], size=self.full_shape[axes[0]])
    return self

  def hand_coded_optimizations(self) -> Kernel:
    """The heuristics profile the renderer's `caps.heuristics` names (kernopt/heuristics_registry.py), falling back
    to the spec's rules (kernopt/heuristics.py) when it chooses nothing. Never applies tensor cores. All or nothing:
    where a rule's Opt is refused (the spec's rules on a kernel optimized already), the KernelOptError leaves the
    kernel exactly as it was."""
    profile = heuristics_registry.heuristics_profile(self.opts.caps.heuristics)
    snap = self.snapshot()
    try:
      self.required_optimizations()
      if any(s == 0 for s in self.full_shape):  # an empty output or reduce: nothing worth optimizing
        decisions.decide(self, "kernel.empty", "an axis has size 0")
        return self
      if not profile(self): heuristics_registry.heuristics_profile("spec")(self)
    except KernelOptError:
      self.restore(snap)
      raise
    return self

  # ***** the optimized AST *****

  def get_optimized_ast(self) -> LazyOp:
    """The AST with each buffer viewed through its optimized tracker, reduce args set to the reduced axes, GROUP
    reduces split through a local buffer, tensor-core reduces replaced by WMMA, and KernelInfo on the KERNEL."""
    snap = self.snapshot()
    if self._opt_ast is not None and len(self._opt_ast[0]) == len(snap) and \
       all(a is b for a, b in zip(self._opt_ast[0], snap)): return self._opt_ast[1]
    ret = optimized_ast(self)
    self._opt_ast = (snap, ret)
    return ret

  # ***** lowering and rendering *****

  def linearize(self) -> Kernel:
    """Lower the optimized AST to an ordered UOp list (self.lowered_uops), run the passes the renderer's capabilities
    ask for on it (kernopt.passes.passes_for): their result, self.uops, is what to_program renders and what
    Program.uops holds. Finds the launch sizes; returns self."""
    import time
    from kernopt.lowerer import lower
    from kernopt.passes import passes_for, run_passes
    from kernopt.uopgraph import linearize as linearize_uops
    from kernopt.uops import UOps
    cfg = getconfig()
    st = time.perf_counter()
    modified = self.get_optimized_ast()
    if debug.on(3):
      debug.emit(f"{self.colored_shape()}  {self.display_name}  opts={list(self.applied_opts)}\n"
                 f"{ops.format_tree(modified)}")
      if (explain := getattr(self, "explain", None)) is not None: debug.emit(str(explain()))   # the heuristics' trace
    t_ast = time.perf_counter()
    sink = lower(modified, self.opts)
    t_lower = time.perf_counter()
    self.lowered_uops: list[Any] = linearize_uops(sink, self.opts)
    trace = None
    if debug.on(6):
      from kernopt.uopgraph import toposort
      debug.emit(debug.step_line("ast", len(modified.lazyops), t_ast - st))
      debug.emit(debug.step_line("lower", len(toposort(sink)), t_lower - t_ast))
      debug.emit(debug.step_line("linearize", len(self.lowered_uops), time.perf_counter() - t_lower))
      trace = lambda name, n, s: debug.emit(debug.step_line(name, n, s))  # noqa: E731
    self.uops: list[Any] = run_passes(self.lowered_uops, passes_for(self.opts), trace)
    count("lowerings")
    self.global_size: Optional[list[sint]] = None
    self.local_size: Optional[list[sint]] = None
    if self.opts.caps.has_local:
      self.global_size, self.local_size = [1, 1, 1], [1, 1, 1]
      for u in self.uops:
        if u.op is UOps.SPECIAL:
          dim, name, size = u.arg
          (self.local_size if name.startswith("l") else self.global_size)[dim] = size
    if debug.on(5): debug.emit("\n".join(f"{i:4d} {u}" for i, u in enumerate(self.uops)))
    if cfg.GRAPHUOPS: self._graph_uops()
    return self

  def _graph_uops(self) -> None:
    """GRAPHUOPS: the UOp graph as `uops_<name>.dot` in the private folder cache_dir/graphs (and an SVG beside it when
    graphviz's dot is installed); one warning, and no file, when that folder is not private or the file can't be
    written."""
    import hashlib, os, shutil, subprocess, warnings
    from kernopt.helpers import cache_subdir
    ids = {u: i for i, u in enumerate(self.uops)}
    lines = [f"digraph {to_function_name(self.name)} {{", "  node [shape=box];"]
    for u, i in ids.items():
      label = f"{i} {u.op.name} {u.dtype}" + (f"\\n{u.arg!r}".replace('"', "'") if u.arg is not None else "")
      lines.append(f'  n{i} [label="{label}"];')
      lines += [f"  n{ids[s]} -> n{i};" for s in u.src if s in ids]
    if (folder := cache_subdir("graphs")) is None: return
    stem = to_function_name(self.name)
    # a name past 100 characters (a long Variable name) is cut, with its digest: a file name has at most 255 bytes
    if len(stem) > 100: stem = f"{stem[:80]}_{hashlib.sha256(stem.encode()).hexdigest()[:16]}"
    path = os.path.join(folder, f"uops_{stem}.dot")
    try:
      with open(path, "w") as f: f.write("\n".join(lines + ["}"]) + "\n")
    except OSError as e:
      warnings.warn(f"GRAPHUOPS: cannot write {path}: {e.strerror or e}", RuntimeWarning, stacklevel=2)
      return
    shown = path
    if (dot := shutil.which("dot")) is not None:
      svg = path[:-4] + ".svg"
      try:
        subprocess.run([dot, "-Tsvg", path, "-o", svg], check=True, capture_output=True, timeout=60)
        shown = f"{path} and {svg}"
      except (OSError, subprocess.SubprocessError) as e: shown = f"{path} (dot failed: {type(e).__name__})"
    debug.log(1, f"GRAPHUOPS {self.name}: {shown}")

  def to_program(self) -> Program:
    """Linearize and render: a renderers.Program carrying the argument signature a runner checks."""
    import time
    from kernopt.uops import UOps, flops_mem
    st = time.perf_counter()
    self.linearize()
    display = self.display_name
    fname = to_function_name(display)   # to_function_name drops the colours: this is self.name's
    t_render = time.perf_counter()
    src = self.opts.render(fname, self.uops)
    count("renders")
    if debug.on(6): debug.emit(debug.step_line("render", len(self.uops), time.perf_counter() - t_render))
    if debug.on(4): debug.emit(src)
    # the work as the lowerer wrote it: the passes change how it runs (lanes, loop order, copies), not what it computes
    flops, mem = flops_mem(self.lowered_uops)
    stored = {x.arg.idx for x in self.ast.src if x.op is BufferOps.STORE}
    uses: dict[int, list[MemBuffer]] = {}
    for b in self.membufs:
      if b.idx >= 0: uses.setdefault(b.idx, []).append(b)
    # each buffer's address range [lo, hi), checked at every launch; min_size covers every value of the Variables
    bounds = {i: bounds_union([b.st.address_bounds() for b in bs]) for i, bs in uses.items()}
    def min_size(i: int) -> int:
      hi = bounds[i][1]
      return max([0, hi if isinstance(hi, int) else hi.max] + [b.st.real_size() for b in uses[i]])
    # the signature is what was rendered: a buffer whose loads all folded away is no parameter of the source
    rendered: set[int] = set()
    var_dts: dict[str, Any] = {}
    glob, var = UOps.DEFINE_GLOBAL, UOps.DEFINE_VAR   # (an Enum class attribute costs ~0.1 us on Python 3.11)
    for u in self.uops:
      if u.op is glob: rendered.add(u.arg[0])
      elif u.op is var: var_dts[u.arg.expr] = u.dtype
    args = tuple(BufferArg(i, uses[i][0].dtype, min_size(i) if i in rendered else 0, i in stored, i in rendered)
                 for i in sorted(uses))
    args = tuple(replace(a, lo=bounds[a.idx][0], hi=bounds[a.idx][1]) if a.idx in rendered else a for a in args)
    var_args = tuple(VarArg(v.expr, var_dts.get(v.expr, var_dtype(v))) for v in self.vars)
    gs = tuple(self.global_size) if self.global_size is not None else None
    ls = tuple(self.local_size) if self.local_size is not None else None
    opts = tuple(f"{o.op.name}({o.axis},{o.amt})" for o in self.applied_opts)
    prg = Program(fname, src, self.opts.caps.device, gs, ls, uops=tuple(self.uops), op_estimate=flops, mem_estimate=mem,
                  args=args, vars=tuple(self.vars), var_args=var_args,
                  extra={"display_name": display, "opts": opts, "codegen_s": time.perf_counter() - st})
    if getconfig().RUN_PROCESS_REPLAY:
      from kernopt import capture
      capture.record(self.ast, self.opts, [[o.op.name, o.axis, o.amt] for o in self.applied_opts], prg)
    return prg
