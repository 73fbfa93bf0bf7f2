"""How much arena a plan needs: with no swapping at all, and at the least (a property of the ops).

The arena has no fixed carving: any tensor may sit at any free offset, so the
only bytes a cap must hold at once are what never moves (pinned persistent
tensors and inputs) plus what one op touches.
"""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.common.units import format_bytes
from swapdsl.planning.problem import Problem


def resident_at_start(p: Problem, pinned: frozenset[int]) -> list[int]:
    """Tensors on the device when an iteration starts: pinned persistent tensors, then inputs."""
    return sorted(pinned, key=p.names.__getitem__) + sorted(p.inputs, key=p.names.__getitem__)


def need_bytes(p: Problem, pinned: frozenset[int]) -> int:
    """The smallest cap that can run any schedule: what never moves, plus the most any op touches
    (an in-place output shares its input's bytes)."""
    fixed = set(resident_at_start(p, pinned))
    most = 0
    for op in range(p.n_ops):
        touched = set(p.op_inputs[op]) | set(p.op_outputs[op][1 if p.in_place[op] else 0:])
        most = max(most, sum(p.size[t] for t in touched - fixed))
    return sum(p.size[t] for t in fixed) + most


def smallest_cap(p: Problem, no_swap: int) -> int:
    """The smallest cap a plan is guaranteed at: the least the ops need, or no swapping at all."""
    return min(need_bytes(p, frozenset()), no_swap)


def choose_pinned(p: Problem, cap: int, no_swap: int) -> frozenset[int]:
    """Pin every persistent tensor when nothing needs to swap, or when they take at most half the cap
    and the ops still fit beside them; otherwise none, and they come in when needed."""
    everything = p.pinnable
    if no_swap <= cap:
        return everything  # the plan is the no-swap placement itself
    if sum(p.size[t] for t in everything) <= cap // 2 and need_bytes(p, everything) <= cap:
        return everything
    if need_bytes(p, frozenset()) > cap:
        raise below_smallest_cap(p, cap + p.scratch, no_swap)
    return frozenset()


def below_smallest_cap(p: Problem, cap: int, no_swap: int) -> SwpError:
    """The error for a user's ``cap`` (which holds the kernels' scratch too) below the smallest feasible one."""
    least = smallest_cap(p, no_swap) + p.scratch
    return SwpError(f"{format_bytes(cap)} is below the smallest feasible cap for this model, {format_bytes(least)} "
                    f"({least} bytes, of which {format_bytes(p.scratch)} is the kernels' scratch)",
                    hints=[f"use --memory {least} or more: some op needs that much at once",
                           f"with no swapping at all this model needs {format_bytes(no_swap + p.scratch)}"])
