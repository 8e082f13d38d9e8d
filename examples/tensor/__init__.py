"""A small lazy tensor library on kernopt's public API (examples/tensor/README.md): Tensor (tensor.py) builds a lazy
graph (lazy.py); realizing it schedules fused kernels as kernopt ASTs and runs them (schedule.py)."""
from examples.tensor.tensor import Tensor, Function, realize_all
from examples.tensor.schedule import COUNTS, fused_shape, realize, schedule

__all__ = ["Tensor", "Function", "realize_all", "COUNTS", "fused_shape", "realize", "schedule"]
