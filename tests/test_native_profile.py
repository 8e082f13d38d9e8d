"""The native CPU profile: host capabilities, the CPU heuristics (register tiles), the lane packer (vector ops of
GCC's vector extensions) and the whole small catalogue on the multi-core CPU device, compared with numpy; the static C
profile keeps the spec's choices."""
import os
import platform
import re
from dataclasses import replace
import numpy as np
import pytest
import catalogue
from catalogue import alu, buf, get, kernel, store
from kernopt.dtype import ImageDType, dtypes
from kernopt.ops import BinaryOps, ReduceOps, UnaryOps
from kernopt.errors import UnsupportedError
from kernopt.helpers import config_override
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.passes import interchange, reduce_blocking, vectorize
from kernopt.renderers import get_renderer
from kernopt.renderers.cstyle import CRenderer
from kernopt.renderers.native import NativeCRenderer, blocking, host_l2_bytes, host_vector_width
from kernopt.runtime import Buffer, Device
from kernopt.runtime import cpu
from kernopt.uops import ReduceBlock, UOps, loop_mark

needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
R8 = NativeCRenderer(vector_width=8, threads=2)
# every width-dependent test pins its width: the host's own (4 with SSE or NEON, 8 with AVX2, 16 with AVX-512) must not
# decide what a test checks; a width wider than the host's registers still compiles and runs (split by the compiler)
WIDTHS = (4, 8, 16)

