"""The plan: the program for three streams, its file format, its replay, the validator, the simulator and
the summary."""
