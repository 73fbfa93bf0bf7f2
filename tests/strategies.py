"""Hypothesis strategies: the package's random training graphs, with choices Hypothesis can shrink."""

from __future__ import annotations

from hypothesis import strategies as st

from swapdsl.fuzz.graphs import random_training_graph
from swapdsl.graph.ir import Graph
from swapdsl.graph.precision import GUARDS, PRECISIONS


class DrawnChoices:
    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def pick(self, options: list) -> object:  # type: ignore[type-arg]
        return self.draw(st.sampled_from(options))

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def flip(self) -> bool:
        return self.draw(st.booleans())


@st.composite
def training_graphs(draw: st.DrawFn, max_depth: int = 7, precisions: tuple[str, ...] = ("f32",),
                    guards: tuple[str, ...] = ("none",)) -> Graph:
    """A random training graph; with ``precisions`` and ``guards`` (e.g. ``EVERY``), in f32, bf16 or f16 (the
    mixed-precision policy of graph/precision.py), with or without a guarded step (updates gated on finite
    gradients; dynamic loss scaling). The properties that execute plans of every method draw from all of
    them; the planners' own properties keep to f32, where the half cases would add only time."""
    return random_training_graph(DrawnChoices(draw), max_depth, precisions=precisions, guards=guards)


EVERY = {"precisions": PRECISIONS, "guards": GUARDS}  # training_graphs(**EVERY)
