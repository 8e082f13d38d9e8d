"""ops.py: verify_lazyop, get_lazyop_info, print_tree, serialization and digest, the op-semantics table; and the
catalogue's numpy references checked against a small independent numpy evaluation of each AST."""
import io
import json
import math
import os
import subprocess
import sys
import numpy as np
import pytest
import catalogue as C
from catalogue import alu, buf, const, kernel, reduce, store, cast
from kernopt.dtype import dtypes
from kernopt.errors import VerifyError
from kernopt.ops import (BinaryOps, BufferOps, ConstBuffer, KernelInfo, LazyOp, MemBuffer, MetaOps, ReduceOps,
                         TernaryOps, UnaryOps, WMMAArg, ast_digest, ast_from_json, ast_to_json, exec_alu,
                         get_lazyop_info, print_tree,
                         verify_lazyop)
from kernopt.shape.shapetracker import ShapeTracker
from kernopt.shape.symbolic import Variable, sym_infer

ALL = [(s, c.name) for s in ("small", "large") for c in C.catalogue(s)]

# ***** verify_lazyop *****

@pytest.mark.parametrize("scale,name", ALL)
def test_verify_catalogue(scale, name):
  ast = C.get(name, scale).ast
  sts = verify_lazyop(ast)
  for out in ast.src: assert sts[out].shape == out.arg.st.shape
  for op in ast.lazyops:
    if op.op in ReduceOps: assert all(sts[op].shape[a] == 1 for a in op.arg)

def test_verify_reduce_shapes():
  x = buf(1, (4, 8, 16))
  r = reduce(ReduceOps.SUM, x, (1, 2))
  sts = verify_lazyop(kernel(store(r)))
  assert sts[x].shape == (4, 8, 16) and sts[r].shape == (4, 1, 1)

def _bad(ast, match):
  with pytest.raises(VerifyError, match=match): verify_lazyop(ast)

def test_verify_shape_mismatch():
  _bad(kernel(store(alu(BinaryOps.ADD, buf(1, (4, 8)), buf(2, (4, 9))))),
       r"ADD sources disagree in shape: .*\(4, 8\) != .*\(4, 9\)")

def test_verify_store_shape_mismatch():
  x = buf(1, (4, 8))
  _bad(kernel(store(x, st=ShapeTracker.from_shape((8, 4)))),
       r"STORE to buffer 0 of shape \(8, 4\) from .*LOAD of shape \(4, 8\)")

def test_verify_bad_reduce_axis():
  out = MemBuffer(0, dtypes.float, ShapeTracker.from_shape((4, 1)))
  _bad(kernel(LazyOp(BufferOps.STORE, (reduce(ReduceOps.SUM, buf(1, (4, 8)), (2,)),), out)),
       r"SUM axis 2 is out of range for shape \(4, 8\)")
  _bad(kernel(LazyOp(BufferOps.STORE, (LazyOp(ReduceOps.MAX, (buf(1, (4, 8)),), 1),), out)),
       "MAX needs a tuple of int axes")
  _bad(kernel(LazyOp(BufferOps.STORE, (reduce(ReduceOps.SUM, buf(1, (4, 8)), (1, 1)),), out)), "SUM repeats an axis")

def test_verify_wrong_arity():
  a = buf(1, (4,))
  _bad(kernel(store(LazyOp(BinaryOps.MUL, (a,)))), "MUL takes 2 sources, got 1")
  _bad(kernel(store(LazyOp(UnaryOps.EXP2, (a, a)))), "EXP2 takes 1 source, got 2")
  _bad(kernel(store(LazyOp(TernaryOps.WHERE, (a, a)))), "WHERE takes 3 sources, got 2")

def test_verify_kernel_structure():
  a = buf(1, (4,))
  _bad(LazyOp(MetaOps.KERNEL, (alu(UnaryOps.NEG, a),)), "every source of a KERNEL must be a STORE, got UnaryOps.NEG")
  _bad(store(a), "root of an AST must be a KERNEL")
  _bad(kernel(), "at least one STORE")
  _bad(kernel(store(a, 0), store(a, 0)), "two STOREs write buffer 0")
  _bad(kernel(store(a, 0), store(buf(2, (5,)), 1)), r"outputs disagree in shape: \(4,\) != \(5,\)")
  _bad(kernel(store(a, -1)), "STORE to buffer -1 is not allowed directly under the KERNEL")

