"""swapdsl: train models larger than GPU memory.

The pipeline is a chain of pure stages, one package each (docs/design.md):
``lang`` (parse, elaborate) -> ``graph`` (IR, autodiff) -> ``planning`` (optimize) -> ``plan``
(the program, validated and simulated) -> ``runtime`` (interpret). The library API is here:

    import swapdsl
    model = swapdsl.load("net.swp", batch=8)
    plan = swapdsl.optimize(model, memory="8GiB")
    swapdsl.save(plan, "net.plan")
    print(swapdsl.execute(plan, steps=10).losses)
    run = swapdsl.execute(plan, options=swapdsl.Options(data="train/", epochs=3, save="net.safetensors"))
"""

from __future__ import annotations

import os
from typing import Any

from swapdsl.common.launcher import launched_size

# One of several MPI ranks on a machine: one BLAS thread each unless the user says otherwise, set before
# NumPy loads its BLAS (as torchrun does). Ranks with a BLAS thread per core each, on top of their lanes'
# threads and MPI's busy polling, ran a 2-rank MLP step at 84 ms instead of 2.8 ms on 2 cores.
_THREADS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
if launched_size() > 1 and not any(v in os.environ for v in _THREADS):
    os.environ.update(dict.fromkeys(_THREADS, "1"))

__version__ = "0.1.0"
__all__ = ["Execution", "Hooks", "Model", "Options", "Plan", "SearchOptions", "SearchProgress", "SwpError", "execute",
           "evaluate", "import_onnx", "load", "optimize", "predict", "predict_scored", "read", "save", "simulate"]


def __getattr__(name: str) -> Any:
    """The API loads on first use, so that importing one stage does not import them all."""
    if name in __all__:
        from swapdsl import api

        return getattr(api, name)
    raise AttributeError(f"module 'swapdsl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
