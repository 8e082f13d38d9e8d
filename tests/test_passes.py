"""The UOp passes (kernopt/passes), one section each: on lists lowered from catalogue kernels at pinned native
profiles, each pass's structural contract, and the kernel its output renders to run on the CPU against numpy. Then the
pipeline: which passes a renderer's capabilities ask for, that each is pure, and that Program.uops is exactly the list
the renderer spells (the renderers optimize nothing)."""
import threading
from dataclasses import replace
import numpy as np
import pytest
from catalogue import alu, buf, get, kernel, run_program, store
from kernopt.dtype import dtypes
from kernopt.kernel import Kernel, Opt, OptOps
from kernopt.lowerer import lower
from kernopt.ops import BinaryOps, TernaryOps, UnaryOps
from kernopt.passes import (interchange, panel_packing, parallel, passes_for, reduce_blocking, sign_bit_negate,
                            stream_grid_stores, stream_loop_stores, vectorize)
from kernopt.passes.interchange import interchanged
from kernopt.renderers.cstyle import CRenderer
from kernopt.renderers.cuda import CUDARenderer
from kernopt.renderers.native import ISA_LEVELS, NativeCRenderer
from kernopt.renderers.opencl import OpenCLRenderer
from kernopt.runtime import Buffer, Device, cpu
from kernopt.uopgraph import linearize
from kernopt.uops import Mark, ReduceBlock, UOps, loop_mark

needs_cc = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
W = 8   # the lanes every test here packs to: the renderers are pinned to an AVX2 host, whatever this host is

def native(threads: int = 1, **caps) -> NativeCRenderer:
  r = NativeCRenderer(vector_width=W, threads=threads, min_parallel_work=0, fused_accumulate=False,
                      isa=ISA_LEVELS["x86-64-v3"])
  if caps: r.caps = replace(r.caps, **caps)
  return r

def kernel_of(name: str, renderer, opts=None) -> Kernel:
  k = Kernel(get(name).ast, opts=renderer)
  if opts is None: k.required_optimizations().hand_coded_optimizations()
  else:
    for o in opts: k.apply_opt(o)
  return k.linearize()

def scalar_lanes(k: Kernel) -> list:
  """k's list lowered with every upcast lane a scalar (the lowerer's vectors off): what the vectorize pass packs."""
  return linearize(lower(k.get_optimized_ast(), k.opts, vectors=False), k.opts)

def ranges(uops) -> list:
  return [u for u in uops if u.op is UOps.RANGE]

def run_uops(name: str, k: Kernel, uops, threads: int = 1) -> None:
  """k's Program with its source rendered from `uops` (k's renderer spells exactly them), run on the CPU: its
  outputs must match the case's numpy reference."""
  prg = k.to_program()
  prg = replace(prg, src=k.opts.render(prg.name, list(uops)), uops=tuple(uops))
  for _, outs, refs in run_program(Device.open("CPU", threads=threads, min_parallel_work=0), get(name), prg, seed=3):
    for i, out in outs.items(): np.testing.assert_allclose(out, refs[i], rtol=1e-4, atol=1e-4)

# a 4x16 register tile on matmul_64: the shape interchange, reduce blocking and panel packing are for
TILE = [Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.UPCAST, 0, 4)]

# ***** vectorize *****

def test_vectorize_packs_contiguous_lanes_into_one_vector_op():
  k = kernel_of("add", native(), [Opt(OptOps.UPCAST, 0, W)])
  lowered = scalar_lanes(k)
  assert sum(u.op is UOps.STORE for u in lowered) == W and all(u.src[2].dtype.count == 1 for u in lowered
                                                                   if u.op is UOps.STORE)
  out = vectorize(lowered, W)
  stores = [u for u in out if u.op is UOps.STORE]
  assert len(stores) == 1 and stores[0].src[2].dtype == dtypes.float32.vec(W)
  adds = [u for u in out if u.op is UOps.ALU and u.arg is BinaryOps.ADD and u.dtype.count == W]
  assert len(adds) == 1 and [s.op for s in adds[0].src] == [UOps.LOAD, UOps.LOAD]
  assert not any(u.op is UOps.ALU and u.dtype == dtypes.float32 for u in out)   # the scalar lanes are gone

def test_vectorize_keeps_the_lanes_of_other_dtypes_and_width_one():
  k = kernel_of("int_ops", native())
  assert vectorize(k.lowered_uops, W) == k.lowered_uops   # int32 lanes: no vector ALU for them
  assert vectorize(k.lowered_uops, 1) == k.lowered_uops