def test_verify_bad_args():
  a, st = buf(1, (4,)), ShapeTracker.from_shape((4,))
  _bad(kernel(store(LazyOp(UnaryOps.CAST, (a,), None), dtype=dtypes.float)), "CAST needs a DType arg")
  _bad(kernel(store(LazyOp(BufferOps.LOAD, (), ConstBuffer(1.0, dtypes.float, st)))), "LOAD of a ConstBuffer")
  with pytest.raises(VerifyError, match="not a LazyOp"): LazyOp(BinaryOps.ADD, (a, "x"))   # refused when built
  _bad(kernel(store(LazyOp(UnaryOps.BITCAST, (a,), dtypes.half))), "BITCAST from .* changes the item size")
  _bad(kernel(store(LazyOp(BufferOps.LOAD, (a,), MemBuffer(-1, dtypes.float, st)))),
       "needs exactly one source: the STORE")

def test_verify_local_buffer_and_wmma():
  # the GROUP form of get_optimized_ast: reduce partly, STORE to a local buffer (1 on the global axis), LOAD, reduce
  x = buf(1, (4, 16, 8))
  start = reduce(ReduceOps.SUM, x, (2,))
  lbuf = MemBuffer(-1, dtypes.float, ShapeTracker.from_shape((1, 16, 1)))
  lload = LazyOp(BufferOps.LOAD, (LazyOp(BufferOps.STORE, (start,), lbuf),), lbuf)
  out_st = ShapeTracker.from_shape((4, 1, 1))
  ast = LazyOp(MetaOps.KERNEL, (store(reduce(ReduceOps.SUM, lload, (1,)), st=out_st),), KernelInfo(1, 0))
  sts = verify_lazyop(ast)
  assert sts[lload].shape == (4, 16, 1) and sts[ast.src[0].src[0]].shape == (4, 1, 1)
  bad = MemBuffer(-1, dtypes.float, ShapeTracker.from_shape((1, 8, 1)))
  bload = LazyOp(BufferOps.LOAD, (LazyOp(BufferOps.STORE, (start,), bad),), bad)
  _bad(kernel(store(reduce(ReduceOps.SUM, bload, (1,)), st=out_st)), r"STORE to buffer -1 of shape \(1, 8, 1\)")
  wa = WMMAArg("WMMA_8_16_16_half_float", (8, 16, 16), dtypes.half, dtypes.float, (8, 4, 4), "CUDA", (2, 3, 3), (2,))
  a, b = buf(1, (16, 8, 16), dtypes.half), buf(2, (16, 8, 16), dtypes.half)
  w = LazyOp(ReduceOps.WMMA, (a, b), wa)
  assert verify_lazyop(kernel(store(w)))[w].shape == (16, 8, 1) and w.dtype == dtypes.float
  _bad(kernel(store(LazyOp(ReduceOps.WMMA, (a, buf(2, (16, 8, 8), dtypes.half)), wa))), "WMMA sources disagree")

def test_verify_symbolic_structural():
  n = Variable("n", 1, 64)
  ok = kernel(store(alu(BinaryOps.ADD, buf(1, (n, 4)), buf(2, (Variable("n", 1, 64), 4)))))
  assert verify_lazyop(ok)
  _bad(kernel(store(alu(BinaryOps.ADD, buf(1, (n, 4)), buf(2, (Variable("m", 1, 64), 4))))), "ADD sources disagree")

# ***** get_lazyop_info *****

@pytest.mark.parametrize("name", ["matmul_64", "matmul_512", "matmul_1024", "matmul_odd", "matmul_half", "matmul_bf16"])
def test_info_matmul(name):
  c = C.get(name, "large")
  M, K = c.buffers[1].shape
  N = c.buffers[2].shape[1]
  isz = 2 if name in ("matmul_half", "matmul_bf16") else 4
  info = get_lazyop_info(c.ast)
  assert info.flops == 2 * M * N * K
  assert info.mem == {0: M * N * 4, 1: M * K * isz, 2: K * N * isz}
  assert info.shape == (M, N, 1) and info.dtype == dtypes.float