def lanes(axis: int, w: int) -> list:
  """Opts that upcast `axis` into w contiguous lanes, each at most 8 (the static profile's limit)."""
  return [Opt(OptOps.UPCAST, axis, min(w, 8))] + ([Opt(OptOps.UPCAST, axis, w // 8)] if w > 8 else [])

def protocol(ast, renderer) -> Kernel:
  k = Kernel(ast, opts=renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k

def opts_of(k: Kernel) -> list:
  return [(o.op.name, o.axis, o.amt) for o in k.applied_opts]

# ***** capabilities *****

@pytest.mark.parametrize("flags,width", [("fpu sse2 avx avx2 fma avx512f avx512bw", 16), ("sse2 avx avx2 fma", 8),
                                         ("sse2 sse4_2", 4)])
def test_vector_width_from_cpuinfo(tmp_path, flags, width):
  path = tmp_path / "cpuinfo"
  path.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n")
  assert host_vector_width(str(path)) == width

AVX512_HOST = "fpu sse2 sse4_2 popcnt avx avx2 fma bmi2 avx512f avx512bw avx512dq avx512vl"

@pytest.mark.parametrize("march,width,fma", [("x86-64-v2", 4, False), ("x86-64-v3", 8, True), ("x86-64-v4", 16, True),
                                             ("native", 16, True)])
def test_cpu_march_sets_the_isa_facts(tmp_path, march, width, fma):
  from kernopt.renderers.native import isa_facts
  path = tmp_path / "cpuinfo"
  path.write_text(f"processor\t: 0\nflags\t\t: {AVX512_HOST}\n")
  if platform.machine().lower() not in ("x86_64", "amd64") and march != "native": pytest.skip("x86-64 levels")
  facts = isa_facts(march, str(path))
  assert (facts.march, facts.vector_width, facts.fma) == (march, width, fma)

def test_cpu_march_refuses_what_the_host_cannot_run(tmp_path):
  from kernopt.renderers.native import isa_facts
  path = tmp_path / "cpuinfo"
  path.write_text("processor\t: 0\nflags\t\t: fpu sse2 sse4_2 popcnt avx avx2 fma bmi2\n")
  if platform.machine().lower() in ("x86_64", "amd64"):
    assert isa_facts("x86-64-v3", str(path)).vector_width == 8
    with pytest.raises(UnsupportedError, match="avx512f.*SIGILL"): isa_facts("x86-64-v4", str(path))
  with pytest.raises(UnsupportedError, match="not one of"): isa_facts("pentium4", str(path))
  with config_override(CPU_MARCH="bogus"), pytest.raises(UnsupportedError, match="bogus"): NativeCRenderer()

@needs_cc
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 levels")
def test_cpu_march_knob_reaches_compiler_and_renderer():
  """CPU_MARCH=x86-64-v2 makes the device an SSE4-only one: -march=x86-64-v2, 4 lanes, no fused accumulation; its
  kernels match numpy."""
  with config_override(CPU_MARCH="x86-64-v2"): dev = cpu.CPUDevice(threads=2, min_parallel_work=0)
  assert "-march=x86-64-v2" in dev.flags() and "-march=native" not in dev.flags()
  r = dev.renderer
  assert (r.caps.vector_width, r.caps.fused_accumulate, r.capabilities()["march"]) == (4, False, "x86-64-v2")
  case = get("matmul_64")
  prg = protocol(case.ast, r).to_program()
  assert "float4 " in prg.src
  for _, got, want in catalogue.run_program(dev, case, prg, seed=6):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)

def test_native_capabilities():
  r = NativeCRenderer(vector_width=16, threads=4)
  caps = r.capabilities()
  assert caps["vector_width"] == 16 and caps["threads"] == 4 and caps["max_upcast"] == 64   # a four-vector matmul tile
  assert R8.caps.max_upcast == 16 and R8.caps.heuristics == "cpu_native" and not R8.caps.has_local
  with pytest.raises(UnsupportedError): NativeCRenderer(vector_width=6)
  with pytest.raises(UnsupportedError): NativeCRenderer(parallel="mpi")

def test_static_profile_is_the_spec():
  r = get_renderer("CPU")
  assert type(r) is CRenderer and r.caps.max_upcast == 8 and r.caps.heuristics == "spec"
  assert opts_of(protocol(get("matmul_1024", "large").ast, r)) == [("UPCAST", 1, 4), ("UPCAST", 0, 4), ("UNROLL", 0, 4)]
  assert type(Device.open("CPU", profile="static").renderer) is CRenderer

# ***** heuristics *****

def test_matmul_register_tile():
  """4 rows x 2 vectors of accumulators (8 of AVX2's 16 registers; 6 rows where 6 divides them, cpu.six_rows); at
  width 16 (16 of AVX-512's 32) 4 rows x 4 vectors where 64 divides the columns, else 8 rows x 2: B's row streams
  contiguously, A's element is broadcast."""
  assert opts_of(protocol(get("matmul_1024", "large").ast, R8)) == [("UPCAST", 1, 16), ("UPCAST", 0, 4)]
  r16 = NativeCRenderer(vector_width=16, threads=2)
  assert opts_of(protocol(get("matmul_1024", "large").ast, r16)) == [("UPCAST", 1, 64), ("UPCAST", 0, 4)]
  from catalogue import _matmul_ast
  assert opts_of(protocol(_matmul_ast(256, 96, 64), r16)) == [("UPCAST", 1, 32), ("UPCAST", 0, 8)]

def test_elementwise_one_vector():
  assert opts_of(protocol(get("add").ast, R8)) == [("UPCAST", 0, 8)]

def test_contiguous_reduce_unrolled_into_vector_accumulators():
  assert opts_of(protocol(get("max_axis1").ast, R8)) == [("UNROLL", 0, 16)]

def test_reduce_over_rows_is_vectorized_along_the_output():
  k = protocol(get("sum_axis0").ast, R8)
  assert opts_of(k)[0][0] == "UPCAST" and opts_of(k)[0][2] == 8

def test_conv_tile_without_window_unroll():
  """The output's width axis is the vector axis, output channels (where the input is broadcast) the rows; the 3x3
  window stays a loop (unrolled it would make a 64-lane tile 576 lanes: 5x the codegen time, measured no faster)."""
  k = protocol(get("conv2d", "large").ast, R8)
  o = opts_of(k)
  assert o[0][0] == "UPCAST" and o[0][2] in (8, 16) and o[1][0] == "UPCAST" and len(o) == 2

def test_small_window_unrolled_within_lane_budget():
  """A 3-wide reduce is still unrolled when the tile stays within the lane budget."""
  from kernopt.heuristics_cpu import window_lanes
  k = protocol(get("conv2d", "large").ast, NativeCRenderer(vector_width=4, threads=1))
  o = opts_of(k)
  lanes = o[0][2] * o[1][2]
  assert ("UNROLL" in [x[0] for x in o]) == (lanes * 3 <= window_lanes(4))

def test_skinny_matmul_vectorizes_its_dot_products_along_the_reduce():
  """N = 10 (an MLP's last layer) is no multiple of the width, and A is unit-stride along K where B is strided: the
  reduce is unrolled by the width into vector accumulators (B's panel packed along K), then 2 columns x 2 rows (rule
  cpu.dot_lanes)."""
  k = protocol(get("matmul_skinny").ast, R8)
  assert opts_of(k) == [("UNROLL", 0, 8), ("UPCAST", 1, 2), ("UPCAST", 0, 2)]
  assert "cpu.dot_lanes" in [d.rule for d in k.explain()]

def test_skinny_matmul_whose_reduce_no_width_divides_tiles_its_narrow_columns_whole():
  """K = 44 takes no UNROLL by 8: all 10 columns make the tile, with the reduce unrolled by 4 for independent chains,
  not rows, whose lanes the packer would mix (rule cpu.narrow_columns)."""
  ast = catalogue._matmul_ast(16, 10, 44)
  assert opts_of(protocol(ast, R8)) == [("UPCAST", 1, 10), ("UNROLL", 0, 4)]

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_skinny_matmul_equals_numpy(w):
  case, r = get("matmul_skinny"), NativeCRenderer(vector_width=w, threads=1)
  k = protocol(case.ast, r)
  # at width 4 ten columns are over two vectors: neither skinny rule applies
  assert (("UNROLL", 0, w) in opts_of(k)) == (w >= 8)
  dev = Device.open("CPU", threads=1, vector_width=w)
  for _, outs, refs in catalogue.run_program(dev, case, k.to_program(), seed=w):
    np.testing.assert_allclose(outs[0], refs[0], rtol=1e-5, atol=1e-5)

def _reference_rows() -> dict:
  import sys
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "reference"))
  from translate import load_rows
  return load_rows()

CONV_TILES = [("conv_64x56", 4), ("conv_64x56", 8), ("conv_16x32_s1", 4), ("conv_16x32_s1", 8), ("conv_16x32_s1", 16),
              ("conv_16x32_s2", 4), ("conv_16x32_s2", 8), ("conv_16x32_s2", 16)]

@pytest.mark.parametrize("row,w", CONV_TILES)
def test_reference_convs_tile_8_rows_of_one_vector(row, w):
  """The reference's convolution ASTs (padded two-View inputs; at stride 2 the columns are gathered from the image)
  whose output width the vector width divides: 8 output channels upcast first, then one vector of columns (rule
  cpu.conv_tile)."""
  k = protocol(_reference_rows()[row].kernels[0].ast, NativeCRenderer(vector_width=w, threads=1))
  o = opts_of(k)
  assert [d.rule for d in k.explain() if d.rule.startswith("cpu.")][0] == "cpu.conv_tile"
  assert o[0][0] == "UPCAST" and o[0][2] == 8 and o[1][0] == "UPCAST" and o[1][2] == w, o

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
@pytest.mark.parametrize("row", ("conv_small", "conv_small_s1", "conv_small_s2", "dwconv_small"))
def test_reference_convs_run_right_at_every_width(row, w):
  """The small reference convs under the standard protocol at each pinned width compute what the reference did."""
  sys_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "reference")
  import sys
  sys.path.insert(0, sys_path)
  from kernopt_rows import RowProgram, check_reference
  ref = _reference_rows()[row]
  prog = RowProgram(Device.open("CPU", threads=1, vector_width=w), ref, True)
  prog.run()
  check_reference(ref, prog.output())

