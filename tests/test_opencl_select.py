"""Which OpenCL device the OPENCL device takes, on fake pyopencl platforms (no OpenCL needed): the first GPU, else the
first other device, that builds and runs the probe kernel with the right numbers; broken platforms and devices are
skipped with their reason; an OpenCL compiler that does not know the host CPU is an UnsupportedError naming the
remedies."""
import types
import pytest
from kernopt.errors import UnsupportedError
from kernopt.helpers import config_override
from kernopt.renderers import Program
from kernopt.runtime import Device
from kernopt.runtime import opencl

GPU, CPU = 4, 2
UNKNOWN_CPU_LOG = ("clBuildProgram failed: BUILD_PROGRAM_FAILURE\n\nBuild on <device>:\n\n"
                   "error: unknown target CPU 'generic'")

class FakeError(Exception): pass

class FakeDevice:
  """`works`: "yes", "unknown_cpu" (its build fails as an old PoCL's does on a newer CPU), "wrong" (the probe kernel
  computes wrong numbers) or "crash" (clCreateContext fails)."""
  def __init__(self, name, works="yes", type=CPU):
    self.name, self.works, self.type = name, works, type
    self.version, self.driver_version, self.builds = "OpenCL 3.0", "1.0", 0
    self.platform = None
    self.native_vector_width_float, self.max_work_group_size, self.local_mem_size = 8, 4096, 65536

class FakePlatform:
  def __init__(self, name, devices, broken=False):
    self.name, self.version, self._devices, self.broken = name, f"{name} 1.0", devices, broken
    for d in devices: d.platform = self
  def get_devices(self):
    if self.broken: raise FakeError("clGetDeviceIDs failed: DEVICE_NOT_FOUND")
    return list(self._devices)

def fake_cl(platforms):
  """A pyopencl module with just what device selection and the probe use."""
  def Context(devs):
    if devs[0].works == "crash": raise FakeError("clCreateContext failed: OUT_OF_HOST_MEMORY")
    return types.SimpleNamespace(dev=devs[0])
  class Program:
    def __init__(self, ctx, src): self.ctx, self.src = ctx, src
    def build(self, devices):
      d = devices[0]
      d.builds += 1
      if d.works == "unknown_cpu": raise FakeError(UNKNOWN_CPU_LOG)
      return self
    def get_build_info(self, d, what): return UNKNOWN_CPU_LOG if d.works == "unknown_cpu" else ""
    def ko_probe(self, queue, gsz, lsz, buf): buf[:] = 2 * buf + (1 if self.ctx.dev.works == "yes" else 0)
  def Buffer(ctx, flags, hostbuf): return hostbuf.copy()
  def enqueue_copy(queue, dst, src, is_blocking=True): dst[:] = src
  def get_platforms():
    if platforms is None: raise FakeError("clGetPlatformIDs failed: PLATFORM_NOT_FOUND")
    return platforms
  return types.SimpleNamespace(Error=FakeError, get_platforms=get_platforms, Context=Context,
                               CommandQueue=lambda ctx, d=None, properties=None: object(), Program=Program,
                               Buffer=Buffer, enqueue_copy=enqueue_copy,
                               device_type=types.SimpleNamespace(GPU=GPU, CPU=CPU),
                               mem_flags=types.SimpleNamespace(READ_WRITE=1, COPY_HOST_PTR=2),
                               program_build_info=types.SimpleNamespace(LOG=0))

@pytest.fixture
def platforms(monkeypatch):
  """Installs fake platforms: `platforms(list_or_None)`."""
  monkeypatch.setattr(opencl, "_probe_cache", {})
  def install(plats):
    monkeypatch.setitem(__import__("sys").modules, "pyopencl", fake_cl(plats))
    return plats
  return install

def test_a_broken_first_platform_is_skipped(platforms):
  good = FakeDevice("pthread-good")
  platforms([FakePlatform("Broken", [FakeDevice("x")], broken=True), FakePlatform("PoCL", [good])])
  assert opencl.select_device(None) is good

