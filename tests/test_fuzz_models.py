"""The model fuzzer in every run: mutated stdlib models end with exit 0, or exit 2 at a file position;
never a traceback, never over 10 s. SWAPDSL_MODEL_FUZZ sets the number of cases, SWAPDSL_FUZZ_SEED
the seed (bench/fuzz_models.py runs tens of thousands)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from swapdsl.fuzz.models import KINDS, case_of, judge, seeds

CASES = int(os.environ.get("SWAPDSL_MODEL_FUZZ", "300"))
SEED = int(os.environ.get("SWAPDSL_FUZZ_SEED", "0"))


@pytest.mark.parametrize("part", range(len(KINDS)))
def test_mutated_models_get_a_clean_verdict(tmp_path: Path, part: int) -> None:
    sources = seeds()
    bad = []
    # case i has kind (i // models) % kinds: this part takes the cases of one kind
    indices = [i for i in range(CASES) if (i // len(sources)) % len(KINDS) == part]
    for i in indices:
        model, case = case_of(SEED, i, sources)
        verdict = judge(case, tmp_path)
        if verdict.verdict not in ("ok", "refused"):
            bad.append(f"case {i} ({model}, {case.file}: {case.what}) -> {verdict.verdict}: {verdict.detail}")
    assert not bad, "\n".join(bad)
    assert indices