@needs_cc
@pytest.mark.parametrize("depthwise", [False, True])
def test_a_conv_row_no_multiple_of_16_tiles_with_8_lane_vectors_at_width_16(depthwise):
  """Width 16, output rows of 24 columns (8 divides them, 16 does not; the reference's 56 alike): vectors of 8 columns
  (rule cpu.half_width), which the vectorize pass packs as its fallback width, not scalar lanes; a conv whose channels
  are upcast also takes two output rows along the window's slide, a depthwise conv four (rule cpu.window_rows). The
  numbers are numpy's."""
  N, C, H, W = 1, 8, 4, 24
  rng = np.random.default_rng(7)
  x = rng.standard_normal((N, C, H, W), dtype=np.float32)
  if depthwise:
    ast, wgt = catalogue.dwconv2d_ast(N, C, H, W), rng.standard_normal((C, 3, 3), dtype=np.float32)
    ref = catalogue.dwconv2d_numpy(x, wgt)
  else:
    ast, wgt = catalogue.conv2d_ast(N, C, H, W, 16), rng.standard_normal((16, C, 3, 3), dtype=np.float32)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(np.einsum("nchw,oc->nohw", xp[:, :, ky:ky + H, kx:kx + W], wgt[:, :, ky, kx]) for ky in range(3)
              for kx in range(3))
  dev = Device.open("CPU", threads=1, vector_width=16)
  k = protocol(ast, dev.renderer)
  upcasts = [amt for op, _, amt in opts_of(k) if op == "UPCAST"]
  assert "cpu.half_width" in {d.rule for d in k.explain()}
  assert upcasts == ([8, 4] if depthwise else [8, 8, 2]), opts_of(k)
  prg = k.to_program()
  widths = {u.dtype.count for u in prg.uops if u.dtype is not None and u.dtype.scalar() == dtypes.float}
  assert 8 in widths and 16 not in widths, widths
  out = Buffer(dev, ref.size, dtypes.float)
  dev.compile(prg)(out, Buffer(dev, x.size, dtypes.float).copyin(x.ravel()),
                   Buffer(dev, wgt.size, dtypes.float).copyin(wgt.ravel()), wait=True)
  np.testing.assert_allclose(out.numpy().reshape(ref.shape), ref, rtol=1e-4, atol=1e-4)

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_a_depthwise_conv_takes_4_rows_along_the_window_and_unrolls_it(w):
  """No output axis broadcasts the image (each channel reads its own): one vector of columns (8 lanes at width 16,
  rule cpu.half_width, for 24 columns), 4 output rows along the window's slide (rule cpu.window_rows), the whole 3x3
  window unrolled, so the rows share their image rows' loads; the numbers are numpy's."""
  N, C, H, W = 1, 4, 8, 24
  ast = catalogue.dwconv2d_ast(N, C, H, W)
  dev = Device.open("CPU", threads=1, vector_width=w)
  k = protocol(ast, dev.renderer)
  lanes = 8 if w == 16 else w
  assert opts_of(k) == [("UPCAST", 2, lanes), ("UPCAST", 1, 4), ("UNROLL", 1, 0), ("UNROLL", 0, 0)], opts_of(k)
  rng = np.random.default_rng(w)
  x, wgt = rng.standard_normal((N, C, H, W), dtype=np.float32), rng.standard_normal((C, 3, 3), dtype=np.float32)
  out = Buffer(dev, x.size, dtypes.float)
  dev.compile(k.to_program())(out, Buffer(dev, x.size, dtypes.float).copyin(x.ravel()),
                              Buffer(dev, wgt.size, dtypes.float).copyin(wgt.ravel()), wait=True)
  np.testing.assert_allclose(out.numpy().reshape(x.shape), catalogue.dwconv2d_numpy(x, wgt), rtol=1e-5, atol=1e-5)

def test_falls_back_to_spec_when_nothing_fits():
  """matmul_odd has no axis divisible by the vector width: the spec's heuristics run."""
  static = protocol(get("matmul_odd").ast, get_renderer("CPU"))
  assert opts_of(protocol(get("matmul_odd").ast, R8)) == opts_of(static)

# ***** lane packing *****

def lin(name: str, renderer=R8, scale: str = "small", opts=None) -> list:
  """The kernel's lowered uops, before the passes (which the tests here apply themselves)."""
  k = Kernel(get(name, scale).ast, opts=renderer)
  if opts is None: k = protocol(get(name, scale).ast, renderer)
  else:
    for o in opts: k.apply_opt(o)
  return k.linearize().lowered_uops

# the 4 rows x 2 vectors register tile at width 8 (the hand-coded one where cpu.six_rows does not apply), pinned: the
# tests of the passes below read its structure
TILE_4X2 = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 4)]

def vector_ops(uops: list) -> dict:
  ret: dict = {}
  for u in uops:
    if u.dtype is not None and u.dtype.count > 1 or (u.op is UOps.STORE and u.src[2].dtype.count > 1):
      ret[u.op] = ret.get(u.op, 0) + 1
  return ret

def test_matmul_packs_loads_alus_accumulators_and_stores():
  packed = vectorize(lin("matmul_64", opts=TILE_4X2), 8)
  v = vector_ops(packed)
  # 4 rows x 2 vectors: 8 accumulators, PHIs and stores; B's two vector loads
  assert v[UOps.DEFINE_ACC] == 8 and v[UOps.PHI] == 8 and v[UOps.STORE] == 8 and v[UOps.LOAD] == 2
  assert not any(u.op is UOps.DEFINE_ACC and u.dtype.count == 1 for u in packed)

