"""The ONNX import fuzzer in every run: mutated ONNX files (bytes and graphs) are refused with exit 2, one
`error:` line and nothing written, or imported to a model whose forward pass equals onnxruntime's.
SWAPDSL_ONNX_FUZZ sets the number of cases, SWAPDSL_FUZZ_SEED the seed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from swapdsl.fuzz.onnx_files import KINDS, case_of, judge, make_seeds  # noqa: E402

CASES = int(os.environ.get("SWAPDSL_ONNX_FUZZ", "200"))
SEED = int(os.environ.get("SWAPDSL_FUZZ_SEED", "0"))


def test_mutated_onnx_files_get_a_clean_verdict(tmp_path: Path) -> None:
    seeds = make_seeds(tmp_path / "seeds")
    bad, verdicts = [], []
    for i in range(CASES):
        work = tmp_path / f"case{i}"
        work.mkdir()
        case, target, argv = case_of(SEED, i, seeds, work)
        verdict = judge(case, target, argv)
        verdicts.append((case.kind, verdict.verdict))
        if verdict.verdict not in ("ok", "refused"):
            bad.append(f"case {i} ({case.seed}, {case.kind}, {case.what}) -> {verdict.verdict}: {verdict.detail}")
    assert not bad, "\n".join(bad)
    assert {v for _, v in verdicts} == {"ok", "refused"}  # the mutations reach the checks, and some pass them
    assert {k for k, _ in verdicts} == set(KINDS)
