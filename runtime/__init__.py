"""Plan interpreter and its array backends, shipped as ``swapdsl.runtime``."""
