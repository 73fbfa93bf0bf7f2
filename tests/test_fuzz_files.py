"""The training-input fuzzer in every run: mutated data folders, .npz archives, checkpoints, logs and device
profiles end with exit 0, or exit 2 and one `error:` line; never a traceback, never a hang.
SWAPDSL_FILE_FUZZ sets the number of cases, SWAPDSL_FUZZ_SEED the seed (bench/fuzz_files.py runs more)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import MODELS
from swapdsl.fuzz.files import SURFACES, case_of, judge, make_seeds

CASES = int(os.environ.get("SWAPDSL_FILE_FUZZ", "250"))
SEED = int(os.environ.get("SWAPDSL_FUZZ_SEED", "0"))


@pytest.mark.parametrize("surface", SURFACES)
def test_mutated_input_files_get_a_clean_verdict(tmp_path: Path, surface: str) -> None:
    seeds = make_seeds(tmp_path / "seeds", MODELS / "mlp.swp")
    bad, verdicts = [], []
    for i in range(SURFACES.index(surface), CASES, len(SURFACES)):
        work = tmp_path / f"case{i}"
        work.mkdir()
        case, argv = case_of(SEED, i, seeds, MODELS / "mlp.swp", work)
        verdict = judge(argv)
        verdicts.append(verdict.verdict)
        if verdict.verdict not in ("ok", "refused"):
            bad.append(f"case {i} ({case.surface}, {case.kind}, {case.what}) -> {verdict.verdict}: {verdict.detail}")
    assert not bad, "\n".join(bad)
    assert "refused" in verdicts  # the mutations reach the checks
