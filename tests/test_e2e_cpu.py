"""End to end on the CPU device: every small catalogue case, unoptimized and with the standard protocol, compiled,
run and compared with its numpy reference (symbolic cases at each of their var_vals); image cases refused by the C
dialect; and the cost estimates (ops.get_lazyop_info and Program.op_estimate / mem_estimate) against analytic counts."""
import numpy as np
import pytest
from catalogue import bf16_to_f32, catalogue
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError
from kernopt.kernel import Kernel
from kernopt.ops import get_lazyop_info
from kernopt.runtime import Buffer, Device
from kernopt.runtime import cpu
from kernopt.shape.symbolic import sym_infer

pytestmark = pytest.mark.skipif(not cpu.CPUDevice.availability()[0], reason="no C compiler")
CASES = {c.name: c for c in catalogue("small")}
EXEC = [c for c in CASES.values() if "image" not in c.tags]
IMAGES = [c for c in CASES.values() if "image" in c.tags]
SENTINEL = 0x7B  # outputs start as this byte pattern, so a missed write cannot pass for a zero

_programs: dict = {}

def device(mode: str):
  """Device["CPU"] (its native profile: host vector width and threads), or the spec's static C profile."""
  return Device.open("CPU", profile="static") if mode.endswith("static") else Device["CPU"]

def program(case, mode: str):
  """(Kernel, Program) of case: "unoptimized", or "standard" (required opts, tensor cores, else hand-coded) on the
  device's native profile, or "standard_static" on the static C profile."""
  if (case.name, mode) not in _programs:
    k = Kernel(case.ast, opts=device(mode).renderer)
    if mode.startswith("standard"):
      k.required_optimizations()
      if not k.apply_tensor_cores(): k.hand_coded_optimizations()
    _programs[(case.name, mode)] = (k, k.to_program())
  return _programs[(case.name, mode)]

def run(case, prg, inputs: dict, var_vals: dict, dev) -> dict:
  """Every output buffer of case (flat numpy) after one launch of prg on dev."""
  bufs = {b.idx: Buffer("CPU", b.numel, b.dtype) for b in case.buffers}
  for b in case.outputs: bufs[b.idx].copyin(np.full(bufs[b.idx].nbytes, SENTINEL, np.uint8).view(b.np_dtype))
  for idx, arr in inputs.items(): bufs[idx].copyin(arr)
  dev.compile(prg)(*[bufs[a.idx] for a in prg.args], var_vals=var_vals, wait=True)
  return {b.idx: bufs[b.idx].numpy() for b in case.outputs}

def assert_matches(got: np.ndarray, ref: np.ndarray, dt, tol: float, what: str) -> None:
  """Exact for ints, bools and tol == 0; else rtol=tol (at least the dtype's rounding) and atol=tol·max(1, |ref|)."""
  got = got[:ref.size].reshape(ref.shape)
  if dt == dtypes.bfloat16: got, ref = bf16_to_f32(got), bf16_to_f32(ref)
  if not dtypes.is_float(dt) or tol == 0:
    np.testing.assert_array_equal(got, ref, err_msg=what)
    return
  tol = max(tol, {dtypes.half: 1e-3, dtypes.bfloat16: 1e-2}.get(dt, 0.0))
  scale = max(1.0, float(np.abs(ref.astype(np.float64)).max(initial=0.0)))
  np.testing.assert_allclose(got, ref, rtol=tol, atol=tol * scale, err_msg=what)

@pytest.mark.parametrize("mode", ["unoptimized", "standard", "standard_static"])
@pytest.mark.parametrize("case", EXEC, ids=lambda c: c.name)
def test_case_matches_numpy(case, mode):
  k, prg = program(case, mode)
  inputs = case.inputs(np.random.default_rng(1234))
  for vv in case.var_vals:
    outs = run(case, prg, inputs, vv, device(mode))
    ref = case.reference(inputs, vv)
    for b in case.outputs:
      assert_matches(outs[b.idx], np.asarray(ref[b.idx]), b.dtype, case.tol,
                     f"{case.name} {mode} opts={list(k.applied_opts)} var_vals={vv} output {b.idx}")

@pytest.mark.parametrize("case", IMAGES, ids=lambda c: c.name)
def test_c_dialect_refuses_images(case):
  k = Kernel(case.ast, opts=Device["CPU"].renderer)
  with pytest.raises(UnsupportedError): k.to_program()
  k = Kernel(case.ast, opts=Device["CPU"].renderer).required_optimizations()
  k.hand_coded_optimizations()
  with pytest.raises(UnsupportedError): k.to_program()

# ***** cost estimates *****

def _matmul_dims(case) -> tuple[int, int, int]:
  M, N, _ = case.buffers[0].shape
  return M, N, case.buffers[1].shape[1]

