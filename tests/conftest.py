from __future__ import annotations

import os
from pathlib import Path

import pytest

from swapdsl import api
from swapdsl.cli import main, parse_defines
from swapdsl.graph.ir import Graph
from swapdsl.lang.loader import Program

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "stdlib" / "models"
SMALL_MODELS = ["mlp", "tiny_transformer", "tiny_resnet"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import cupy  # noqa: F401

        has_gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        has_gpu = False
    if not has_gpu:
        skip = pytest.mark.skip(reason="needs a CUDA GPU and CuPy")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    """Run the CLI in-process: returns (exit code, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        code = main([str(a) for a in args])
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def build_graph(path: str, defines: list[str]) -> tuple[Program, Graph]:
    """The front half of the pipeline, as `swapdsl check` runs it: parsed, elaborated, checked."""
    model = api.load(path, parse_defines(defines))
    return model.program, model.graph


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


UPDATE_GOLDEN = os.environ.get("SWAPDSL_UPDATE_GOLDEN") == "1"


# ---- how many cases the memory-safety properties try --------------------------------------------
#
# SWAPDSL_HYPOTHESIS=dev (the default: a quick local run), ci (.ci/run sets it: 2,000 cases of each
# memory-safety property) or long (20,000 each, before a release). Other properties keep their counts.
HYPOTHESIS_PROFILE = os.environ.get("SWAPDSL_HYPOTHESIS", "dev")
_SAFETY_CASES = {"dev": 0, "ci": 2_000, "long": 20_000}


def safety(dev_examples: int):  # noqa: ANN201 - a Hypothesis settings decorator
    """Settings for a memory-safety property: ``dev_examples`` cases locally, 2,000 in CI, 20,000 long."""
    from hypothesis import HealthCheck, settings

    if HYPOTHESIS_PROFILE not in _SAFETY_CASES:
        raise pytest.UsageError(f"SWAPDSL_HYPOTHESIS={HYPOTHESIS_PROFILE}: expected one of {', '.join(_SAFETY_CASES)}")
    # print_blob: a failure prints the `@reproduce_failure(...)` line that replays it; keep it (or an
    # `@example`) on the test, so every later run tries that case first
    return settings(max_examples=max(dev_examples, _SAFETY_CASES[HYPOTHESIS_PROFILE]), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow], print_blob=True)


def pytest_configure(config: pytest.Config) -> None:
    if HYPOTHESIS_PROFILE != "dev":  # say per property how many cases passed (the CI log shows it)
        config.option.hypothesis_show_statistics = True

