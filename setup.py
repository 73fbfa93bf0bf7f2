"""The C extension; everything else is in pyproject.toml.

The optimiser's inner loop (placement, swap planning, simulation, decoding a schedule) is C built with the
package: swapdsl/planning/_fastplan.c. It replaced numba, which compiled the same algorithm for about 100 s on first
use and ran the planner 1.1-1.2x and the simulator 1.6x slower (interleaved A/B on the LSTM's plan).
(Here rather than in pyproject.toml, where setuptools still calls ext-modules experimental.)
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("swapdsl.planning._fastplan", ["swapdsl/planning/_fastplan.c"])])
