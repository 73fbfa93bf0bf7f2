"""What the swap planner is told besides the schedule: a policy, and the baselines' policies by name."""

from __future__ import annotations

import attrs

INF = 1 << 60  # a position after every op
OUTPUTS = ("oldest", "newest", "newest-backward")


@attrs.frozen
class Policy:
    """How the swap planner chooses (see planning/reference.py for what each choice does)."""

    victim: str  # "lru" or "belady"
    prefetch: str  # "none", "earliest" or "ahead"
    offload: bool = False
    outputs: str = "oldest"  # where an op's outputs go: one of OUTPUTS
    early: float | None = None  # bring tensors back as soon as a gap holds them, keeping this part of the cap free
    horizon: int | None = None  # early swap-ins only of tensors needed within this many ops (None: any)

    def reserve(self, cap: int) -> int:
        """Bytes an early swap-in leaves free (-1: no early swap-ins)."""
        return -1 if self.early is None else int(self.early * cap)

    def newest(self, pos: int, turn: int) -> bool:
        """Do the outputs of the op at ``pos`` take the bytes freed last?"""
        return self.outputs == "newest" or (self.outputs == "newest-backward" and pos >= turn)


METHODS: dict[str, Policy] = {
    "lru": Policy("lru", "none"),
    "vdnn": Policy("lru", "ahead", offload=True),
    "belady": Policy("belady", "earliest"),
}