def test_info_elementwise_and_padded():
  add = get_lazyop_info(C.get("add").ast)
  assert add.flops == 32 * 40 and add.mem == {0: 5120, 1: 5120, 2: 5120}
  pad = get_lazyop_info(C.get("pad").ast)   # the padded view only spans the 30x38 input
  assert pad.mem[1] == 30 * 38 * 4 and pad.flops == 32 * 40
  assert get_lazyop_info(C.get("conv2d").ast).flops == 2 * (8 * 8 * 8) * (4 * 9)
  assert get_lazyop_info(C.get("casts").ast).flops == 32 * 40   # only the ADD; casts are free
  two = get_lazyop_info(C.get("two_reduces").ast)   # the shared LOAD is counted once
  assert two.flops == 2 * 32 * 64 + 32

def test_print_tree():
  f = io.StringIO()
  print_tree(C.get("two_reduces").ast, file=f)
  text = f.getvalue()
  for word in ("KERNEL", "STORE", "ADD", "SUM", "MAX", "LOAD buf1", "(shared)"): assert word in text

# ***** serialization *****

@pytest.mark.parametrize("scale,name", ALL)
def test_roundtrip_catalogue(scale, name):
  ast = C.get(name, scale).ast
  d = ast_to_json(ast)
  text = json.dumps(d, allow_nan=False)
  back = ast_from_json(json.loads(text))
  assert back == ast and hash(back) == hash(ast)
  assert ast_digest(back) == ast_digest(ast)
  assert len(d["nodes"]) == len(ast.lazyops)

def test_roundtrip_special_values():
  shp = (4,)
  vals = [math.inf, -math.inf, math.nan, -0.0, 1e-300, 0.1, True, 2**63 - 1, -(2**63)]
  dts = [dtypes.float] * 6 + [dtypes.bool, dtypes.int64, dtypes.int64]
  ast = kernel(*(store(const(v, shp, dt), i) for i, (v, dt) in enumerate(zip(vals, dts))))
  back = ast_from_json(json.loads(json.dumps(ast_to_json(ast), allow_nan=False)))
  got = [s.src[0].arg.val for s in back.src]
  assert [type(g) for g in got] == [type(v) for v in vals]
  assert math.isnan(got[2]) and all(g == v for i, (g, v) in enumerate(zip(got, vals)) if i != 2)
  assert math.copysign(1.0, got[3]) == -1.0
  assert ast_digest(back) == ast_digest(ast)

def test_roundtrip_vectors_images_kernelinfo_wmma_bound_vars():
  n = Variable("bound_n", 1, 63).bind(7)   # a name no other test uses: View.create's cache ignores bound values
  x = buf(1, (n, 4), dtypes.imageh((8, 8, 4)))
  out = store(cast(x, dtypes.float.vec(4)), 0, st=ShapeTracker.from_shape((n, 4)))
  ast = LazyOp(MetaOps.KERNEL, (out,), KernelInfo(1, 2, True))
  back = ast_from_json(ast_to_json(ast))
  assert back == ast and back.arg == KernelInfo(1, 2, True)
  assert back.src[0].src[0].arg == dtypes.float.vec(4)
  assert back.src[0].src[0].src[0].arg.dtype == dtypes.imageh((8, 8, 4))
  assert back.src[0].arg.st.shape[0].val == 7
  wa = WMMAArg("WMMA", (8, 16, 16), dtypes.half, dtypes.float, (8, 4, 4), "CUDA", (2, 3, 3), (2, 4))
  w = LazyOp(ReduceOps.WMMA, (buf(1, (2, 2, 2, 2, 2), dtypes.half),) * 2, wa)
  assert ast_from_json(ast_to_json(w)) == w

def test_serialization_errors():
  d = ast_to_json(C.get("add").ast)
  with pytest.raises(VerifyError, match="version 2"): ast_from_json({**d, "version": 2})
  with pytest.raises(VerifyError, match="malformed"):
    ast_from_json({**d, "nodes": [{"op": "Nope.X", "src": [], "arg": None}]})
  with pytest.raises(VerifyError, match="bad sources"):
    ast_from_json({**d, "nodes": [{"op": "UnaryOps.NEG", "src": [0], "arg": None}]})
  with pytest.raises(VerifyError, match="cannot serialize"): ast_to_json(LazyOp(UnaryOps.NEG, (), object()))