@needs_cc
@pytest.mark.parametrize("padded", [False, True])
def test_overlapping_window_taps_are_unaligned_vector_loads(padded):
  """out[x] = sum_k in[x + k] * w[k], 8 outputs a vector, the 3 taps unrolled: the taps' lanes overlap (offsets 0..9),
  so the packer's load groups hold only some of them; each tap's vector is one load at its own offset (a masked one
  where the window reads padding), never a gather of scalar loads. The numbers are numpy's."""
  from kernopt.shape.view import View
  from kernopt.shape.shapetracker import ShapeTracker
  n, window = 16, View.create((16, 3), (1, 1))
  st = ShapeTracker((ShapeTracker.from_shape((n,)).pad(((1, 1),)).views if padded else ()) + (window,))
  taps = alu(BinaryOps.MUL, buf(1, (n, 3), st=st), buf(2, (n, 3), st=catalogue.view((n, 3), (0, 1))))
  ast = kernel(store(catalogue.reduce(ReduceOps.SUM, taps, (1,))))
  r = NativeCRenderer(vector_width=8, threads=1)
  k = Kernel(ast, opts=r)
  for o in (Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 3)): k.apply_opt(o)
  prg = k.to_program()
  gathers = re.findall(r"\(float8\)\{(val\d+), (?!\1\b)", prg.src)   # lanes of different values (not a broadcast)
  assert not gathers and len(re.findall(r"float8 val\d+ = ko_(?:vload|mload)", prg.src)) >= 3, prg.src
  x = np.random.default_rng(3).standard_normal(n if padded else n + 2, dtype=np.float32)
  w = np.array([0.5, -1.25, 2.0], np.float32)
  xp = np.pad(x, 1) if padded else x
  ref = sum(xp[i:i + n].astype(np.float64) * w[i] for i in range(3))
  dev = Device.open("CPU", threads=1, vector_width=8)
  out = Buffer(dev, n, dtypes.float)
  dev.compile(prg)(out, Buffer(dev, x.size, dtypes.float).copyin(x), Buffer(dev, 3, dtypes.float).copyin(w), wait=True)
  np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)

def test_no_packing_at_width_one_or_without_contiguous_lanes():
  uops = lin("matmul_64")
  assert vectorize(uops, 1) == uops
  ints = lin("int_ops")
  assert vectorize(ints, 8) == ints

def test_lanes_read_back_with_gep():
  """A contiguous unrolled sum: 16 accumulators packed into 2 vectors, combined lane by lane after the loop."""
  packed = vectorize(lin("max_axis1"), 8)
  assert vector_ops(packed)[UOps.DEFINE_ACC] == 2 and sum(u.op is UOps.GEP for u in packed) == 16

def test_dead_scalar_lanes_dropped():
  """The scalar loads and index math that vector loads replaced are gone; each broadcast is emitted once per scope."""
  packed = vectorize(lin("add", scale="large"), 8)
  assert [u.dtype.count for u in packed if u.op is UOps.LOAD] == [8, 8]
  mm = vectorize(lin("matmul_1024", scale="large", opts=TILE_4X2), 8)
  loads = [u for u in mm if u.op is UOps.LOAD]
  # B: 2 vector loads; A: one scalar per row, broadcast once and read by both vectors of the row
  assert sorted(u.dtype.count for u in loads) == [1, 1, 1, 1, 8, 8]
  assert sum(u.op is UOps.VECTORIZE for u in mm) == 4
  # every kept pure value has a reader
  read = {s for u in mm for s in u.src}
  assert all(u in read for u in mm if u.op in (UOps.LOAD, UOps.ALU, UOps.GEP, UOps.VECTORIZE, UOps.CONST))

def test_drop_dead_keeps_effects_and_order():
  from kernopt.passes.lists import drop_dead
  uops = lin("matmul_64", opts=[])
  assert drop_dead(uops) == uops  # nothing dead in the scalar kernel

def test_conv_packs_from_the_stores_with_gathered_windows():
  """The conv window's loads overlap between taps, so packing starts from the contiguous output stores and gathers
  each tap's (padded) input lanes. (The heuristics no longer unroll this window; the opts do it here.)"""
  opts = [Opt(OptOps.UPCAST, 3, 16), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 2, 0), Opt(OptOps.UNROLL, 1, 0)]
  packed = vectorize(lin("conv2d", scale="large", opts=opts), 8)
  v = vector_ops(packed)
  assert v[UOps.DEFINE_ACC] == 8 and v[UOps.STORE] == 8 and v[UOps.VECTORIZE] >= 9

def test_matmul_loops_interchanged():
  """B (strided along the reduce) depends on the N tiles only: its loop goes outside, so each B panel is reused by
  every M tile. Elementwise kernels keep their order."""
  uops = lin("matmul_1024", scale="large")
  ranges = [u for u in uops if u.op is UOps.RANGE]
  new = interchange(uops)
  assert [u for u in new if u.op is UOps.RANGE][:2] == ranges[:2][::-1] and len(new) == len(uops)
  assert [u for u in new if u.op is UOps.ENDRANGE][-2:] == [u for u in uops if u.op is UOps.ENDRANGE][-2:][::-1]
  ew = lin("add", scale="large")
  assert interchange(ew) == ew

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_vector_max_keeps_nan_semantics(w):
  """MAX(a, b) is a > b ? a : b lane by lane, also where a lane is NaN."""
  case, dev = get("max_axis1"), Device.open("CPU", threads=2, vector_width=w)
  ins = case.inputs(np.random.default_rng(1))
  x = ins[1].copy()
  x[3, 5], x[4, 0] = np.nan, np.inf
  prg = protocol(case.ast, dev.renderer).to_program()
  assert f"ko_max_float{w}(" in prg.src
  out = Buffer("CPU", case.buffers[0].numel, dtypes.float)
  dev.compile(prg)(out, Buffer("CPU", x.size, dtypes.float).copyin(x))
  static = Device.open("CPU", profile="static")
  out2 = Buffer("CPU", case.buffers[0].numel, dtypes.float)
  static.compile(protocol(case.ast, static.renderer).to_program())(out2, Buffer("CPU", x.size, dtypes.float).copyin(x))
  assert out.numpy().tobytes() == out2.numpy().tobytes()

