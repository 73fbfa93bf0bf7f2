"""The IR: typed dataflow graphs, the op registry (shape rules, gradients, kernels), autodiff into the
training graph, the checker, the printer and the figures read off a graph."""