def test_digest_distinguishes_and_is_stable_across_processes():
  digests = {ast_digest(c.ast) for c in C.catalogue("small")}
  assert len(digests) == len(C.catalogue("small"))
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = ("import catalogue as C; from kernopt.ops import ast_digest; "
          "print(ast_digest(C.get('conv2d').ast), ast_digest(C.get('sym_sum').ast))")
  env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.pathsep.join([root, os.path.join(root, "tests")])}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.split()
  assert out == [ast_digest(C.get("conv2d").ast), ast_digest(C.get("sym_sum").ast)]

# ***** op semantics (expected values by hand or numpy) *****

I32, U8, I8 = dtypes.int32, dtypes.uint8, dtypes.int8
INT_MIN = -(1 << 31)

@pytest.mark.parametrize("op,dt,args,want", [
  (BinaryOps.IDIV, I32, (7, 2), 3), (BinaryOps.IDIV, I32, (-7, 2), -3), (BinaryOps.IDIV, I32, (7, -2), -3),
  (BinaryOps.IDIV, I32, (-7, -2), 3), (BinaryOps.IDIV, I32, (5, 0), 0), (BinaryOps.IDIV, I32, (INT_MIN, -1), INT_MIN),
  (BinaryOps.MOD, I32, (7, 2), 1), (BinaryOps.MOD, I32, (-7, 2), -1), (BinaryOps.MOD, I32, (7, -2), 1),
  (BinaryOps.MOD, I32, (5, 0), 0), (BinaryOps.MOD, I32, (INT_MIN, -1), 0),
  (BinaryOps.ADD, I32, (2**31 - 1, 1), INT_MIN), (BinaryOps.MUL, I32, (65536, 65536), 0),
  (BinaryOps.ADD, U8, (250, 10), 4),
  (UnaryOps.NEG, U8, (1,), 255), (UnaryOps.NEG, I8, (-128,), -128), (BinaryOps.MUL, I8, (16, 8), -128),
  (BinaryOps.SHL, I32, (1, 33), 2), (BinaryOps.SHL, I32, (1, 31), INT_MIN), (BinaryOps.SHR, I32, (-16, 2), -4),
  (BinaryOps.SHR, I32, (256, 36), 16), (BinaryOps.SHL, U8, (0x81, 1), 2), (BinaryOps.SHR, U8, (0x80, 9), 0x40),
  (BinaryOps.MAX, I32, (-3, 2), 2), (BinaryOps.MAX, I32, (3, -2), 3), (BinaryOps.XOR, I32, (0b1100, 0b1010), 0b0110),
  (BinaryOps.AND, I32, (-1, 0xF0), 0xF0), (BinaryOps.OR, U8, (0xF0, 0x0F), 0xFF),
  (BinaryOps.CMPLT, dtypes.bool, (-1, 0), True), (BinaryOps.CMPNE, dtypes.bool, (3, 3), False),
  (TernaryOps.WHERE, I32, (False, 1, 2), 2), (TernaryOps.WHERE, I32, (True, 1, 2), 1),
  (UnaryOps.NEG, dtypes.bool, (True,), False),
])
def test_exec_alu_ints(op, dt, args, want):
  got = exec_alu(op, dt, args)
  assert got == want and type(got) is type(want)

def _f32(x: float) -> float: return float(np.float32(x))

