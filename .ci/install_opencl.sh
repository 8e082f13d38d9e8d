#!/usr/bin/env bash
# A working OpenCL platform for the OPENCL device on a fresh Debian/Ubuntu machine, as root, through pip only:
# pyopencl's manylinux wheel bundles the ocl-icd loader, and pocl-binary-distribution bundles PoCL (CPU device,
# with its own LLVM/clang) and registers it with that loader. No apt package (ocl-icd, hwloc, clang) is needed.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
"$PYTHON" -m pip install --upgrade pip >/dev/null
"$PYTHON" -m pip install "pyopencl>=2024.1" "pocl-binary-distribution>=3.0"
"$PYTHON" - <<'PY'
import numpy as np, pyopencl as cl
devs = [d for p in cl.get_platforms() for d in p.get_devices()]
assert devs, "pyopencl found no OpenCL device"
d = devs[0]
ctx = cl.Context([d])
q = cl.CommandQueue(ctx)
prg = cl.Program(ctx, "__kernel void twice(__global float* a) { int i = get_global_id(0); a[i] = 2.0f * a[i]; }").build()
a = np.arange(16, dtype=np.float32)
buf = cl.Buffer(ctx, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=a)
prg.twice(q, (16,), None, buf)
out = np.empty_like(a)
cl.enqueue_copy(q, out, buf)
assert (out == 2 * a).all(), out
print(f"OpenCL OK: {d.platform.name} {d.platform.version} / {d.name}: max_work_group_size={d.max_work_group_size} "
      f"max_work_item_sizes={d.max_work_item_sizes} local_mem_size={d.local_mem_size} image_support={d.image_support} "
      f"fp16={'cl_khr_fp16' in d.extensions}")
PY