def div_neg_ast(rows: int, cols: int):
  """y = -(x / d) + x / z: d one value per row (a scalar shared by a row's lanes), x and z elementwise."""
  from catalogue import view
  x, z = buf(1, (rows, cols)), buf(3, (rows, cols))
  d = buf(2, (rows, cols), st=view((rows, cols), (1, 0)))
  return kernel(store(alu(BinaryOps.ADD, alu(UnaryOps.NEG, alu(BinaryOps.IDIV, x, d)), alu(BinaryOps.IDIV, x, z))))

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_float_division_and_negation_are_vector_ops_bit_identical_to_scalar_c(w):
  """IDIV (IEEE division on floats) and NEG pack into vector ops, a uniform divisor broadcast (softmax's output loop:
  exp(x - max) / sum); each lane computes what the spec's scalar C does, bit for bit, at 0, -0, inf, NaN and
  subnormals."""
  rows, cols = 4, 64
  ast, dev = div_neg_ast(rows, cols), Device.open("CPU", threads=2, vector_width=w)
  k = Kernel(ast, opts=dev.renderer)
  for o in lanes(1, w): k.apply_opt(o)
  prg = k.to_program()
  v = {u.arg for u in prg.uops if u.op is UOps.ALU and u.dtype.count == w}
  assert {BinaryOps.IDIV, UnaryOps.NEG} <= v and not any(u.op is UOps.STORE and u.src[2].dtype.count == 1
                                                        for u in prg.uops)
  rng = np.random.default_rng(3)
  special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -3e-39, 3.4e38], np.float32)
  x, z = (rng.choice(np.concatenate([special, rng.standard_normal(16).astype(np.float32)]), (rows, cols))
          .astype(np.float32) for _ in range(2))
  d = np.array([0.0, -0.0, 1e-40, 3.0], np.float32)
  static = Device.open("CPU", profile="static")
  outs = []
  for device, opts in ((dev, lanes(1, w)), (static, [])):
    kk = Kernel(ast, opts=device.renderer)
    for o in opts: kk.apply_opt(o)
    out = Buffer("CPU", rows * cols, dtypes.float)
    device.compile(kk.to_program())(out, *(Buffer("CPU", a.size, dtypes.float).copyin(a) for a in (x, d, z)), wait=True)
    outs.append(out.numpy())
  assert outs[0].tobytes() == outs[1].tobytes()
  with np.errstate(all="ignore"):
    np.testing.assert_array_equal(outs[1].reshape(rows, cols), -(x / d[:, None]) + x / z)

def test_vector_loads_pinned_to_registers():
  """On x86/ARM hosts a vector load goes through an empty asm, so GCC reads B once per step instead of folding the
  load into each of the tile's multiplies; `pin_loads=None` renders the plain memcpy load (static: no vectors). Width
  4 fits a register of every x86-64 level and of NEON."""
  r = NativeCRenderer(vector_width=4, threads=1)
  r.caps = replace(r.caps, pin_loads="x")
  k = protocol(get("matmul_1024", "large").ast, r)
  src = k.to_program().src
  assert '__asm__("" : "+x"(v))' in src and "ko_vload_reg_float4(data2+" in src
  assert r.capabilities()["pin_loads"] == "x"
  r.caps = replace(r.caps, pin_loads=None)
  src = Kernel(k.ast, opts=r).required_optimizations().hand_coded_optimizations().to_program().src
  assert "__asm__" not in src and "ko_vload_float4(data2+" in src

@needs_cc
def test_vectors_wider_than_the_isa_registers_are_not_pinned_and_run():
  """A pinned width of 16 on an SSE-only target (x86-64-v2: 4-lane registers) is split by the compiler; the pinning
  asm, whose constraint one register cannot meet, is left out, and the kernel compiles and matches numpy."""
  from kernopt.renderers.native import ISA_LEVELS
  dev = Device.open("CPU", threads=1, vector_width=16)
  r = NativeCRenderer(vector_width=16, threads=1)
  r.caps = replace(r.caps, pin_loads="x", isa_vector_width=ISA_LEVELS["x86-64-v2"].vector_width)
  case = get("matmul_64")
  k = Kernel(case.ast, opts=r)
  for o in lanes(1, 16) + [Opt(OptOps.UPCAST, 0, 4)]: k.apply_opt(o)
  prg = k.to_program()
  assert "float16 " in prg.src and "__asm__" not in prg.src
  for _, got, want in catalogue.run_program(dev, case, prg, seed=2):
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)

@needs_cc
def test_native_flags_unroll_static_keeps_spec_flags():
  assert "-funroll-loops" in Device.open("CPU", threads=2).flags()
  assert "-funroll-loops" not in Device.open("CPU", profile="static").flags()

@needs_cc
@pytest.mark.parametrize("scale,w", [("small", 8)] + [("large", w) for w in WIDTHS])
def test_padded_conv_masked_vector_loads_bit_identical(scale, w):
  """The padded input's contiguous gated lanes are one masked vector load (a plain vector load where every lane is
  inside); same opts on the static profile give the same bits (with the static profile's rounding: no fused
  accumulation). Small: the heuristics' own tile at width 8; large: w lanes along the image's row."""
  case = get("conv2d", scale)
  native = Device.open("CPU", threads=2, min_parallel_work=0, fused_accumulate=False, vector_width=w)
  static = Device.open("CPU", profile="static")
  opts = protocol(case.ast, native.renderer).applied_opts if scale == "small" else lanes(3, w) + \
    [Opt(OptOps.UPCAST, 1, 4)]
  ins = case.inputs(np.random.default_rng(11))
  res = []
  for dev in (native, static):
    k = Kernel(case.ast, opts=dev.renderer)
    for o in opts: k.apply_opt(o)
    prg = k.to_program()
    bufs = {b.idx: Buffer("CPU", b.numel, b.dtype) for b in case.buffers}
    for b in case.buffers:
      if not b.output: bufs[b.idx].copyin(ins[b.idx])
    dev.compile(prg)(*[bufs[i] for i in sorted(bufs)])
    res.append((prg.src, bufs[0].numpy()))
  assert f"ko_mload_float{w}(data1" in res[0][0] and "ko_mload" not in res[1][0]
  assert res[0][1].tobytes() == res[1][1].tobytes()
  want = case.reference(ins, {})[0].reshape(-1)
  np.testing.assert_allclose(res[0][1][:want.size], want, rtol=1e-3, atol=1e-3)