@needs_cc
def test_vectorized_add_equals_numpy():
  k = kernel_of("add", native(), [Opt(OptOps.UPCAST, 0, W)])
  run_uops("add", k, vectorize(scalar_lanes(k), W))

# ***** interchange *****

def test_interchange_swaps_the_two_outer_loops_of_a_tile():
  k = kernel_of("matmul_64", native(), TILE)
  lowered = k.lowered_uops
  out = interchange(lowered)
  assert ranges(out)[:2] == ranges(lowered)[:2][::-1] and sorted(map(id, out)) == sorted(map(id, lowered))
  assert interchanged(out) and not interchanged(lowered)
  ew = kernel_of("add", native()).lowered_uops
  assert interchange(ew) == ew   # no streamed operand: the order stays

@needs_cc
def test_interchanged_matmul_equals_numpy():
  k = kernel_of("matmul_64", native(), TILE)
  run_uops("matmul_64", k, interchange(k.lowered_uops))

# ***** parallel *****

def test_parallel_marks_the_outer_loop_when_the_work_pays():
  lowered = kernel_of("add", native()).lowered_uops
  out = parallel(lowered, min_work=0)
  assert [loop_mark(r) for r in ranges(out)][0] is Mark.PARALLEL and ranges(out)[0].arg[:2] == ranges(lowered)[0].arg
  assert len(out) == len(lowered) and sum(loop_mark(r) is Mark.PARALLEL for r in ranges(out)) == 1
  assert parallel(lowered, min_work=1 << 40) == lowered   # too little work for a second thread
  full = kernel_of("sum_all", native()).lowered_uops
  assert parallel(full, min_work=0) == full   # its only loop is the reduce: threads would reorder the sum

@needs_cc
def test_parallel_add_equals_numpy():
  k = kernel_of("add", native(threads=2))
  uops = parallel(k.lowered_uops, min_work=0)
  assert "ko_pool1_claim" in k.opts.render("k", uops)
  run_uops("add", k, uops, threads=2)

# ***** reduce blocking *****

def tile():
  """matmul_64's 4x16 tile kernel, interchanged and packed: what reduce blocking and panel packing get."""
  k = kernel_of("matmul_64", native(), TILE)
  return k, vectorize(interchange(k.lowered_uops), W)

def test_reduce_blocking_splits_the_reduce_of_an_interchanged_tile():
  _, uops = tile()
  outer, inner, red = ranges(uops)
  out = reduce_blocking(uops, 16)
  blk = next(r for r in ranges(out) if isinstance(loop_mark(r), ReduceBlock))
  assert loop_mark(blk) == ReduceBlock(red, 16) and blk.src[1].arg == 64 // 16
  assert ranges(out) == [outer, blk, inner, red]   # the block loop between the two outer loops
  assert reduce_blocking(uops, 32) == uops   # 2 blocks: not worth it
  plain = vectorize(kernel_of("matmul_64", native(), TILE).lowered_uops, W)
  assert reduce_blocking(plain, 16) == plain   # not interchanged

@needs_cc
def test_blocked_matmul_equals_numpy():
  k, uops = tile()
  src = k.opts.render("k", reduce_blocking(uops, 16))
  assert "*16; " in src and "*16 + 16; " in src   # the reduce runs from block*16
  run_uops("matmul_64", k, reduce_blocking(uops, 16))

# ***** panel packing *****

def test_panel_packing_copies_b_into_a_stack_panel():
  _, uops = tile()
  out = panel_packing(uops, 1 << 15)
  panels = [u for u in out if u.op is UOps.DEFINE_LOCAL]
  assert len(panels) == 1 and panels[0].arg[1] == 64 * 16   # K rows of the tile's 16 columns
  reads = [u for u in out if u.op is UOps.LOAD and u.src[0] is panels[0]]
  red = ranges(out)[-1]
  assert reads and all(red in u.src[1].parents or u.src[1] is red for u in reads)   # read inside the reduce
  assert panel_packing(uops, 64 * 16 - 1) == uops   # too big
  blocked = panel_packing(reduce_blocking(uops, 16), 1 << 15)
  assert [u.arg[1] for u in blocked if u.op is UOps.DEFINE_LOCAL] == [16 * 16]   # one block's rows

@needs_cc
def test_packed_panel_matmul_equals_numpy():
  k, uops = tile()
  run_uops("matmul_64", k, panel_packing(reduce_blocking(uops, 16), 1 << 15))

# ***** stream stores *****