def test_a_device_that_cannot_target_the_cpu_falls_through_to_the_next(platforms):
  old, new = FakeDevice("pthread-generic", "unknown_cpu"), FakeDevice("pthread-skylake-avx512")
  platforms([FakePlatform("PoCL 3.0", [old]), FakePlatform("PoCL 3.1", [new])])
  assert opencl.select_device(None) is new
  report = dict(opencl.probe_report())
  why = report[opencl.device_label(old)]
  assert "cannot compile for this CPU" in why and "pocl-opencl-icd" in why and "intel-opencl-rt" in why
  assert report[opencl.device_label(new)] is None

def test_wrong_numbers_and_crashes_are_skipped_with_their_reason(platforms):
  wrong, crash, good = FakeDevice("wrong", "wrong"), FakeDevice("crash", "crash"), FakeDevice("good")
  platforms([FakePlatform("A", [wrong, crash, good])])
  assert opencl.select_device(None) is good
  report = dict(opencl.probe_report())
  assert "wrong numbers" in report["A A 1.0 / wrong"] and "OUT_OF_HOST_MEMORY" in report["A A 1.0 / crash"]

def test_a_working_gpu_comes_first_a_broken_one_is_passed_over(platforms):
  cpu, gpu = FakeDevice("cpu"), FakeDevice("gpu", type=GPU)
  platforms([FakePlatform("P", [cpu, gpu])])
  assert opencl.select_device(None) is gpu
  cpu2, gpu2 = FakeDevice("cpu2"), FakeDevice("gpu2", "unknown_cpu", type=GPU)
  platforms([FakePlatform("Q", [cpu2, gpu2])])
  assert opencl.select_device(None) is cpu2

def test_no_working_device_is_unsupported_and_says_why(platforms):
  dead = FakeDevice("pthread-generic", "unknown_cpu")
  platforms([FakePlatform("PoCL", [dead])])
  with pytest.raises(UnsupportedError, match="no OpenCL device runs kernopt's probe kernel") as e:
    opencl.select_device(None)
  assert "pthread-generic" in str(e.value) and "unknown target CPU" in str(e.value)
  ok, why = opencl.OpenCLDevice.availability()
  assert not ok and "pthread-generic" in why
  assert "OPENCL" not in Device.available() and "pocl-opencl-icd" in Device.why_unavailable("OPENCL")
  assert Device.why_unavailable("PYTHON") is None and "unknown device" in Device.why_unavailable("NOPE")
  assert opencl.main() == 1

def test_no_platform_at_all(platforms):
  platforms(None)
  with pytest.raises(UnsupportedError, match="no OpenCL platform"): opencl.select_device(None)

def test_probe_runs_once_per_device_and_driver(platforms):
  d = FakeDevice("once")
  platforms([FakePlatform("P", [d])])
  for _ in range(3): opencl.select_device(None)
  assert d.builds == 1
  d.driver_version = "2.0"   # a new driver is probed again
  opencl.select_device(None)
  assert d.builds == 2

def test_an_explicit_choice_is_taken_as_it_is(platforms):
  bad, good = FakeDevice("bad", "unknown_cpu"), FakeDevice("good")
  platforms([FakePlatform("P", [bad, good])])
  assert opencl.select_device(0) is bad and opencl.select_device("bad") is bad
  with config_override(CL_DEVICE="bad"): assert opencl.select_device() is bad
  assert bad.builds == 0

def test_a_kernel_build_that_cannot_target_the_cpu_is_unsupported(platforms):
  bad = FakeDevice("pthread-generic", "unknown_cpu")
  platforms([FakePlatform("PoCL", [bad])])
  dev = object.__new__(opencl.OpenCLDevice)
  dev.cl_device, dev.ctx = bad, types.SimpleNamespace(dev=bad)
  prg = Program("E_4", "__kernel void E_4(__global float* data0) { data0[0] = 1.0f; }", "OPENCL")
  with pytest.raises(UnsupportedError, match="cannot compile for this CPU") as e: dev._build_source(prg)
  assert "Intel" in str(e.value) and "pocl-opencl-icd" in str(e.value)
