"""The op registry (see registry.py); importing this package fills it."""

from swapdsl.graph.ops import collective, conv, elementwise, linalg, loss, nn, optim, shape  # noqa: F401  (registration)
from swapdsl.graph.ops.kernels import kernel_of, scratch_need
from swapdsl.graph.ops.registry import GradBuilder, KernelContext, OpDef, REGISTRY, broadcast_shapes, infer

__all__ = ["REGISTRY", "GradBuilder", "KernelContext", "OpDef", "broadcast_shapes", "infer", "kernel_of",
           "scratch_need"]