def test_stream_loop_stores_marks_every_store_of_a_big_output():
  lowered = scalar_lanes(kernel_of("add", native(), [Opt(OptOps.UPCAST, 0, W)]))
  packed = vectorize(lowered, W)
  out = stream_loop_stores(packed, W, min_elements=1)
  assert [u.arg for u in out if u.op is UOps.STORE] == [Mark.NONTEMPORAL]
  assert stream_loop_stores(packed, W) == packed   # the catalogue's add fits the caches
  assert stream_loop_stores(lowered, W, min_elements=1) == lowered   # scalar stores: not streamed

def test_stream_grid_stores_marks_float_stores_of_a_loop_free_grid():
  r = OpenCLRenderer(vector_width=W, clang=True, stream_stores=True)
  big = kernel(store(alu(BinaryOps.ADD, buf(1, (1 << 16, 64)), buf(2, (1 << 16, 64)))))
  k = Kernel(big, opts=r).required_optimizations().hand_coded_optimizations().linearize()
  out = stream_grid_stores(k.lowered_uops)
  assert all(u.arg is Mark.NONTEMPORAL for u in out if u.op is UOps.STORE)
  assert "__builtin_nontemporal_store" in r.render("k", out) and "sfence" in r.render("k", out)
  assert stream_grid_stores(k.lowered_uops, min_elements=1 << 40) == k.lowered_uops

@needs_cc
def test_streamed_add_equals_numpy():
  k = kernel_of("add", native(), [Opt(OptOps.UPCAST, 0, W)])
  uops = stream_loop_stores(vectorize(k.lowered_uops, W), W, min_elements=1)
  assert "ko_stream_float8" in k.opts.render("k", uops) and "ko_stream_fence();" in k.opts.render("k", uops)
  run_uops("add", k, uops)

# ***** sign-bit NEG of a MULACC *****

NEG_FMA = kernel(store(alu(UnaryOps.NEG, alu(TernaryOps.MULACC, buf(1, (8,)), buf(2, (8,)), buf(3, (8,))))))

def test_sign_bit_negate_replaces_only_the_neg_of_a_mulacc():
  k = Kernel(NEG_FMA, opts=CRenderer()).linearize()
  out = sign_bit_negate(k.lowered_uops)
  alus = [u.arg for u in out if u.op is UOps.ALU]
  assert UnaryOps.NEG not in alus and BinaryOps.XOR in alus and TernaryOps.MULACC in alus
  assert [u.dtype for u in out if u.op is UOps.BITCAST] == [dtypes.int32, dtypes.float32]
  plain = Kernel(get("add").ast, opts=CRenderer()).linearize()
  assert sign_bit_negate(plain.lowered_uops) == plain.lowered_uops

@needs_cc
def test_sign_bit_negate_equals_numpy_on_specials():
  """Every special operand (signed zeros, infinities, NaN) through the rewritten kernel, against numpy bit for bit
  (NaN: any NaN)."""
  vals = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3.5], np.float32)
  a, b, c = (x.reshape(-1) for x in np.meshgrid(vals, vals, vals, indexing="ij"))
  ast = kernel(store(alu(UnaryOps.NEG, alu(TernaryOps.MULACC, buf(1, (512,)), buf(2, (512,)), buf(3, (512,))))))
  dev = Device["CPU"]
  k = Kernel(ast, opts=CRenderer())
  out = Buffer(dev, 512, dtypes.float)
  dev.compile(k.to_program())(out, *(Buffer(dev, 512, dtypes.float).copyin(x) for x in (a, b, c)), wait=True)
  with np.errstate(invalid="ignore"): want = (-(a.astype(np.float64) * b + c)).astype(np.float32)
  got = out.numpy()
  nan = np.isnan(want)
  assert (np.isnan(got) == nan).all()
  np.testing.assert_array_equal(got[~nan].view(np.int32), want[~nan].view(np.int32))

# ***** the pipeline *****

def test_passes_follow_the_capabilities():
  names = lambda r: [p.name for p in passes_for(r)]  # noqa: E731
  cpu_all = ["interchange", "borders", "vectorize", "deinterleave", "parallel", "reduce_blocking", "panel_packing",
             "stream_stores", "sign_bit_negate"]
  assert names(native(threads=2)) == cpu_all
  assert names(native(threads=1)) == [n for n in cpu_all if n != "parallel"]   # one thread: no parallel loop
  assert "stream_stores" not in names(native(threads=2, parallel="openmp"))   # OpenMP's workers aren't fenced
  assert names(native(threads=1, interchange=False, split_borders=False, deinterleave=False, reduce_block=0,
                      panel_elements=0)) == \
    ["vectorize", "stream_stores", "sign_bit_negate"]
  assert names(OpenCLRenderer(vector_width=W, clang=True, stream_stores=True)) == ["stream_stores", "vectorize"]
  assert names(CRenderer()) == ["sign_bit_negate"]   # the static C profile: gcc 12's fnmsub fold only
  assert names(OpenCLRenderer()) == names(CUDARenderer()) == []

