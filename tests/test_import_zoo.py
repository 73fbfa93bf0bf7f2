"""The imported ResNet-50 in docs/resnet50.swp (torchvision's, through `torch.onnx.export` and
`swapdsl import`; bench/import_torch.py --keep made it): it loads as the language's own models do,
with torchvision's parameter count to the last weight, and its repeated modules as defs."""

from __future__ import annotations

from pathlib import Path

import swapdsl

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_the_imported_resnet50_has_torchvisions_parameters() -> None:
    m = swapdsl.load(DOCS / "resnet50.swp", batch=2)
    assert sum(m.graph.type_of(p).numel for p in m.graph.params) == 25_557_032  # torchvision's count
    text = (DOCS / "resnet50.swp").read_text()
    assert text.count("= bottleneck(") == 12 and text.count("= bottleneck_2(") == 3
    assert "layer2_1.conv1_weight" in m.graph.params
