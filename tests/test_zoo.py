"""The model zoo: published parameter counts, and a small configuration of each trains."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import MODELS, build_graph
from swapdsl.graph.autodiff import training_graph
from swapdsl.runtime.reference import train


def lstm_lm_params(layers: int, hidden: int, vocab: int) -> int:
    """Embedding V*H; per layer W_x H*4H + W_h H*4H + b 4H; decoder H*V + V."""
    return vocab * hidden + layers * (8 * hidden * hidden + 4 * hidden) + hidden * vocab + vocab


PUBLISHED = [
    ("resnet", ["depth=50"], 25_557_032),
    ("resnet", ["depth=152"], 60_192_808),
    ("resnet", ["depth=18"], 11_689_512),  # torchvision resnet18
    ("vgg", ["depth=16"], 138_357_544),
    ("vgg", ["depth=19"], 143_667_240),  # torchvision vgg19
    ("wide_resnet", ["depth=50", "width=2"], 68_883_240),
    ("bert", ["layers=12", "hidden=768", "heads=12", "intermediate=3072"], 109_514_298),  # BERT-base
    ("bert", [], 335_174_458),  # the default: BERT-large with the MLM head, tied, no pooler
    ("gpt", ["layers=12", "hidden=768", "heads=12"], 124_439_808),  # GPT-2 small
    ("gpt", ["layers=24", "hidden=1024", "heads=16"], 354_823_168),  # GPT-2 medium, the default
    ("inception_v4", [], 42_679_816),
    ("nasnet", ["cells=6", "filters=168"], 88_753_150),  # timm's nasnetalarge
    ("llama", [], 6_738_415_616),  # Llama-2-7B, the default
    ("llama", ["layers=22", "hidden=2048", "kv_heads=4", "ffn=5632"], 1_100_048_384),  # TinyLlama-1.1B
    ("lstm_lm", [], lstm_lm_params(4, 4096, 10000)),
    ("lstm_lm", ["layers=2", "hidden=650", "vocab=10000"], lstm_lm_params(2, 650, 10000)),
]


@pytest.mark.parametrize("name,defines,count", PUBLISHED,
                         ids=[f"{n}-{'-'.join(d) or 'default'}" for n, d, _ in PUBLISHED])
def test_published_parameter_count(cli, name: str, defines: list[str], count: int) -> None:
    code, out, err = cli("check", MODELS / f"{name}.swp", "--json", *[a for d in defines for a in ("-D", d)])
    assert code == 0, err
    assert json.loads(out)["params"] == count


def test_bert_pooler_arithmetic() -> None:
    # the bare encoder with a pooler (109,482,240) = ours - MLM head + pooler dense
    hidden, vocab = 768, 30522
    head = (hidden * hidden + hidden) + 2 * hidden + vocab
    pooler = hidden * hidden + hidden
    assert 109_514_298 - head + pooler == 109_482_240


SMALL = {
    "resnet": ["depth=18", "base=4", "image=32", "batch=4", "classes=5", "lr=0.05"],
    "wide_resnet": ["depth=50", "base=4", "image=32", "batch=4", "classes=5", "lr=0.05"],
    "vgg": ["base=4", "fc=64", "image=32", "batch=4", "classes=5", "dropout_p=0", "lr=0.01"],
    "inception_v4": ["image=75", "batch=2", "classes=5", "lr=0.02"],
    "nasnet": ["cells=2", "filters=16", "stem=8", "image=32", "batch=4", "classes=5"],
    "lstm_lm": ["layers=2", "hidden=16", "vocab=20", "seq=5", "batch=4", "lr=3.0"],
    "bert": ["layers=2", "hidden=32", "heads=2", "intermediate=64", "seq=8", "vocab=50", "positions=16",
             "batch=2", "lr=1e-2"],
    "gpt": ["layers=2", "hidden=32", "heads=2", "seq=8", "vocab=50", "positions=16", "batch=2", "lr=1e-2"],
    "llama": ["layers=2", "hidden=32", "heads=4", "kv_heads=2", "ffn=48", "seq=8", "vocab=50", "batch=2",
              "lr=1e-2"],
}


@pytest.mark.parametrize("name", list(SMALL))
def test_small_configuration_trains(name: str) -> None:
    _, fwd = build_graph(str(MODELS / f"{name}.swp"), SMALL[name])
    losses = train(training_graph(fwd), 10, seed=0, xp=np).losses
    assert all(np.isfinite(losses))
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize("name", list(SMALL))
def test_default_configuration_needs_more_than_16_gib(cli, name: str) -> None:
    code, out, _ = cli("check", MODELS / f"{name}.swp", "--training", "--json")
    assert code == 0
    assert json.loads(out)["peak_bytes"] > 16 * 2**30