@pytest.mark.parametrize("step", ["interchange", "borders", "vectorize", "deinterleave", "parallel", "reduce_blocking",
                                  "panel_packing", "stream_stores", "sign_bit_negate"])
def test_each_pass_is_pure(step):
  """A pass returns a new list and leaves its input as it was."""
  k = kernel_of("matmul_64", native(threads=2), TILE)
  ps = {p.name: p for p in passes_for(k.opts)}
  before = list(k.lowered_uops)
  arg = tuple(before)
  out = ps[step](arg)
  assert isinstance(out, list) and out is not before and list(arg) == before == k.lowered_uops

CASES = ["add", "matmul_64", "sum_axis1", "conv2d", "max_axis1"]
PROFILES = {"native": lambda: native(threads=2), "opencl_cpu": lambda: OpenCLRenderer(vector_width=W, clang=True),
            "c": CRenderer, "cuda": CUDARenderer}

@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("name", CASES)
def test_program_uops_are_what_was_rendered(profile, name):
  r = PROFILES[profile]()
  k = Kernel(get(name).ast, opts=r).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  prg = k.to_program()
  assert prg.uops == tuple(k.uops) and r.render(prg.name, list(prg.uops)) == prg.src
  if not passes_for(r): assert k.uops == k.lowered_uops

def test_the_renderer_optimizes_nothing():
  """A list of scalar lanes rendered as is stays scalar: packing is the lowerer's and the vectorize pass's, not the
  renderer's."""
  k = kernel_of("add", native(), [Opt(OptOps.UPCAST, 0, W)])
  assert "float8" not in k.opts.render("k", scalar_lanes(k)) and "float8" in k.opts.render("k", k.uops)

def test_renders_on_threads_do_not_share_state():
  """The render context is one per render() call: the same renderer spelling two kernels on two threads at once
  gives each the source it gives alone (the pool kernel's chunks, the blocked reduce and the helpers included)."""
  r = native(threads=2)
  lists = {name: kernel_of(name, r, TILE if name == "matmul_64" else None).uops for name in ("matmul_64", "add")}
  want = {name: r.render("k", uops) for name, uops in lists.items()}
  got: dict = {name: [] for name in lists}
  start = threading.Barrier(2)
  def work(name: str) -> None:
    start.wait()
    for _ in range(20): got[name].append(r.render("k", lists[name]))
  threads = [threading.Thread(target=work, args=(n,)) for n in lists]
  for t in threads: t.start()
  for t in threads: t.join()
  assert all(srcs == [want[name]] * 20 for name, srcs in got.items())

@pytest.mark.parametrize("name", ["matmul_64", "add", "conv2d"])
def test_marks_are_what_the_native_renderer_spells(name):
  """The spelling of a parallel loop, a blocked reduce and non-temporal stores appears exactly where a pass marked
  one: rendering the list without the marks gives none of them."""
  k = kernel_of(name, native(threads=2), TILE if name == "matmul_64" else None)
  src = k.opts.render("k", k.uops)
  marked = {loop_mark(u) for u in k.uops if u.op is UOps.RANGE} | {u.arg for u in k.uops if u.op is UOps.STORE}
  assert ("ko_pool1_claim" in src) is (Mark.PARALLEL in marked)
  assert ("ko_stream_" in src) is (Mark.NONTEMPORAL in marked)
  assert any(isinstance(m, ReduceBlock) for m in marked) is ("*16 + 16" in src or "*256 + 256" in src)
  assert "ko_pool1_claim" not in k.opts.render("k", k.lowered_uops)

def test_passes_import_no_renderer():
  """The passes read a renderer only through passes_for's `caps` record: they import nothing of kernopt.renderers."""
  import ast
  import pathlib
  import kernopt.passes
  for path in pathlib.Path(kernopt.passes.__file__).parent.glob("*.py"):
    tree = ast.parse(path.read_text())
    names = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + \
            [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in names if m.startswith("kernopt.renderers")], path.name

# ***** the masked vector load's lane mask *****

def _eval_int(u, env):
  """The value of an int/bool mask UOp tree at the leaf values `env` (an evaluator of the few ops a mask holds)."""
  if u in env: return env[u]
  if u.op is UOps.CONST: return int(u.arg)
  if u.op is UOps.CAST: return int(_eval_int(u.src[0], env))
  a = [_eval_int(s, env) for s in u.src]
  return {BinaryOps.AND: lambda: a[0] & a[1], BinaryOps.MUL: lambda: a[0] * a[1], BinaryOps.ADD: lambda: a[0] + a[1],
          TernaryOps.WHERE: lambda: a[1] if a[0] else a[2]}[u.arg]()