@pytest.mark.parametrize("op,dt,args,want", [
  (UnaryOps.LOG2, dtypes.float, (-1.0,), math.nan), (UnaryOps.LOG2, dtypes.float, (0.0,), -math.inf),
  (UnaryOps.LOG2, dtypes.float, (8.0,), 3.0), (UnaryOps.SQRT, dtypes.float, (-4.0,), math.nan),
  (UnaryOps.SQRT, dtypes.float, (math.inf,), math.inf), (UnaryOps.RECIP, dtypes.float, (0.0,), math.inf),
  (UnaryOps.RECIP, dtypes.float, (-0.0,), -math.inf), (UnaryOps.RECIP, dtypes.float, (math.inf,), 0.0),
  (UnaryOps.EXP2, dtypes.float, (200.0,), math.inf), (UnaryOps.EXP2, dtypes.float, (-math.inf,), 0.0),
  (UnaryOps.EXP2, dtypes.half, (16.0,), math.inf), (UnaryOps.SIN, dtypes.float, (math.inf,), math.nan),
  (UnaryOps.RECIP, dtypes.float, (3.0,), _f32(1 / 3)), (BinaryOps.ADD, dtypes.float, (1.0, 1e-8), 1.0),
  (BinaryOps.MUL, dtypes.float, (1e30, 1e30), math.inf), (BinaryOps.MAX, dtypes.float, (math.nan, 1.0), 1.0),
  (BinaryOps.MAX, dtypes.float, (1.0, math.nan), math.nan), (BinaryOps.MOD, dtypes.float, (math.inf, 2.0), math.nan),
  (BinaryOps.MOD, dtypes.float, (-7.5, 2.0), -1.5),
  # half: 2049 is halfway between 2048 and 2050 -> even mantissa 2048; 2051 -> 2052; 65520 rounds to inf
  (BinaryOps.ADD, dtypes.half, (2048.0, 1.0), 2048.0), (BinaryOps.ADD, dtypes.half, (2048.0, 3.0), 2052.0),
  (BinaryOps.ADD, dtypes.half, (65504.0, 16.0), math.inf), (BinaryOps.ADD, dtypes.half, (65504.0, 15.0), 65504.0),
  # bfloat16 keeps 8 significant bits: 257 is halfway between 256 and 258 -> 256; 259 -> 260
  (BinaryOps.ADD, dtypes.bfloat16, (256.0, 1.0), 256.0), (BinaryOps.ADD, dtypes.bfloat16, (256.0, 3.0), 260.0),
  (BinaryOps.ADD, dtypes.bfloat16, (1.0, 2**-9), 1.0),
  (BinaryOps.ADD, dtypes.bfloat16, (1.0, 2**-8 + 2**-10), 1.0 + 2**-7),
])
def test_exec_alu_floats(op, dt, args, want):
  got = exec_alu(op, dt, args)
  assert isinstance(got, float)
  if math.isnan(want): assert math.isnan(got)
  else: assert got == want and math.copysign(1, got) == math.copysign(1, want)

def test_exec_alu_half_bf16_match_numpy():
  rng = np.random.default_rng(1)
  xs = rng.standard_normal(200).astype(np.float32) * 1000
  for x in xs:
    assert exec_alu(BinaryOps.ADD, dtypes.half, (float(x), 0.0)) == float(np.float16(x))
    want = float(C.bf16_to_f32(C.f32_to_bf16(np.array([x])))[0])
    assert exec_alu(BinaryOps.ADD, dtypes.bfloat16, (float(x), 0.0)) == want
    assert exec_alu(BinaryOps.ADD, dtypes.float, (float(x), 0.1)) == float(np.float32(x) + np.float32(0.1))

def test_bf16_helpers():
  bits = C.f32_to_bf16(np.array([1.0, -2.5, 3.0078125, np.inf, np.nan], np.float32))
  assert list(bits[:4]) == [0x3F80, 0xC020, 0x4040, 0x7F80] and bits[4] & 0x7F80 == 0x7F80 and bits[4] & 0x7F
  assert list(C.bf16_to_f32(bits[:3])) == [1.0, -2.5, 3.0]

# ***** the catalogue: an independent numpy evaluation of each small AST equals its reference *****

def _index(st, shape, var_env):
  """(flat buffer index, valid) arrays over `shape`, by walking the views from the last one to the first."""
  ev = lambda x: sym_infer(x, var_env) if not isinstance(x, int) else x
  idxs = np.indices(shape, dtype=np.int64) if shape else np.zeros((0,), np.int64)
  valid = np.ones(shape, dtype=bool)
  flat = np.zeros(shape, np.int64)
  for i, v in enumerate(reversed(st.views)):
    vshape = tuple(ev(s) for s in v.shape)
    if i > 0: idxs = np.stack(np.unravel_index(flat, vshape)) if vshape else np.zeros((0,) + flat.shape, np.int64)
    if v.mask is not None:
      for ax, (lo, hi) in enumerate(v.mask): valid &= (idxs[ax] >= ev(lo)) & (idxs[ax] < ev(hi))
    flat = ev(v.offset) + sum((idxs[ax] * ev(s) for ax, s in enumerate(v.strides)), np.zeros(shape, np.int64))
    flat = np.where(valid, flat, 0)
  return flat, valid