def test_masked_loads_off_gathers():
  r = NativeCRenderer(vector_width=8, threads=1)
  r.caps = replace(r.caps, masked_loads=False)
  src = protocol(get("conv2d", "large").ast, r).to_program().src
  assert "ko_mload" not in src and "float8 vec" in src

def _run_matmul(case, renderer, dev):
  k = protocol(case.ast, renderer)
  prg = k.to_program()
  ins = case.inputs(np.random.default_rng(13))
  bufs = {b.idx: Buffer("CPU", b.numel, b.dtype) for b in case.buffers}
  for b in case.buffers:
    if not b.output: bufs[b.idx].copyin(ins[b.idx])
  dev.compile(prg)(*[bufs[i] for i in sorted(bufs)])
  return prg.src, bufs[0].numpy(), case.reference(ins, {})[0].reshape(-1)

@needs_cc
@pytest.mark.parametrize("name,threads", [("matmul_64", 1), ("matmul_512", 2)])
def test_reduce_blocks_bit_identical(name, threads):
  """The interchanged matmul's reduce split into blocks, the accumulators carried through the output between blocks:
  the same additions in the same order, so the same bits as the unsplit kernel."""
  case, dev = get(name, "large" if name == "matmul_512" else "small"), Device.open("CPU", threads=threads,
                                                                                   min_parallel_work=0)
  k_len = case.buffers[1].numel // 64 if name == "matmul_64" else 512
  res = []
  for steps in (k_len // 4, 0):
    r = NativeCRenderer(vector_width=8, threads=threads, min_parallel_work=0)
    r.caps = replace(r.caps, reduce_block=steps)
    res.append(_run_matmul(case, r, dev))
  (blocked_src, blocked, want), (plain_src, plain, _) = res
  assert f"*{k_len // 4}; " in blocked_src
  assert re.search(r"\?ko_vload(_reg)?_float8\(data0\+", blocked_src.replace(" ", ""))
  assert "data0+" not in plain_src.split("for (int32_t ridx")[-1].split("memcpy(data0")[0]  # unsplit: no reload
  assert blocked.tobytes() == plain.tobytes()
  np.testing.assert_allclose(blocked[:want.size], want, rtol=1e-3, atol=1e-3)

def test_reduce_block_needs_four_blocks_and_the_interchange():
  plain = vectorize(lin("matmul_1024", scale="large", opts=TILE_4X2), 8)
  uops = interchange(plain)
  new = reduce_blocking(uops, 256)
  marks = [m for u in new if u.op is UOps.RANGE and isinstance(m := loop_mark(u), ReduceBlock)]
  reduce_loop = next(u for u in uops if u.op is UOps.RANGE and u.arg[1])
  assert [(m.of, m.steps) for m in marks] == [(reduce_loop, 256)]
  # + 2 consts and the block RANGE, its ENDRANGE, the "block > 0" gate, 8 reloads and their PHIs
  assert len(new) == len(uops) + 3 + 1 + 1 + 2 * 8
  assert reduce_blocking(uops, 512) == uops  # 2 blocks: not worth it
  assert reduce_blocking(plain, 256) == plain  # not interchanged
  ew = lin("add", scale="large")
  assert reduce_blocking(ew, 256) == ew

def _fake_sysfs(tmp_path, caches):
  for i, (level, kind, size) in enumerate(caches):
    d = tmp_path / f"index{i}"
    d.mkdir()
    (d / "level").write_text(f"{level}\n")
    (d / "type").write_text(f"{kind}\n")
    (d / "size").write_text(f"{size}\n")
  return str(tmp_path)

@pytest.mark.parametrize("caches,want", [
  ([(1, "Data", "32K"), (1, "Instruction", "32K"), (2, "Unified", "1024K"), (3, "Unified", "32768K")], 1 << 20),
  ([(2, "Unified", "2M")], 2 << 20),
  ([(1, "Data", "48K"), (2, "Unified", "1280K")], 1280 << 10),
  ([(2, "Unified", "64K")], 512 << 10),     # below L2_BOUNDS: a VM's made-up figure, the 512 KiB base instead
  ([(2, "Unified", "1G")], 512 << 10),
  ([(1, "Data", "32K")], 512 << 10),        # no L2
  ([(2, "Unified", "lots")], 512 << 10),
])
def test_host_l2_from_sysfs(tmp_path, caches, want):
  assert host_l2_bytes.__wrapped__(_fake_sysfs(tmp_path, caches)) == want
  assert host_l2_bytes.__wrapped__(str(tmp_path / "absent")) == 512 << 10

def test_blocking_scales_with_l2():
  """reduce_block and panel_elements were measured on 512 KiB; they scale in powers of two with the L2, rounded down."""
  assert blocking(512 << 10) == (256, 32768) and blocking(768 << 10) == (256, 32768)
  assert blocking(1 << 20) == (512, 65536) and blocking(1280 << 10) == (512, 65536)
  assert blocking(256 << 10) == (128, 16384) and blocking(4 << 20) == (2048, 262144)
  r = NativeCRenderer(vector_width=16, threads=1, l2_bytes=1 << 20)
  assert (r.caps.reduce_block, r.caps.panel_elements) == (512, 65536)
  for bad in (1000, 1 << 30, 2.0 ** 20, "1M", True):
    with pytest.raises(UnsupportedError, match="l2_bytes"): NativeCRenderer(threads=1, l2_bytes=bad)

@needs_cc
@pytest.mark.parametrize("width", WIDTHS)
def test_l2_sized_blocking_on_numbers(width):
  """matmul 512^3 blocked in 4 reduce blocks of 128 (a 256 KiB L2) and unblocked with its whole panel packed (1 MiB):
  both numpy's numbers, and the same bits (the same additions in the same order)."""
  case, dev = get("matmul_512", "large"), Device.open("CPU", threads=1)
  res = [_run_matmul(case, NativeCRenderer(vector_width=width, threads=1, l2_bytes=l2), dev)
         for l2 in (256 << 10, 1 << 20)]
  (small_src, small, want), (big_src, big, _) = res
  assert "*128; " in small_src and "*128; " not in big_src and "panel" in big_src
  assert small.tobytes() == big.tobytes()
  np.testing.assert_allclose(big[:want.size], want, rtol=1e-3, atol=1e-3)

# ***** the whole small catalogue on the native multi-core device *****

CASES = [c.name for c in catalogue.catalogue("small")]

@needs_cc
@pytest.mark.parametrize("name", CASES)
def test_catalogue_on_native_cpu(name):
  case, dev = get(name), Device.open("CPU", threads=2, min_parallel_work=0)
  if any(isinstance(b.dtype, ImageDType) for b in case.buffers):  # the C dialect refuses images
    with pytest.raises(UnsupportedError): dev.compile(protocol(case.ast, dev.renderer).to_program())
    return
  for _, got, want in catalogue.run_program(dev, case, protocol(case.ast, dev.renderer).to_program(), seed=3):
    for b in case.outputs:
      if case.tol == 0: np.testing.assert_array_equal(got[b.idx], want[b.idx])
      else: np.testing.assert_allclose(got[b.idx].astype(np.float64), want[b.idx].astype(np.float64),
                                       rtol=case.tol * 10, atol=case.tol * 10)

@needs_cc
@pytest.mark.parametrize("w", WIDTHS)
def test_explicit_opts_pack_and_match_static(w):
  """A hand-picked tile renders vector code on the native profile and matches the static profile's result."""
  opts = lanes(1, w) + [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 4)]
  case = get("matmul_64")
  ins = case.inputs(np.random.default_rng(5))
  res = []
  for dev in (Device.open("CPU", threads=2, vector_width=w), Device.open("CPU", profile="static")):
    k = Kernel(case.ast, opts=dev.renderer)
    for o in opts: k.apply_opt(o)
    prg = k.to_program()
    out = Buffer("CPU", 64 * 64, dtypes.float)
    dev.compile(prg)(out, *(Buffer("CPU", 64 * 64, dtypes.float).copyin(ins[i]) for i in (1, 2)))
    res.append((prg.src, out.numpy()))
  assert f"float{w} " in res[0][0] and "float" not in res[1][0].replace("float*", "").replace("float ", "")
  np.testing.assert_allclose(res[0][1], res[1][1], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(res[0][1], case.reference(ins, {})[0].reshape(-1), rtol=1e-4, atol=1e-4)

# ***** fuzz *****

@needs_cc
def test_fuzz_native_multicore():
  """Random legal Opt sequences on every catalogue AST, run on the 2-thread native device against the unoptimized
  kernel (FUZZ_N sequences each, default 1)."""
  import fuzz
  from kernopt.helpers import getconfig
  n = getconfig().FUZZ_N or 1
  report = fuzz.run_fuzz("CPU", catalogue.catalogue("small"), n_per_ast=n, seed=0,
                         device_options={"threads": 2, "min_parallel_work": 0})
  assert not report.failures, report.summary()
  assert report.executed >= len(report.cases) // 2

# ***** exp2: kernopt's own, scalar and vector alike *****

def _exp2_inputs() -> np.ndarray:
  """Float32 bit patterns over [-160, 140] at a stride of 4099 (both signs), and the special values."""
  pos = np.arange(0, np.float32(140).view(np.uint32), 4099, dtype=np.uint32).view(np.float32)
  neg = np.arange(0x80000000, np.float32(-160).view(np.uint32), 4099, dtype=np.uint32).view(np.float32)
  spec = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 127.99999, 128.0, 128.5, -126.0, -149.0, -149.5, -150.0, -151.0,
                   -1e4, 1e30, -1e30, 0.5, -0.5, 1.5, 2.5, 1e-30, -1e-30,
                   # past the clamp, where the AVX512DQ path rounds x itself: just past, half-way, past 2^23
                   129.3, 129.5, 200.5, 8388609.0, 3e9, -151.3, -151.5, -152.5, -200.7, -8388609.0, -3e9], np.float32)
  x = np.concatenate([pos, neg, spec])
  return np.concatenate([x, np.zeros(-len(x) % 64, np.float32)])

