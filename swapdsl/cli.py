"""The `swapdsl` command line: it wires the pipeline's stages together."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from swapdsl import __version__
from swapdsl.analysis import summary
from swapdsl.elaborate import elaborate
from swapdsl.errors import SwpError
from swapdsl.ir import Graph
from swapdsl.ircheck import check_graph
from swapdsl.irprint import print_graph
from swapdsl.loader import Program, load
from swapdsl.units import format_bytes, format_count

EXIT_USER_ERROR = 2


def build_graph(path: str, defines: Sequence[str]) -> tuple[Program, Graph]:
    """Parse, resolve imports, elaborate and check: the front half of the pipeline."""
    program = load(path)
    graph = elaborate(program, parse_defines(defines))
    check_graph(graph)
    return program, graph


def parse_defines(defines: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for d in defines:
        key, sep, value = d.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SwpError(f"-D {d}: expected NAME=VALUE", hints=["e.g. -D batch=32"])
        out[key.strip()] = value.strip()
    return out


def _cmd_check(args: argparse.Namespace) -> int:
    _, graph = build_graph(args.file, args.define)
    if args.ir:
        sys.stdout.write(print_graph(graph))
        return 0
    info = summary(graph)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    arg_text = " ".join(f"{k}={v}" for k, v in info["args"].items()) or "(none)"
    rows = [
        ("arguments", arg_text),
        ("forward ops", str(info["forward_ops"])),
        ("tensors", str(info["tensors"])),
        ("inputs", f"{info['inputs']} ({format_bytes(info['input_bytes'])})"),
        ("parameters", f"{info['params']:,} in {info['param_tensors']} tensors ({format_bytes(info['param_bytes'])})"),
        ("forward FLOPs", format_count(info["forward_flops"], "FLOP")),
        ("activation peak", format_bytes(info["activation_peak_bytes"])),
        ("loss", f"{info['loss']}, {info['optimizer']}"),
    ]
    print(f"model {info['model']} ({args.file}): ok")
    for key, value in rows:
        print(f"  {key:<16} {value}")
    return 0


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="swapdsl", description="Train models larger than GPU memory.")
    p.add_argument("--version", action="version", version=f"swapdsl {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = sub.add_parser("check", help="parse and elaborate a .swp model, print its figures or IR")
    check.add_argument("file", metavar="FILE.swp")
    check.add_argument("-D", dest="define", action="append", default=[], metavar="NAME=VALUE",
                       help="override a model argument (repeatable)")
    out = check.add_mutually_exclusive_group()
    out.add_argument("--ir", action="store_true", help="print the forward IR")
    out.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    check.set_defaults(run=_cmd_check)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return args.run(args)
    except SwpError as err:
        print(err.render(), file=sys.stderr)
        return EXIT_USER_ERROR
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