@pytest.mark.parametrize("shape", ["window_row", "no_shared_check", "ungated_lane", "nested_row_check"])
def test_masked_load_mask_sets_exactly_the_open_lanes_bits(shape):
  """masked_load_mask(lanes) has bit l set exactly where lane l's gate holds, for every value of the checks; gates
  that share a conjunct (a window row: the row check on every lane, column checks on the first and last) become
  WHERE(shared check, the bits of the rest, 0)."""
  from itertools import product
  from kernopt.passes.load_masks import masked_load_mask
  from kernopt.uops import UOp
  b, i32 = dtypes.bool, dtypes.int32
  leaves = [UOp(UOps.DEFINE_VAR, b, (), f"g{n}") for n in range(5)]
  r0, r1, c0, c7, x = leaves
  AND = lambda p, q: UOp(UOps.ALU, b, (p, q), BinaryOps.AND)  # noqa: E731
  row = AND(r0, r1)
  gates = {"window_row": [AND(row, c0)] + [row] * 6 + [AND(c7, row)],
           "no_shared_check": [c0, c7] * 4,
           "ungated_lane": [None] + [AND(row, c0)] * 7,
           "nested_row_check": [AND(AND(row, c0), x)] + [row] * 6 + [AND(row, c7)]}[shape]
  buf_u = UOp(UOps.DEFINE_GLOBAL, dtypes.float32, (), (1, "data1", False))
  zero, idx = UOp(UOps.CONST, dtypes.float32, (), 0.0), UOp(UOps.CONST, i32, (), 0)
  lanes = tuple(UOp(UOps.LOAD, dtypes.float32, (buf_u, idx)) if g is None else
                UOp(UOps.LOAD, dtypes.float32, (buf_u, UOp(UOps.ALU, i32, (g, idx, idx), TernaryOps.WHERE), g, zero))
                for g in gates)
  mask = masked_load_mask(lanes)
  assert (mask.op is UOps.ALU and mask.arg is TernaryOps.WHERE and mask.src[0] is row) == \
    (shape in ("window_row", "nested_row_check"))
  for vals in product((0, 1), repeat=len(leaves)):
    env = dict(zip(leaves, vals))
    want = sum(1 << lane for lane, g in enumerate(gates) if g is None or _eval_int(g, env))
    assert _eval_int(mask, env) == want, (shape, vals)

def test_define_before_use_moves_a_value_read_before_its_place():
  """A value read before its place (a lane mask a pass built from UOps the list holds further down) moves up to just
  before its first reader, sources first; the later place keeps no second copy where the moved one is visible, and
  keeps one inside a sibling block; a list with no such read comes back as it was."""
  from kernopt.passes.lists import define_before_use
  from kernopt.uops import UOp, UOps
  i32 = dtypes.int32
  g = UOp(UOps.DEFINE_GLOBAL, dtypes.float32, (), (0, "data0", True))
  r = UOp(UOps.RANGE, i32, (UOp.const(i32, 0), UOp.const(i32, 4)), (0, False))
  c = UOp(UOps.CAST, i32, (r,))
  m = UOp(UOps.ALU, i32, (c, UOp.const(i32, 3)), BinaryOps.MUL)
  ld = UOp(UOps.LOAD, dtypes.float32, (g, r, m))
  st = UOp(UOps.STORE, None, (g, r, ld, m))
  end = UOp(UOps.ENDRANGE, None, (r,))
  bad = [g, UOp.const(i32, 0), UOp.const(i32, 4), r, ld, UOp.const(i32, 3), c, m, st, end]
  out = define_before_use(bad)
  assert out.index(c) < out.index(m) < out.index(ld) < out.index(st) and out.count(m) == 1 and out.count(c) == 1
  assert define_before_use(out) == out
  # the first reader inside an IF, the old place after its ENDIF: the old place keeps its copy
  cond = UOp(UOps.IF, None, (UOp.const(dtypes.bool, True),))
  sib = [g, UOp.const(i32, 0), UOp.const(i32, 4), r, cond, ld, UOp(UOps.ENDIF, None, (cond,)), UOp.const(i32, 3), c, m,
         st, end]
  out = define_before_use(sib)
  assert out.count(m) == 2 and out.index(m) < out.index(ld) and out.index(c) < out.index(m)
