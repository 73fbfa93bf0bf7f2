"""The op registry (see registry.py); importing this package fills it."""

from swapdsl.ops import elementwise, linalg, loss, nn, optim, shape  # noqa: F401  (registration)
from swapdsl.ops.registry import REGISTRY, GradBuilder, KernelContext, OpDef, broadcast_shapes, infer

__all__ = ["REGISTRY", "GradBuilder", "KernelContext", "OpDef", "broadcast_shapes", "infer"]