# the analytic flops of each case's math (one op per output element per elementwise op; one combine per reduced input
# element; 2·M·N·K for a matmul); mem is the bytes of each buffer
def analytic(case) -> tuple[int, int]:
  name, f4 = case.name, 4
  if name.startswith("matmul"):
    M, N, K = _matmul_dims(case)
    isz = case.buffers[1].dtype.itemsize
    return 2 * M * N * K, M * N * f4 + (M * K + K * N) * isz
  if name == "matvec":
    N, K = case.buffers[1].shape
    return 2 * N * K, (N + N * K + K) * f4
  if name in ("conv2d", "conv2d_s2"):
    N, CO, Ho, Wo = case.buffers[0].shape[:4]
    CI, H, W = case.buffers[1].shape[1:]
    return 2 * N * CO * Ho * Wo * CI * 9, (N * CO * Ho * Wo + N * CI * H * W + CO * CI * 9) * f4
  numel = {b.idx: b.numel * b.dtype.itemsize for b in case.buffers}
  inp = case.buffers[-1].numel
  per = {"add": 1, "broadcast_add": 1, "copy": 0, "const": 0, "pad": 1, "two_outputs": 2, "int_ops": 8,
         "bool_where": 3, "exp2_log2": 3, "idiv_mod": 2, "casts": 1}
  if name in per: return per[name] * case.buffers[0].numel, sum(numel.values())
  if name.startswith("sum_") or name.startswith("max_"): return inp, sum(numel.values())
  if name == "two_reduces": return 2 * inp + case.buffers[0].numel, sum(numel.values())
  raise KeyError(name)

STATIC = [c for c in EXEC if "symbolic" not in c.tags]

@pytest.mark.parametrize("case", STATIC, ids=lambda c: c.name)
def test_lazyop_info_is_analytic(case):
  info = get_lazyop_info(case.ast)
  flops, mem = analytic(case)
  assert info.flops == flops
  assert sum(info.mem.values()) == mem

# kernels whose unoptimized form computes no address: the flat loop index is the address, so the Program counts
# exactly the AST's math. Elsewhere Program.op_estimate also counts the index arithmetic of the kernel as rendered.
NO_INDEX_MATH = ["add", "copy", "const", "two_outputs", "sum_all", "int_ops", "bool_where", "exp2_log2", "casts",
                 "idiv_mod"]

@pytest.mark.parametrize("name", NO_INDEX_MATH)
def test_program_estimates_exact_without_index_math(name):
  case = CASES[name]
  _, prg = program(case, "unoptimized")
  flops, mem = analytic(case)
  assert prg.op_estimate == flops
  assert prg.mem_estimate == mem

@pytest.mark.parametrize("case", [c for c in STATIC if c.name.startswith("matmul")], ids=lambda c: c.name)
def test_program_mem_estimate_of_matmul(case):
  """Unoptimized, each of the M·N·K iterations loads one element of A and one of B; the output is stored once. The
  standard protocol's upcasts share loads, so it moves no more than that and at least every byte once."""
  M, N, K = _matmul_dims(case)
  isz = case.buffers[1].dtype.itemsize
  _, base = program(case, "unoptimized")
  assert base.mem_estimate == 2 * M * N * K * isz + M * N * 4
  assert base.op_estimate >= 2 * M * N * K
  _, std = program(case, "standard")
  assert analytic(case)[1] <= std.mem_estimate <= base.mem_estimate

@pytest.mark.parametrize("case", STATIC, ids=lambda c: c.name)
def test_program_estimates_bound_the_math(case):
  flops, mem = analytic(case)
  for mode in ("unoptimized", "standard"):
    _, prg = program(case, mode)
    # an unrolled reduce folds its 0 + x0 (legitimately fewer ALU ops than combines): allow one per output
    assert prg.op_estimate >= flops - case.buffers[0].numel, mode
    assert prg.mem_estimate >= mem or "broadcast" in case.tags or "pad" in case.tags, mode

def test_symbolic_reduce_estimates():
  case = CASES["sym_sum"]
  _, prg = program(case, "unoptimized")
  m = case.buffers[0].shape[0]
  for vv in case.var_vals:
    vals = {v: vv[v.expr] for v in prg.vars}
    assert sym_infer(prg.mem_estimate, vals) == (m * vv["n"] + m) * 4
    assert sym_infer(prg.op_estimate, vals) >= m * vv["n"]

def test_symbolic_elementwise_estimates():
  case = CASES["sym_add"]
  _, prg = program(case, "unoptimized")
  for vv in case.var_vals:
    vals = {v: vv[v.expr] for v in prg.vars}
    assert sym_infer(prg.mem_estimate, vals) == 3 * 16 * vv["n"] * 4
    assert sym_infer(prg.op_estimate, vals) == 16 * vv["n"]

def test_program_op_estimate_of_matmul_is_2mnk():
  case = CASES["matmul_64"]
  _, prg = program(case, "unoptimized")
  assert prg.op_estimate == 2 * 64 ** 3
