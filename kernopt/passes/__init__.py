"""The UOp passes between linearization and rendering, each a pure function of a linearized list (a new list out,
the input untouched) in a module of its own, and `passes_for`, the pipeline a renderer's capabilities record asks
for. `Kernel.linearize` runs it: what the last pass returns is `Program.uops`, the list the renderer spells. Imports
uops and passes."""
from __future__ import annotations
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence
from kernopt.passes.borders import borders
from kernopt.passes.deinterleave import deinterleave
from kernopt.passes.interchange import interchange
from kernopt.passes.panel_packing import panel_packing
from kernopt.passes.parallel import parallel
from kernopt.passes.reduce_blocking import reduce_blocking
from kernopt.passes.sign_bit_negate import sign_bit_negate
from kernopt.passes.stream_stores import stream_grid_stores, stream_loop_stores
from kernopt.passes.vectorize import half_width, vectorize
from kernopt.uops import UOp

@dataclass(frozen=True)
class Pass:
  """One named step of a pipeline: fn(uops, **params) -> a new list."""
  name: str
  fn: Callable[..., list[UOp]]
  params: tuple[tuple[str, Any], ...] = ()

  def __call__(self, uops: Sequence[UOp]) -> list[UOp]: return self.fn(uops, **dict(self.params))
  def __repr__(self) -> str: return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.params)})"

def passes_for(renderer: Any) -> tuple[Pass, ...]:
  """The passes a renderer's capabilities ask for, in order: loop interchange; on a work-item grid the stream-store
  choice (it counts scalar stores); the interior copy of a padded window (after interchange, which then never scans
  the copy's loads); lane packing to vector_width; stride-2 gathers as shuffled vector loads; the parallel loop;
  reduce blocking and panel packing (of interchanged tiles only); on a loop kernel the stream-store choice last (it
  reads the final stores); and where the dialect's compiler folds negation into an FMA, the sign-bit NEG of a MULACC.
  The static C profile asks only for that one: its lists are otherwise rendered as the lowerer made them."""
  c = renderer.caps
  ret: list[Pass] = []
  if c.interchange: ret.append(Pass("interchange", interchange))
  if c.stream_stores and c.has_local:
    ret.append(Pass("stream_stores", stream_grid_stores, (("min_elements", c.stream_min),)))
  if c.split_borders: ret.append(Pass("borders", borders))
  if c.vector_width > 1:
    ret.append(Pass("vectorize", vectorize, (("width", c.vector_width), ("masked", c.masked_loads),
                                             ("fallback", half_width(c.vector_width)))))
  if c.deinterleave and c.vector_width > 1:
    ret.append(Pass("deinterleave", deinterleave, (("masked", c.masked_loads),)))
  if c.parallel != "none": ret.append(Pass("parallel", parallel, (("min_work", c.min_parallel_work),)))
  if c.reduce_block: ret.append(Pass("reduce_blocking", reduce_blocking, (("steps", c.reduce_block),)))
  if c.panel_elements: ret.append(Pass("panel_packing", panel_packing, (("max_elements", c.panel_elements),)))
  # OpenMP's workers would need a fence of their own after the loop: not streamed
  if c.stream_stores and not c.has_local and c.parallel != "openmp":
    ret.append(Pass("stream_stores", stream_loop_stores, (("width", c.vector_width), ("min_elements", c.stream_min))))
  if c.sign_bit_negate: ret.append(Pass("sign_bit_negate", sign_bit_negate))
  return tuple(ret)

def run_passes(uops: Sequence[UOp], passes: Sequence[Pass],
               trace: Optional[Callable[[str, int, float], None]] = None) -> list[UOp]:
  """uops through each pass in order; trace(name, UOps out, seconds) after each when given."""
  out = list(uops)
  for p in passes:
    st = time.perf_counter()
    out = p(out)
    if trace is not None: trace(p.name, len(out), time.perf_counter() - st)
  return out

__all__ = ["Pass", "passes_for", "run_passes", "borders", "deinterleave", "interchange", "vectorize", "parallel",
           "reduce_blocking",
           "panel_packing", "stream_grid_stores", "stream_loop_stores", "sign_bit_negate"]
