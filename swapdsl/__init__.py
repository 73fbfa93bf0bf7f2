"""swapdsl: train models larger than GPU memory.

The pipeline is a chain of pure stages (see DESIGN.md):
``parse -> elaborate -> (autodiff) -> optimize -> interpret``.
"""

__version__ = "0.1.0"
