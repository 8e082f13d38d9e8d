"""Names from the user reach generated source only as validated identifiers under the renderers' prefix: a Variable's
name must be an ASCII identifier (else ShapeError); names that collide with kernopt's own identifiers or a dialect's
keywords, macros and builtins render on every dialect (a token check per dialect) and give numpy's numbers on CPU,
OPENCL and PYTHON. Constants render from their values: inf, nan and huge values through each dialect's spelling."""
import math
import re
import shutil
import numpy as np
import pytest
from catalogue import _case, _f32, _uniform, alu, buf, kernel, reduce, run_program, store
from kernopt.dtype import dtypes
from kernopt.errors import ShapeError
from kernopt.kernel import Kernel
from kernopt.ops import BinaryOps, ReduceOps
from kernopt.renderers import get_renderer
from kernopt.renderers.emitter import VAR_PREFIX
from kernopt.renderers.native import NativeCRenderer
from kernopt.runtime import Device
from kernopt.shape.symbolic import Variable
from kernopt.uops import UOp, UOps

# the colliding names, the lowerer's own index variables, and leading underscores (the lowerer's prefix)
COLLIDING = ["ridx0", "ridx0_c", "data0", "INFINITY", "int", "main", "threadIdx", "kernel", "_r0", "gidx0", "acc0",
             "NAN", "__r0", "v_n"]
LIM, M = 40, 3

@pytest.mark.parametrize("name", ["n\n#define x system(\"id\")", "", "1n", "n-1", "n m", "n;", "é", "n\u00e9",
                                  "a.b", "#include", "n\x00"])
def test_invalid_names_raise_shape_error(name):
  with pytest.raises(ShapeError, match=re.escape(repr(name))): Variable(name, 1, 10)

@pytest.mark.parametrize("name", ["n", "_r0", "__up1", "idx0", "gidx0", "lidx2", "ridx0", "N_2", "for", "int"])
def test_identifier_names_pass(name):
  assert Variable(name, 0, 3).expr == name

def sym_cases(name: str) -> list:
  """catalogue's symbolic elementwise add, and a MAX reduce over the variable (its identity renders -INFINITY)."""
  n = Variable(name, 1, LIM)
  vv = ({name: 1}, {name: 17}, {name: LIM})
  shp, mx, f = (n, M), (LIM, M), dtypes.float
  add = _case(f"sym_add_{name}", kernel(store(alu(BinaryOps.ADD, buf(1, shp), buf(2, shp)))), [(0, mx, f)],
              [(1, mx, f), (2, mx, f)], lambda r: {1: _uniform(r, mx), 2: _uniform(r, mx)},
              lambda x, v: {0: _f32(x[1][:v[name]].astype(np.float64) + x[2][:v[name]])}, set(), var_vals=vv)
  rshp, rmx = (M, n), (M, LIM)
  def max_ref(x: dict, v: dict) -> dict:
    k = v[name]
    return {0: x[1].reshape(-1)[:M * k].reshape(M, k).max(1, keepdims=True)}
  red = _case(f"sym_max_{name}", kernel(store(reduce(ReduceOps.MAX, buf(1, rshp), (1,)))), [(0, (M, 1), f)],
              [(1, rmx, f)], lambda r: {1: _uniform(r, rmx)}, max_ref, set(), var_vals=vv)
  return [add, red]

def protocol(ast, renderer):
  k = Kernel(ast, opts=renderer).required_optimizations()
  if not k.apply_tensor_cores(): k.hand_coded_optimizations()
  return k.to_program()

RENDERERS = {"C": lambda: get_renderer("CPU"), "NATIVE": lambda: NativeCRenderer(threads=2, min_parallel_work=1),
             "OPENCL": lambda: get_renderer("OPENCL"), "CUDA": lambda: get_renderer("CUDA"),
             "METAL": lambda: get_renderer("METAL"), "AMD": lambda: get_renderer("AMD")}
_TOKEN = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")

def tokens(prg) -> set[str]:
  """The identifier tokens of prg's source, its own kernel name (which carries the variable's name after the kind
  letter, as `r_3_n`) spelled KNAME."""
  return set(_TOKEN.findall(prg.src.replace(prg.name, "KNAME")))

