"""Parse + elaborate time of generated deep models (issue: 200 layers in under 2 s).

Usage: python bench/parse_scaling.py [--layers 200 400 800] [--repeat 5]

Two shapes of program per depth: "unrolled" writes every layer as its own
statements (the parser's worst case), "loop" builds the same graph with a
`for` loop over a stdlib block (the elaborator's worst case: scopes, calls).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from swapdsl.graph.checker import check_graph
from swapdsl.lang.elaborate import elaborate
from swapdsl.lang.loader import load


def unrolled(layers: int) -> str:
    lines = ["model deep(batch = 32, width = 256) {",
             "    input x: f32[batch, width]", "    input y: i32[batch]", "    h = x"]
    for i in range(layers):
        lines += [f"    param w{i}: [width, width] = xavier", f"    param b{i}: [width] = zeros",
                  f"    param s{i}: [width] = ones", f"    param t{i}: [width] = zeros",
                  f"    h = relu(layer_norm(h @ w{i} + b{i}, s{i}, t{i}))"]
    lines += ["    param head: [width, 10] = xavier",
              "    loss = softmax_cross_entropy(h @ head, y)",
              "    minimize loss with adam(lr = 1e-3)", "}", ""]
    return "\n".join(lines)


def looped(layers: int) -> str:
    return f"""import layers

model deep(batch = 32, seq = 16, width = 256, depth = {layers}) {{
    input x: f32[batch, seq, width]
    input y: i32[batch, seq]
    h = x
    for layer in range(depth) {{
        h = transformer_block(h, 4, 4 * width)
    }}
    loss = softmax_cross_entropy(dense(h, 10) as head, y)
    minimize loss with adam(lr = 1e-3)
}}
"""


def time_once(path: Path) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    program = load(path)
    t1 = time.perf_counter()
    graph = elaborate(program)
    check_graph(graph)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(graph.ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="+", default=[200, 400, 800])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"{'program':<10} {'layers':>6} {'lines':>6} {'ops':>6} {'parse s':>8} {'elab s':>8} {'total s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        load_warm = Path(tmp) / "warm.swp"
        load_warm.write_text(looped(1))
        time_once(load_warm)  # build the parser once, as a CLI run would before timing matters
        for layers in args.layers:
            for kind, gen in (("unrolled", unrolled), ("loop", looped)):
                path = Path(tmp) / f"{kind}{layers}.swp"
                text = gen(layers)
                path.write_text(text)
                runs = [time_once(path) for _ in range(args.repeat)]
                p = statistics.median(r[0] for r in runs)
                e = statistics.median(r[1] for r in runs)
                print(f"{kind:<10} {layers:>6} {text.count(chr(10)):>6} {runs[0][2]:>6} {p:>8.3f} {e:>8.3f} {p + e:>8.3f}")


if __name__ == "__main__":
    main()
