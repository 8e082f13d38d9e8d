"""The AMD HIP dialect, render only (no compiler here; numerics are the PYTHON device emulating AMD): every catalogue
kernel renders, with the work-group bound, amdgcn builtins, shared memory with fenced barriers and RDNA3 WMMA."""
import shutil
import pytest
from catalogue import catalogue, protocol_program
from kernopt.dtype import dtypes
from kernopt.errors import UnsupportedError
from kernopt.renderers import get_renderer

def program(name: str):
  return protocol_program(name, get_renderer("AMD"))

@pytest.mark.parametrize("name", [c.name for c in catalogue("small") if not c.name.startswith("image")])
def test_catalogue_renders(name):
  prg, _ = program(name)
  n = 1
  for s in prg.local_size or (): n *= s
  assert f'extern "C" __attribute__((global)) void __attribute__((amdgpu_flat_work_group_size(1, {n}))) {prg.name}(' \
    in prg.src
  assert "#include" not in prg.src   # no HIP headers: clang's amdgcn builtins and ocml declarations only

def test_group_reduce_uses_shared_memory_and_fenced_barrier():
  prg, _ = program("sum_all")
  assert "__attribute__((shared, aligned(16))) float temp0[" in prg.src
  assert ('__builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup"); __builtin_amdgcn_s_barrier(); '
          '__builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");') in prg.src
  assert "__builtin_amdgcn_workitem_id_x()" in prg.src

def test_wmma_and_half_types():
  prg, tc = program("matmul_half")
  assert tc and "__builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c)" in prg.src
  assert "typedef _Float16 ko_half16 __attribute__((ext_vector_type(16)));" in prg.src

def test_math_goes_through_ocml():
  prg, _ = program("exp2_log2")
  assert "__ocml_exp2_f32(" in prg.src and "__ocml_log2_f32(" in prg.src

def test_half_out_wmma_helper_packs_low_halves():
  from kernopt.ops import WMMAArg
  from kernopt.uops import UOp, UOps
  r = get_renderer("AMD")
  h16, h8 = dtypes.half.vec(16), dtypes.half.vec(8)
  arg = WMMAArg("WMMA_16_16_16_half_half", (16, 16, 16), dtypes.half, dtypes.half, (16, 16, 8), "AMD", (0, 0, 0), ())
  srcs = tuple(UOp(UOps.DEFINE_ACC, d, (), (0.0, i)) for i, d in enumerate((h16, h16, h8)))
  from kernopt.renderers.cstyle import RenderContext, rendering
  with rendering(RenderContext()) as ctx: call = r.render_wmma(UOp(UOps.WMMA, h8, srcs, arg), ["a", "b", "c"])
  helpers = "\n".join(ctx.helpers.values())
  assert call == "ko_wmma_f16_16x16x16_f16(a, b, c)"
  assert "__builtin_amdgcn_wmma_f16_16x16x16_f16_w32(a, b, w, false)" in helpers and "w[2 * i] = c[i]" in helpers

def test_images_are_refused():
  with pytest.raises(UnsupportedError): program("image_in")

@pytest.mark.skipif(shutil.which("clang") is None, reason="clang is not on PATH: AMD stays render-only")
def test_clang_amdgcn_compiles():
  import subprocess
  src = program("sum_all")[0].src
  res = subprocess.run(["clang", "-x", "hip", "--offload-arch=gfx1100", "-nogpulib", "-nogpuinc", "-fsyntax-only",
                        "--cuda-device-only", "-"], input=src, capture_output=True, text=True)
  assert res.returncode == 0, res.stderr
