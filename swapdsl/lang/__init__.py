"""The `.swp` language: parse, resolve imports, elaborate a model into a forward graph."""
