"""The search's action space without a device: the tensor-core level it tries is its own, passed explicitly (never
read from the TC_OPT knob at a distance), and the shared memory it limits a child by is the Kernel's own measure,
which equals the local buffer the optimized AST really declares."""
import dataclasses
import catalogue
import pytest
from kernopt import search_space as SS
from kernopt.dtype import dtypes
from kernopt.errors import KernelOptError
from kernopt.helpers import config_override, prod
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.ops import BufferOps, MemBuffer
from kernopt.renderers import get_renderer
from kernopt.renderers.opencl import OpenCLRenderer
from kernopt.search_config import SearchConfig, SearchStats
from kernopt.shape_opts import group_buffer_bytes

O = OptOps

def declared_local_bytes(k: Kernel) -> int:
  """Bytes of the workgroup-local buffers k's optimized AST declares (the oracle: what the lowerer allocates)."""
  ast = k.get_optimized_ast()
  local = {x.arg for x in ast.lazyops if x.op in BufferOps and isinstance(x.arg, MemBuffer) and x.arg.idx < 0}
  return sum(prod(b.st.shape) * b.dtype.itemsize for b in local)

@pytest.mark.parametrize("name, opts", [
  ("sum_axis1", [Opt(O.GROUPTOP, 0, 16)]),
  ("sum_axis1", [Opt(O.UPCAST, 0, 4), Opt(O.GROUPTOP, 0, 8)]),
  ("sum_axis1", [Opt(O.GROUP, 0, 4), Opt(O.UNROLL, 0, 2)]),   # unrolled lanes are not kept: 16 x 4 bytes / 8
  ("sum_axis1", [Opt(O.UPCAST, 1, 2), Opt(O.LOCAL, 0, 2), Opt(O.GROUPTOP, 0, 4), Opt(O.UNROLL, 0, 2)]),
  ("matmul_half", [Opt(O.UPCAST, 0, 4), Opt(O.LOCAL, 1, 4), Opt(O.GROUP, 0, 4)]),
  ("sum_axis0", [Opt(O.UPCAST, 0, 4), Opt(O.GROUP, 0, 2)]),
])
def test_the_shared_memory_measure_is_the_declared_local_buffer(name, opts):
  k = Kernel(catalogue.get(name).ast, opts=get_renderer("OPENCL"))
  for o in opts: k.apply_opt(o)
  assert k.group_for_reduces and group_buffer_bytes(k) == declared_local_bytes(k) > 0
  assert SS._shared_bytes(k) == group_buffer_bytes(k)
  assert SS._shared_bytes(Kernel(catalogue.get(name).ast, opts=get_renderer("OPENCL"))) == 0   # no GROUP, no buffer

def test_a_child_past_the_shared_memory_limit_is_pruned():
  r = OpenCLRenderer()
  k = Kernel(catalogue.get("sum_axis1").ast, opts=r).apply_opt(Opt(O.GROUPTOP, 0, 16))
  assert not SS._over_limits(k, SearchConfig())
  r.caps = dataclasses.replace(r.caps, shared_max=declared_local_bytes(k) - 1)
  assert SS._over_limits(k, SearchConfig())

def test_the_search_tries_tensor_cores_at_its_own_level_whatever_the_knob():
  """A 37x100x53 half matmul fits CUDA's tensor core only padded (TC_OPT 2). With the knob at 0, actions() at the
  knob's level offers TC level 0, which the Kernel refuses; expand() passes its own level (2) and gets the padded
  tensor core among the children."""
  ast = catalogue._matmul_ast(37, 100, 53, dtypes.half, dtypes.float)
  k = Kernel(ast, opts=get_renderer("CUDA"))
  with config_override(TC_OPT=0):
    assert {a.amt for a in SS.actions(k) if a.op is O.TC} == {0}
    assert {a.amt for a in SS.actions(k, SS.TC_OPT_LEVEL) if a.op is O.TC} == {2}
    with pytest.raises(KernelOptError, match="no tensor core matches"): k.copy().apply_opt(Opt(O.TC, 0, 0))
    assert k.copy().apply_opt(Opt(O.TC, 0, 2)).tensor_core is not None
    children = SS.expand(k, SearchConfig(), set(), SearchStats())
  tc = [c for _, c in children if c.applied_opts[0].op is O.TC]
  assert tc and all(c.applied_opts == (Opt(O.TC, c.applied_opts[0].axis, 2),) for c in tc)
  assert all(c.tensor_core is not None and c.tensor_core_opts.axis_pads for c in tc)
