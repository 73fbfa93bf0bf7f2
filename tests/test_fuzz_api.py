"""The library-API fuzzer in every run: a public function called with one argument replaced by an
adversary's value returns or raises SwpError; never another exception, never a hang.
SWAPDSL_API_FUZZ sets the number of cases, SWAPDSL_FUZZ_SEED the seed (bench/fuzz_api.py runs more)."""

from __future__ import annotations

import os
from pathlib import Path

from swapdsl.fuzz.api_args import calls, case_of, judge, make_seeds

CASES = int(os.environ.get("SWAPDSL_API_FUZZ", "300"))
SEED = int(os.environ.get("SWAPDSL_FUZZ_SEED", "0"))


def test_wrong_arguments_get_a_clean_verdict(tmp_path: Path) -> None:
    table = calls(make_seeds(tmp_path / "seeds"))
    bad, verdicts = [], []
    for i in range(CASES):
        case = case_of(SEED, i, table)
        work = tmp_path / f"case{i}"
        work.mkdir()
        verdict = judge(case, table, work)
        verdicts.append(verdict.verdict)
        if verdict.verdict not in ("ok", "refused"):
            bad.append(f"case {i} ({case.function}, {case.argument} = {case.value}) -> {verdict.verdict}: "
                       f"{verdict.detail}")
    assert not bad, "\n".join(bad)
    assert {"ok", "refused"} <= set(verdicts)  # (the cases reach both the checks and the work)
    assert {case_of(SEED, i, table).function for i in range(CASES)} == set(table)
