#!/usr/bin/env bash
# The reference for issue 18's benchmark, idempotently: tinygrad 0.9.2 (+ numpy) in a throw-away venv ($TG_VENV,
# default /tmp/tgvenv) and clang 15 for its CLANG backend, which runs `clang` from PATH: a `clang -> clang-15` shim in
# $TG_VENV/shim (vs_reference_cpu.py puts it first on PATH for the reference's runs), the system left as it is.
# Prints the compiler used. Then, to re-export and re-translate the ASTs (tinygrad venv, then kernopt's):
#   PATH=/tmp/tgvenv/shim:$PATH /tmp/tgvenv/bin/python benchmarks/reference/export_asts.py
#   python benchmarks/reference/translate.py
#   bash benchmarks/reference/setup_reference.sh
set -eu
venv=${TG_VENV:-/tmp/tgvenv}
if ! command -v clang-15 >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq clang-15
  else sudo apt-get update -qq && sudo apt-get install -y -qq clang-15; fi
fi
if ! "$venv/bin/python" -c "import tinygrad, numpy, importlib.metadata as m; assert m.version('tinygrad') == '0.9.2'" \
    2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q tinygrad==0.9.2 numpy
fi
mkdir -p "$venv/shim"
ln -sf "$(command -v clang-15)" "$venv/shim/clang"
echo "tinygrad $("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('tinygrad'))") in $venv"
echo "compiler: $(PATH="$venv/shim:$PATH" clang --version | head -1) ($(readlink -f "$venv/shim/clang"))"