@pytest.mark.parametrize("dialect", list(RENDERERS))
def test_colliding_names_render_under_the_prefix(dialect):
  """Every identifier of a kernel whose variable has a colliding name is the dialect's vocabulary (what the same
  kernel with variable `n` uses, less `v_n`) or the prefixed name; the bare name appears only if it is vocabulary."""
  base = [protocol(c.ast, RENDERERS[dialect]()) for c in sym_cases("n")]
  assert all(not t.startswith(VAR_PREFIX) or t == VAR_PREFIX + "n" for p in base for t in tokens(p))
  for name in COLLIDING:
    for ref, case in zip(base, sym_cases(name)):
      prg = protocol(case.ast, RENDERERS[dialect]())
      vocab = tokens(ref) - {VAR_PREFIX + "n"}
      assert tokens(prg) == vocab | {VAR_PREFIX + name}, (dialect, name, tokens(prg) ^ (vocab | {VAR_PREFIX + name}))
      if name not in vocab: assert name not in tokens(prg)
  if dialect in ("C", "NATIVE", "OPENCL", "METAL"): assert "INFINITY" in tokens(base[1])  # the MAX identity

def _devices() -> list[tuple[str, dict]]:
  avail = Device.available()
  ret = [("CPU", {"threads": 2, "min_parallel_work": 1}), ("CPU", {"profile": "static"}), ("PYTHON", {}),
         ("PYTHON", {"emulate": "CUDA"})]
  return ret + ([("OPENCL", {})] if "OPENCL" in avail else [])

@pytest.mark.parametrize("device,options", _devices(), ids=lambda x: str(x) if isinstance(x, str) else
                         "-".join(f"{k}={v}" for k, v in x.items()))
def test_colliding_names_compute_numpys_numbers(device, options):
  dev = Device.open(device, **options)
  names = {"CPU": COLLIDING, "OPENCL": ["ridx0", "data0", "INFINITY", "int", "kernel", "gidx0", "_r0"]}.get(
    device, ["ridx0", "INFINITY", "_r0", "gidx0", "threadIdx"])
  for name in names:
    for case in sym_cases(name):
      for vv, outs, refs in run_program(dev, case, protocol(case.ast, dev.renderer), seed=3):
        for i, ref in refs.items(): np.testing.assert_allclose(outs[i], ref, rtol=1e-6, err_msg=f"{case.name} {vv}")

def _const_uops(dt):
  """data0[k] = the k-th of inf, -inf, nan and the largest finite value of dt."""
  vals = [math.inf, -math.inf, math.nan, 3.4028234663852886e38 if dt == dtypes.float32 else 1.7976931348623157e308]
  out = UOp(UOps.DEFINE_GLOBAL, dt, (), (0, "data0", True))
  uops = [out]
  for k, v in enumerate(vals):
    idx, c = UOp.const(dtypes.int32, k), UOp.const(dt, v)
    uops += [idx, c, UOp(UOps.STORE, None, (out, idx, c))]
  return vals, uops

@pytest.mark.parametrize("dialect", list(RENDERERS))
def test_special_constants_use_the_dialects_spelling(dialect):
  r = RENDERERS[dialect]()
  for dt in (dtypes.float32, dtypes.float64) if dialect not in ("METAL",) else (dtypes.float32,):
    _, uops = _const_uops(dt)
    src = r.render("consts", uops)
    assert r.infinity in src and f"(-{r.infinity})" in src and r.nan in src, src
    assert ("3.4028235e+38" if dt == dtypes.float32 else "1.7976931348623157e+308") in src, src
    assert "inf" not in _TOKEN.findall(src) and "nan" not in _TOKEN.findall(src)

@pytest.mark.parametrize("options", [{}, {"profile": "static"}], ids=["native", "static"])
def test_special_constants_on_cpu(options):
  from kernopt.renderers import BufferArg, Program
  from kernopt.runtime import Buffer
  dev = Device.open("CPU", **options)
  for dt in (dtypes.float32, dtypes.float64):
    vals, uops = _const_uops(dt)
    src = dev.renderer.render("consts", uops)
    out = Buffer("CPU", 4, dt)
    dev.compile(Program("consts", src, "CPU", uops=tuple(uops), args=(BufferArg(0, dt, 4, True),)))(out, wait=True)
    np.testing.assert_array_equal(out.numpy(), np.array(vals, dtype=np.float32 if dt == dtypes.float32 else np.float64))

@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_colliding_names_compile_with_nvcc():
  from kernopt.runtime.cuda import batch_sources, compile_cuda
  srcs = [protocol(c.ast, get_renderer("CUDA")).src for name in COLLIDING for c in sym_cases(name)]
  assert compile_cuda(batch_sources(srcs), "sm_80", prefer_nvrtc=False, cache=False)[:4] == b"\x7fELF"

@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_colliding_names_pass_the_metal_stub_check():
  from test_metal import syntax_check
  res = syntax_check([protocol(c.ast, get_renderer("METAL")).src for name in COLLIDING for c in sym_cases(name)])
  assert res.returncode == 0, res.stderr[:3000]
