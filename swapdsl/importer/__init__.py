"""Front ends beside the language: a model from another framework's file, written as `.swp` text.

``onnx_read`` checks an ONNX file and gives its graph with every weight as an array; ``walk`` walks
its nodes into a ``context``, folding the shape arithmetic (``fold``) and writing one line of `.swp`
per op through a rule table keyed by op type (``rules``); ``text`` names the dimensions that follow the
batch (and any other symbolic size) by lowering again at other sizes, and assembles the model. The api
writes the file and its weights (a checkpoint that `--init` reads).
"""

from swapdsl.importer.text import Imported, convert

__all__ = ["Imported", "convert"]
