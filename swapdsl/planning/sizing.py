"""How much arena a plan needs: with no swapping at all, and at the least (a property of the ops).

The arena has no fixed carving: any tensor may sit at any free offset, so the
only bytes a cap must hold at once are what never moves (pinned persistent
tensors and inputs) plus what one op touches.
"""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.common.units import MAX_BYTES, format_bytes
from swapdsl.planning.problem import Problem


def resident_at_start(p: Problem, pinned: frozenset[int]) -> list[int]:
    """Tensors on the device when an iteration starts: pinned persistent tensors, then inputs."""
    return sorted(pinned, key=p.names.__getitem__) + sorted(p.inputs, key=p.names.__getitem__)


def need_bytes(p: Problem, pinned: frozenset[int]) -> int:
    """The smallest cap that can run any schedule: what never moves, plus the most any op touches
    (an in-place output shares its input's bytes)."""
    fixed = set(resident_at_start(p, pinned))
    return sum(p.size[t] for t in fixed) + largest_op(p, fixed)[1]


def largest_op(p: Problem, fixed: set[int]) -> tuple[int, int]:
    """(The op that touches the most bytes besides ``fixed``, those bytes); the first such op."""
    best = (0, 0)
    for op in range(p.n_ops):
        touched = set(p.op_inputs[op]) | set(p.op_outputs[op][1 if p.in_place[op] else 0:])
        most = sum(p.size[t] for t in touched - fixed)
        if most > best[1]:
            best = (op, most)
    return best


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


class BelowSmallestCap(SwpError):
    """A cap below the smallest feasible one (``least`` bytes, scratch included)."""

    least: int = 0


def least_cap(p: Problem) -> int:
    """The least cap any schedule of ``p`` runs under, the kernels' scratch included, swapping allowed."""
    return need_bytes(p, frozenset()) + p.scratch


def below_smallest_cap(p: Problem, cap: int, no_swap: int) -> BelowSmallestCap:
    """The error for a user's ``cap`` (which holds the kernels' scratch too) below the smallest feasible one."""
    least = smallest_cap(p, no_swap) + p.scratch
    fixed = set(resident_at_start(p, frozenset()))
    op, most = largest_op(p, fixed)
    what = p.graph.ops[op]
    label = p.graph.tensors[what.outputs[0]].title if what.outputs else what.op
    where = f" (at {what.span})" if what.span is not None else ""
    err = BelowSmallestCap(f"{format_bytes(cap)} is below the smallest feasible cap for this model, {format_bytes(least)} "
                    f"({least} bytes, of which {format_bytes(p.scratch)} is the kernels' scratch)",
                    hints=[f"use --memory {least} or more" if least <= MAX_BYTES else
                           f"it is past the largest cap swapdsl plans under, {format_bytes(MAX_BYTES)}",
                           f"with no swapping at all this model needs {format_bytes(no_swap + p.scratch)}"],
                    notes=[f"what sets it: op {op} `{what.op}` making {label}{where} reads and writes "
                           f"{format_bytes(most)} at once, beside {format_bytes(sum(p.size[t] for t in fixed))} of "
                           "inputs that stay on the device, and the scratch"])
    err.least = least
    return err
