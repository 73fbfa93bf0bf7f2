"""Adversarial inputs for swapdsl's own checks: mutated plan files and mutated model files.

The test suite runs a few hundred cases of each; ``bench/mutate_plans.py`` and ``bench/fuzz_models.py``
run as many as asked and print the counts per class.
"""