@needs_cc
@pytest.mark.parametrize("fused,march", [(False, None), (True, None), (False, "x86-64-v2")])
@pytest.mark.parametrize("w", WIDTHS)
def test_exp2_within_one_ulp_and_the_same_in_every_lane_width(w, fused, march):
  """The native profile's float32 EXP2 (renderers/exp2_c.py), its polynomial by multiplies and adds or,
  where the profile fuses, by FMAs, its clamp by x86's min/max where the ISA has them for the width (an SSE-only
  build of 8 and 16 lanes takes the portable masks): within 1 ulp of the correctly rounded value (numpy's float64
  exp2, rounded) over a sweep of float32 values, NaN, infinities, overflow and underflow exact; the packed vector
  kernel gives the scalar kernel's bits."""
  if march is not None and platform.machine() not in ("x86_64", "AMD64"): pytest.skip("an x86-64 ISA level")
  x = _exp2_inputs()
  ast = kernel(store(alu(UnaryOps.EXP2, buf(1, (x.size,)))))
  dev = Device.open("CPU", threads=1, vector_width=w, fused_accumulate=fused, march=march)
  outs = []
  for opts in ([], [Opt(OptOps.UPCAST, 0, w)]):
    k = Kernel(ast, opts=dev.renderer)
    for o in opts: k.apply_opt(o)
    prg = k.to_program()
    assert (f"ko_exp2_float{w}(" if opts else "ko_exp2f(") in prg.src
    assert (("ko_fma_float" if opts else "fmaf(") in prg.src) == fused
    out, inp = Buffer(dev, x.size, dtypes.float), Buffer(dev, x.size, dtypes.float).copyin(x)
    dev.compile(prg)(out, inp, wait=True)
    outs.append(out.numpy())
  assert outs[0].tobytes() == outs[1].tobytes()
  got = outs[1]
  with np.errstate(over="ignore"): want = np.exp2(x.astype(np.float64)).astype(np.float32)
  assert np.array_equal(np.isnan(got), np.isnan(want))
  ok = ~np.isnan(want)
  special = ok & ((want == 0) | np.isinf(want))
  np.testing.assert_array_equal(got[special], want[special])
  fin = ok & ~special
  ulps = np.abs(got[fin].astype(np.float64) - want[fin]) / np.spacing(np.abs(want[fin])).astype(np.float64)
  assert ulps.max() <= 1.0, (ulps.max(), x[fin][np.argmax(ulps)])

