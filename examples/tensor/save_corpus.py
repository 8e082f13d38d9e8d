"""Write the kernels the examples build (every model of models.py at a symbolic batch, the MLP with its backward,
and a training step of examples/train_mlp.py) as AST files under benchmarks/asts/tensor/ through kernopt's SAVE_ASTS
knob (each Kernel saves the AST it is built from as <digest>.json).
  python examples/tensor/save_corpus.py [dir]"""
from __future__ import annotations
import os
import sys
HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "benchmarks", "asts",
                                                                          "tensor"))
os.makedirs(OUT, exist_ok=True)
os.environ["SAVE_ASTS"], os.environ["DISABLE_CACHE"] = OUT, "1"   # no program cache: every Kernel is built here
sys.path.insert(0, os.path.join(HERE, "..", ".."))
import numpy as np  # noqa: E402
from kernopt import Variable  # noqa: E402
from examples.tensor import realize_all  # noqa: E402
from examples.tensor import models as M  # noqa: E402
from examples.train_mlp import train  # noqa: E402

if __name__ == "__main__":
  for name in M.MODELS:
    _, outs = M.build(name, 4, "CPU", np.random.default_rng(0), Variable("batch", 1, 64), grad=name == "mlp")
    realize_all(*outs)
  train(1, "CPU", log_every=0)
  print(f"{len(os.listdir(OUT))} AST files in {OUT}")