_NP_OPS = {BinaryOps.ADD: np.add, BinaryOps.MUL: np.multiply, BinaryOps.XOR: np.bitwise_xor,
           BinaryOps.AND: np.bitwise_and,
           BinaryOps.OR: np.bitwise_or, BinaryOps.CMPLT: np.less, UnaryOps.EXP2: np.exp2, UnaryOps.LOG2: np.log2}

def _np_eval(case, bufs, var_env):
  cache = {}
  def ev(op):
    if op in cache: return cache[op]
    s = [ev(x) for x in op.src]
    if op.op in (BufferOps.LOAD, BufferOps.CONST):
      shape = tuple(sym_infer(x, var_env) for x in op.arg.st.shape)
      if op.op is BufferOps.CONST: r = np.full(shape, op.arg.val, C.np_dtype(op.arg.dtype))
      else:
        data = bufs[op.arg.idx].reshape(-1)
        if op.arg.dtype == dtypes.bfloat16: data = C.bf16_to_f32(data)
        flat, valid = _index(op.arg.st, shape, var_env)
        r = np.where(valid, data[flat], np.zeros((), data.dtype))
    elif op.op in ReduceOps: r = (np.sum if op.op is ReduceOps.SUM else np.max)(s[0], axis=op.arg, keepdims=True)
    elif op.op is UnaryOps.CAST: r = (np.trunc(s[0]) if dtypes.is_int(op.arg) else s[0]).astype(C.np_dtype(op.arg))
    elif op.op is UnaryOps.BITCAST: r = s[0].view(C.np_dtype(op.arg))
    elif op.op is TernaryOps.WHERE: r = np.where(*s)
    elif op.op is BinaryOps.MAX: r = np.where(s[0] > s[1], s[0], s[1])
    elif op.op is BinaryOps.SHL: r = C._wrap32(s[0].astype(np.int64) << (s[1] % 32))
    elif op.op is BinaryOps.SHR: r = s[0] >> (s[1] % 32)
    elif op.op in (BinaryOps.IDIV, BinaryOps.MOD): r = C._trunc_divmod(*s)[op.op is BinaryOps.MOD]
    else: r = _NP_OPS[op.op](*s)
    cache[op] = r
    return r
  return {st.arg.idx: ev(st.src[0]) for st in case.ast.src}

@pytest.mark.parametrize("name", [c.name for c in C.catalogue("small")])
def test_catalogue_reference_matches_ast(name):
  case = C.get(name)
  ins = case.inputs(np.random.default_rng(7))
  with np.errstate(over="ignore", invalid="ignore"):
    for vv in case.var_vals:
      env = {v: vv[v.expr] for v in case.ast.vars()}
      want, got = case.reference(ins, vv), _np_eval(case, ins, env)
      for spec in case.outputs:
        assert want[spec.idx].dtype == spec.np_dtype
        g = got[spec.idx]
        assert g.shape == want[spec.idx].shape, (spec.idx, g.shape, want[spec.idx].shape)
        np.testing.assert_allclose(g.astype(np.float64), want[spec.idx], rtol=max(case.tol, 1e-5), atol=1e-5)

def test_catalogue_shape():
  names = [c.name for c in C.catalogue("small")]
  assert names == [c.name for c in C.catalogue("large")] and len(set(names)) == len(names) == 33
  for c in C.catalogue("small"):
    ins = c.inputs(np.random.default_rng(0))
    assert {b.idx for b in c.buffers} == {x.arg.idx for x in c.ast.lazyops if x.op in (BufferOps.LOAD, BufferOps.STORE)}
    for b in c.buffers:
      if not b.output: assert ins[b.idx].dtype == b.np_dtype and ins[b.idx].size == b.numel
  with pytest.raises(KeyError): C.get("nope")
