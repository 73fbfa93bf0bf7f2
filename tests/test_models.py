"""The stdlib's small models: parameter counts by hand, golden IR, -D overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import MODELS, REPO, SMALL_MODELS, UPDATE_GOLDEN, build_graph
from swapdsl.graph.printer import print_graph

GOLDEN = Path(__file__).parent / "golden"


def dense(i: int, o: int, bias: bool = True) -> int:
    return i * o + (o if bias else 0)


def conv_bn(cin: int, cout: int, k: int) -> int:
    return cout * cin * k * k + 2 * cout


def mlp_params(features: int = 784, hidden: int = 256, depth: int = 2, classes: int = 10) -> int:
    return dense(features, hidden) + (depth - 1) * dense(hidden, hidden) + dense(hidden, classes)


def transformer_params(seq: int = 64, vocab: int = 512, dim: int = 128, depth: int = 2, ffn: int = 512) -> int:
    block = 2 * dim + 4 * dense(dim, dim) + 2 * dim + dense(dim, ffn) + dense(ffn, dim)
    return vocab * dim + seq * dim + depth * block + 2 * dim + dense(dim, vocab, bias=False)


def resnet_params(width: int = 16, blocks: int = 2, classes: int = 10) -> int:
    total = conv_bn(3, width, 3)
    cin = width
    for stage in range(3):
        cout = width * 2**stage
        for block in range(blocks):
            total += conv_bn(cin, cout, 3) + conv_bn(cout, cout, 3)
            if cin != cout or (stage > 0 and block == 0):
                total += conv_bn(cin, cout, 1)
            cin = cout
    return total + dense(cin, classes)


HAND_COUNTS = {
    ("mlp", ()): mlp_params(),
    ("mlp", ("depth=4", "hidden=100")): mlp_params(hidden=100, depth=4),
    ("tiny_transformer", ()): transformer_params(),
    ("tiny_transformer", ("depth=3", "dim=64", "heads=8", "ffn=256", "seq=16")):
        transformer_params(seq=16, dim=64, depth=3, ffn=256),
    ("tiny_resnet", ()): resnet_params(),
    ("tiny_resnet", ("width=8", "blocks=3", "classes=100")): resnet_params(width=8, blocks=3, classes=100),
}


@pytest.mark.parametrize("name,defines", list(HAND_COUNTS), ids=lambda v: "-".join(v) if isinstance(v, tuple) else v)
def test_params_equal_hand_count(cli, name: str, defines: tuple[str, ...]) -> None:
    args = ["check", MODELS / f"{name}.swp", "--json"] + [a for d in defines for a in ("-D", d)]
    code, out, err = cli(*args)
    assert code == 0, err
    info = json.loads(out)
    assert info["params"] == HAND_COUNTS[(name, defines)]
    assert info["param_bytes"] == 4 * info["params"]
    for key in ("model", "forward_ops", "tensors", "params", "param_bytes", "forward_flops"):
        assert key in info
    assert info["model"] == name


def test_hand_counts_are_the_published_small_figures() -> None:
    # sanity of the hand formulas themselves on well-known shapes
    assert mlp_params(784, 256, 2, 10) == 269_322
    assert conv_bn(64, 64, 3) == 36_992


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_golden_ir(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    _, graph = build_graph(f"stdlib/models/{name}.swp", [])
    text = print_graph(graph)
    golden = GOLDEN / f"{name}.ir"
    if UPDATE_GOLDEN:
        golden.write_text(text, encoding="utf-8")
    assert text == golden.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", SMALL_MODELS)
def test_printing_is_deterministic(name: str) -> None:
    texts = {print_graph(build_graph(str(MODELS / f"{name}.swp"), ["batch=3"])[1]) for _ in range(3)}
    assert len(texts) == 1


def test_defines_change_shapes(cli) -> None:
    code, out, _ = cli("check", MODELS / "mlp.swp", "--ir", "-D", "batch=7", "-D", "hidden=33")
    assert code == 0
    assert "x: f32[7,784]" in out
    assert "%0: f32[7,33] = matmul x layer0.dense.w" in out


def test_flops_of_mlp_by_hand(cli) -> None:
    _, out, _ = cli("check", MODELS / "mlp.swp", "--json", "-D", "depth=1")
    info = json.loads(out)
    b, f, h, c = 64, 784, 256, 10
    matmuls = 2 * b * f * h + 2 * b * h * c
    elementwise = b * h + b * h + b * c  # bias add, relu, bias add
    accuracy = b * c + b + b  # the report: argmax, ==, mean
    assert info["forward_flops"] == matmuls + elementwise + 6 * b * c + accuracy


def test_activation_peak_of_mlp_by_hand(cli) -> None:
    # matmul -> add -> relu -> matmul -> add -> xent with depth=1: at the first add, the
    # matmul output and the add output are both alive: 2 * 64*256*4 bytes.
    _, out, _ = cli("check", MODELS / "mlp.swp", "--json", "-D", "depth=1")
    assert json.loads(out)["activation_peak_bytes"] == 2 * 64 * 256 * 4


def test_human_summary(cli) -> None:
    code, out, _ = cli("check", MODELS / "tiny_resnet.swp")
    assert code == 0
    assert out.splitlines()[0].endswith(": ok")
    assert f"parameters       {resnet_params():,} in" in out


def test_param_names_are_scoped_and_readable() -> None:
    _, g = build_graph(str(MODELS / "tiny_resnet.swp"), [])
    assert "stage1.block0.res.downsample.conv.w" in g.params
    assert "stage2.block1.res.conv2.bn.scale" in g.params
    assert len(set(g.params)) == len(g.params)
