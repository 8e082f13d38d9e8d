#!/usr/bin/env bash
# A working OpenCL CPU platform for the OPENCL device on any x86-64 Linux host, tried in this order:
#   1. Debian/Ubuntu's pocl-opencl-icd through apt-get (as root, where apt-get exists): PoCL 3.1 on LLVM 15 with
#      Debian's CPU-selection patches, so it targets CPUs newer than its LLVM (Zen 5 runs as skylake-avx512).
#      pyopencl's bundled ICD loader reads /etc/OpenCL/vendors, so no variable is needed once it is installed.
#   2. The pip route, always installed: pyopencl's wheel with the PoCL of pocl-binary-distribution (3.0 on LLVM 14,
#      which knows no CPU after Zen 3 / Ice Lake and then fails every build with "unknown target CPU 'generic'").
#   3. Only when no device of 1 and 2 builds and runs the probe kernel: Intel's CPU runtime from PyPI (about 800 MB),
#      registered with the loader as kernopt-intel-cpu.icd.
# Then `python -m kernopt.runtime.opencl` builds and runs a probe kernel on every platform and device, prints which
# were tried, which one kernopt will use and why the others were skipped; the script fails when none works.
# KERNOPT_OPENCL_NO_INTEL=1 skips step 3.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
say() { echo "install_opencl: $*"; }

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  say "apt route: installing Debian's pocl-opencl-icd"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
           pocl-opencl-icd >/dev/null; }; then
    say "apt-get could not install pocl-opencl-icd; going on with the pip route"
  fi
else
  say "no apt-get as root here: skipping Debian's pocl-opencl-icd, taking the pip route"
fi

say "pip route: pyopencl and pocl-binary-distribution"
"$PYTHON" -m pip install -q numpy "pyopencl>=2024.1" "pocl-binary-distribution>=3.0"

repo="$(cd "$(dirname "$0")/.." && pwd)"
# the probe is kernopt's own device selection, importable from the checkout in any venv with pyopencl and numpy
probe() { PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m kernopt.runtime.opencl; }
if probe; then exit 0; fi

if [ "${KERNOPT_OPENCL_NO_INTEL:-0}" = 1 ]; then
  say "no OpenCL device works here, and KERNOPT_OPENCL_NO_INTEL=1 skips Intel's runtime"
  exit 1
fi
say "no device of the apt and pip routes works here: falling back to Intel's CPU runtime from PyPI"
"$PYTHON" -m pip install -q intel-opencl-rt intel-cmplr-lib-rt
prefix="$("$PYTHON" -c 'import sys; print(sys.prefix)')"
lib="$prefix/lib/libintelocl.so"
[ -e "$lib" ] || { say "intel-opencl-rt installed no $lib"; exit 1; }
# the wheel's own .icd names a placeholder path; the loader needs the real one (its libraries find each other)
if [ "$(id -u)" = 0 ]; then vendors=/etc/OpenCL/vendors; else vendors="$prefix/etc/OpenCL/vendors"; fi
mkdir -p "$vendors"
echo "$lib" > "$vendors/kernopt-intel-cpu.icd"
if [ "$vendors" != /etc/OpenCL/vendors ]; then
  say "registered $lib in $vendors: export OCL_ICD_VENDORS=$vendors before using kernopt's OPENCL device"
  export OCL_ICD_VENDORS="$vendors"
fi
probe