def _c_compilers() -> list[str]:
  import shutil
  names = ["gcc", "clang"] + [f"clang-{v}" for v in range(14, 21)]
  return [p for p in dict.fromkeys(shutil.which(n) for n in names) if p is not None]

_EXP2_HARNESS = """#include <math.h>
#include <stdint.h>
typedef float float{w} __attribute__((aligned({a}), vector_size({a})));
typedef int32_t int32_t{w} __attribute__((aligned({a}), vector_size({a})));
{fma}
{scalar}
{vector}
void scalar(float* out, const float* in, int n) {{ for (int i = 0; i < n; i++) out[i] = ko_exp2f(in[i]); }}
void vector(float* out, const float* in, int n) {{
  for (int i = 0; i < n; i += {w}) {{
    float{w} x;
    __builtin_memcpy(&x, in + i, sizeof(x));
    x = ko_exp2_float{w}(x);
    __builtin_memcpy(out + i, &x, sizeof(x));
  }}
}}
"""

@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 builtins")
@pytest.mark.parametrize("w", WIDTHS)
@pytest.mark.parametrize("cc", _c_compilers())
def test_exp2_helper_builds_with_every_c_compiler_and_gives_the_scalar_bits(cc, w, tmp_path):
  """exp2_c's helpers spell some builtins per compiler (clang's 512-bit vreduceps takes a rounding argument, GCC's
  does not): built by each C compiler on the machine for the host's ISA (-march=native, so an AVX512DQ host runs
  the vrndscaleps/vreduceps path), the vector function gives the scalar function's bits on every input of
  _exp2_inputs, within 1 ulp of numpy's float64 exp2 rounded, with infinities and zeros exact."""
  import ctypes
  import subprocess
  from kernopt.renderers.exp2_c import exp2_helper
  from kernopt.renderers.x86_helpers import fma_helper
  src = _EXP2_HARNESS.format(w=w, a=4 * w, fma=fma_helper(f"ko_fma_float{w}", f"float{w}", w),
                             scalar=exp2_helper("ko_exp2f", "float", "int32_t", 1, "fmaf"),
                             vector=exp2_helper(f"ko_exp2_float{w}", f"float{w}", f"int32_t{w}", w, f"ko_fma_float{w}"))
  (tmp_path / "e.c").write_text(src)
  so = tmp_path / "e.so"
  out = subprocess.run([cc, "-O2", "-march=native", "-ffp-contract=off", "-shared", "-fPIC", str(tmp_path / "e.c"),
                        "-o", str(so), "-lm"], capture_output=True, text=True)
  assert out.returncode == 0, f"{cc} rejected the exp2 helper:\n{out.stderr[-2000:]}"
  lib = ctypes.CDLL(str(so))
  x = _exp2_inputs()
  got = {}
  for fn in ("scalar", "vector"):
    o = np.empty_like(x)
    getattr(lib, fn)(o.ctypes.data_as(ctypes.c_void_p), x.ctypes.data_as(ctypes.c_void_p), ctypes.c_int(x.size))
    got[fn] = o
  assert got["scalar"].tobytes() == got["vector"].tobytes()
  with np.errstate(over="ignore"): want = np.exp2(x.astype(np.float64)).astype(np.float32)
  assert np.array_equal(np.isnan(got["vector"]), np.isnan(want))
  ok = ~np.isnan(want)
  special = ok & ((want == 0) | np.isinf(want))
  np.testing.assert_array_equal(got["vector"][special], want[special])
  fin = ok & ~special
  ulps = np.abs(got["vector"][fin].astype(np.float64) - want[fin]) / np.spacing(np.abs(want[fin])).astype(np.float64)
  assert ulps.max() <= 1.0

@needs_cc
@pytest.mark.parametrize("k_len,steps", [(784, 196), (1000, 250), (999, None)])
def test_a_reduce_no_block_divides_takes_the_largest_divisor_in_half_to_one_block(k_len, steps):
  """K = 784 and 1000 are no multiples of the 256-step block: the reduce is split into blocks of the largest divisor
  of K in [128, 256] (196, 250), with the same bits as the unsplit kernel and numpy's numbers; K = 999 has none
  there (3^3 x 37) and stays unsplit. (256 steps: the blocking of a 512 KiB L2, pinned.)"""
  from catalogue import _matmul_ast
  ast, rng = _matmul_ast(32, 32, k_len), np.random.default_rng(k_len)
  a, b = rng.standard_normal((32, k_len)).astype(np.float32), rng.standard_normal((k_len, 32)).astype(np.float32)
  dev, outs = Device.open("CPU", threads=1), []
  for block in (256, 0):   # the profile as it is (panel packing too), then neither
    r = NativeCRenderer(vector_width=8, threads=1, l2_bytes=512 << 10)
    if not block: r.caps = replace(r.caps, reduce_block=0, panel_elements=0)
    prg = protocol(ast, r).to_program()
    marks = [m for u in prg.uops if u.op is UOps.RANGE and isinstance(m := loop_mark(u), ReduceBlock)]
    assert [m.steps for m in marks] == ([steps] if block and steps else [])
    bufs = [Buffer(dev, 32 * 32, dtypes.float32), Buffer(dev, a.size, dtypes.float32).copyin(a),
            Buffer(dev, b.size, dtypes.float32).copyin(b)]
    dev.compile(prg)(*bufs, wait=True)
    outs.append(bufs[0].numpy())
  assert outs[0].tobytes() == outs[1].tobytes()
  np.testing.assert_allclose(outs[0].reshape(32, 32), a @ b, rtol=1e-4, atol=1e-3)
