"""Making plans: the problem a graph poses, the bound, the swap planner (reference and compiled), the
baselines, the genetic search and the benchmark table."""
