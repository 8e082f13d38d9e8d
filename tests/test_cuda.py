"""The CUDA dialect and device without a GPU: catalogue kernels (standard protocol, tensor cores included) rendered
for sm_80 and sm_90 and compiled by nvcc in one batch per arch; the rendered structure; the device's availability
and compile errors; the GPU check script's dry run."""
import shutil
import pytest
from catalogue import catalogue, protocol_program
from kernopt.errors import CompileError, UnsupportedError
from kernopt.renderers import get_renderer
from kernopt.renderers.cuda import CUDARenderer
from kernopt.runtime import Device
from kernopt.runtime.cuda import CUDADevice, batch_sources, compile_cuda

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH: CUDA compile checks skipped")
NAMES = [c.name for c in catalogue("small") if "image" not in c.tags and not c.name.startswith("image")]

def program(name: str, arch: str = "sm_80", heuristics: str = "spec"):
  return protocol_program(name, get_renderer("CUDA", arch=arch) if heuristics == "spec" else
                          CUDARenderer(arch, heuristics=heuristics))

@pytest.mark.parametrize("arch,heuristics", [("sm_80", "spec"), ("sm_90", "spec"), ("sm_90", "cuda_gpu")])
@needs_nvcc
def test_catalogue_compiles_with_nvcc(arch, heuristics):
  srcs = [program(n, arch, heuristics)[0].src for n in NAMES]
  assert len(srcs) >= 10
  cubin = compile_cuda(batch_sources(srcs), arch, prefer_nvrtc=False, cache=False)
  assert cubin[:4] == b"\x7fELF"

@pytest.mark.parametrize("name", ["matmul_half", "matmul_bf16"])
def test_tensor_core_matmuls_use_mma(name):
  prg, tc = program(name)
  assert tc
  kind = "f16" if name == "matmul_half" else "bf16"
  assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in prg.src
  assert prg.local_size is not None and prg.local_size[0] * prg.local_size[1] * prg.local_size[2] % 32 == 0

def test_launch_bounds_shared_and_barrier():
  prg, _ = program("sum_all")
  threads = prg.local_size[0] * prg.local_size[1] * prg.local_size[2]
  assert f"__launch_bounds__({threads}) {prg.name}(" in prg.src
  assert "__shared__" in prg.src and "__syncthreads();" in prg.src and "threadIdx.x" in prg.src

def test_symbolic_kernel_takes_int_after_buffers():
  prg, _ = program("sym_add")
  assert "const float* data2, const int v_n)" in prg.src

def test_half_is_storage_and_no_tensor_cores_before_sm80():
  prg, tc = program("matmul_half", "sm_75")
  assert not tc and "mma.sync" not in prg.src and "__half2float(" in prg.src
  assert get_renderer("CUDA", arch="sm_75").caps.tensor_cores == ()
  with pytest.raises(UnsupportedError): get_renderer("CUDA", arch="80")

def test_images_are_refused():
  with pytest.raises(UnsupportedError, match="images"): program("image_in")

def test_source_needs_no_gcc_builtins():
  """NVRTC (the device's default compiler) defines none of GCC's __builtin_*; nvcc does, so only this catches them."""
  for n in NAMES:
    assert "__builtin_" not in program(n, "sm_90")[0].src, n

def test_module_loads_bind_the_context_in_the_calling_thread(monkeypatch):
  """The driver's current context is per thread and the search loads modules on a thread pool: each load must make
  the device's context current first (a fake driver records the order of calls)."""
  import threading
  import kernopt.runtime.cuda as cuda
  calls: list[tuple[str, int]] = []
  class FakeDriver:
    def cuCtxSetCurrent(self, ctx): calls.append(("bind", threading.get_ident())); return (0,)
    def cuModuleLoadData(self, cubin): calls.append(("load", threading.get_ident())); return (0, "module")
    def cuModuleGetFunction(self, module, name): return (0, "fn")
  dev = CUDADevice.__new__(CUDADevice)
  dev.drv, dev.ctx, dev.arch, dev.prefer_nvrtc = FakeDriver(), "ctx", "sm_90", True
  monkeypatch.setattr(cuda, "compile_cuda", lambda src, arch, prefer_nvrtc: b"cubin")
  prg, _ = program("add", "sm_90")
  t = threading.Thread(target=dev._compile, args=(prg,))
  t.start()
  t.join()
  assert [c[0] for c in calls] == ["bind", "load"] and calls[0][1] == calls[1][1] != threading.get_ident()

def test_device_is_unavailable_without_driver_and_excluded():
  ok, reason = CUDADevice.availability()
  if ok: pytest.skip("a CUDA GPU is present")
  assert reason.startswith("no CUDA driver/GPU") or reason.startswith("no CUDA compiler")
  assert "CUDA" not in Device.available()

@needs_nvcc
def test_compile_error_carries_the_log():
  with pytest.raises(CompileError) as e:
    compile_cuda('extern "C" __global__ void k(float* a) { a[0] = undefined_thing; }', "sm_80", cache=False)
  assert "undefined_thing" in e.value.log

@needs_nvcc
def test_gpu_check_dry_run(capsys):
  import importlib.util, os
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "gpu_check.py")
  spec = importlib.util.spec_from_file_location("gpu_check", path)
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  assert mod.main(["--dry-run", "--arch", "sm_80", "--only", "sum_all"]) == 0
  out = capsys.readouterr().out
  assert "sum_all" in out and "0 failure(s)" in out
