"""What an MPI launcher tells the processes it starts, read from the environment alone (no MPI library,
no NumPy): ``swapdsl/__init__.py`` reads it before NumPy loads, ``runtime/dist.py`` before importing
mpi4py."""

from __future__ import annotations

import os

# what MPICH's Hydra, Open MPI and PMIx set in the processes they start
LAUNCHED = ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK")


def launched() -> bool:
    return any(k in os.environ for k in LAUNCHED)


def launched_size() -> int:
    """How many processes the launcher says it started (1 when none did or it does not say)."""
    return max(_said("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", default=1), 1)


def launched_rank() -> int:
    """This process's rank as the launcher says (0 when none started it or it does not say)."""
    return _said("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", default=0)


def _said(*keys: str, default: int) -> int:
    """The first of these variables that holds a whole number."""
    for key in keys:
        text = os.environ.get(key, "")
        if text.isdigit():
            return int(text)
    return default
