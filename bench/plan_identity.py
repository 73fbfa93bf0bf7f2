"""Are the plans byte for byte what they were? A guard for changes that must not change behaviour.

Usage:
  python bench/plan_identity.py --record bench/plan_digests.json    # at the commit you trust
  python bench/plan_identity.py --against bench/plan_digests.json   # after the change: exit 1 on any difference

Every zoo model is planned under `lru`, `vdnn`, `belady` and `ga --generations 20 --seed 1` at ratio 4
(the cap is the model's no-swap arena / 4) (1.5 where 4 is below the model's smallest feasible cap)
on the default device, through the command line only, so the
script runs unchanged on either side of a refactor. The plan files' SHA-256 digests are compared;
`--keep DIR` leaves the plans there to diff. `--searches` plans ``SEARCHES`` instead: the searches among
requests (`--bucket-mib`, `--host-updates` and `--microbatches auto`, data-parallel), about 40 s.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("resnet", "wide_resnet", "vgg", "inception_v4", "nasnet", "lstm_lm", "bert", "gpt")
METHODS = {"lru": [], "vdnn": [], "belady": [],
           "ga": ["--generations", "20", "--seed", "1", "--budget", "100000"]}
RATIOS = (4, 1.5)  # 1.5 only where 4 is refused
DEVICE = "v100-16gb"


_XL = ["stdlib/models/gpt.swp", "-D", "layers=48", "-D", "hidden=1600", "-D", "heads=25", "-D", "batch=1",
       "--precision", "bf16", "--device", "h100-80gb", "--memory", "8GiB"]
_GA = ["--method", "ga", "--generations", "6", "--budget", "100000", "--seed", "2"]
SEARCHES = {  # plan name -> optimize's arguments
    "gpt2_xl.buckets": [*_XL, "--method", "belady", "--ranks", "8", "--bucket-mib", "auto"],
    "gpt2_xl.host": [*_XL, "--method", "belady", "--host-updates", "auto"],
    "gpt2.buckets_host": ["stdlib/models/gpt.swp", "-D", "batch=8", "--precision", "bf16", "--device", "h100-80gb",
                          "--memory", "2GiB", "--method", "belady", "--ranks", "8", "--network", "25",
                          "--bucket-mib", "auto", "--host-updates", "auto"],
    **{f"{m}.{how}": [f"stdlib/models/{m}.swp", "--memory", "1/3", "--ranks", "2", "--bucket-mib", "auto", *extra]
       for m in ("mlp", "tiny_transformer", "tiny_resnet")
       for how, extra in (("vdnn", ["--method", "vdnn", "--host-updates", "auto"]),
                          ("ga", [*_GA, "--host-updates", "auto"]),
                          ("microbatches", ["--method", "belady", "--microbatches", "auto"]))},
}


def swapdsl(*argv: str, refusal_ok: bool = False) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "swapdsl", *argv], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0 and not (refusal_ok and done.returncode == 2):
        raise SystemExit(f"swapdsl {' '.join(argv)} failed ({done.returncode}):\n{done.stderr}")
    return done


def no_swap_bytes(model: str) -> int:
    figures = json.loads(swapdsl("optimize", model, "--memory", "1024TiB", "--method", "lru", "--device", DEVICE,
                                 "--json").stdout)
    return int(figures["no_swap_bytes"])


def digests(out: Path) -> dict[str, str]:
    """Each plan's digest; where the cap is refused (below the model's smallest feasible cap), the refusal's
    digest, and the model is planned again at ratio FALLBACK."""
    found = {}
    for name in MODELS:
        model = f"stdlib/models/{name}.swp"
        no_swap = no_swap_bytes(model)
        for ratio in RATIOS:
            refused = False
            for method, extra in METHODS.items():
                path = out / f"{name}.{ratio:g}.{method}.plan"
                done = swapdsl("optimize", model, "--memory", str(int(no_swap / ratio)), "--method", method,
                               "--device", DEVICE, *extra, "-o", str(path), refusal_ok=True)
                refused = done.returncode != 0
                what = done.stderr.encode() if refused else path.read_bytes()
                found[path.name] = hashlib.sha256(what).hexdigest()
                print(f"{path.name:<36} {'refused ' if refused else ''}{found[path.name][:16]}", flush=True)
            if not refused:
                break
    return found


def searched(out: Path) -> dict[str, str]:
    """Each of ``SEARCHES``' plans' digests (a refusal's: its message's)."""
    found = {}
    for name, argv in SEARCHES.items():
        path = out / f"{name}.plan"
        done = swapdsl("optimize", *argv, "-o", str(path), refusal_ok=True)
        refused = done.returncode != 0
        found[path.name] = hashlib.sha256(done.stderr.encode() if refused else path.read_bytes()).hexdigest()
        print(f"{path.name:<36} {'refused ' if refused else ''}{found[path.name][:16]}", flush=True)
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", metavar="FILE.json", help="write the digests here")
    mode.add_argument("--against", metavar="FILE.json", help="compare with digests recorded earlier")
    ap.add_argument("--keep", metavar="DIR", help="leave the plan files here")
    ap.add_argument("--searches", action="store_true", help="plan SEARCHES instead of the zoo")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.keep or tmp)
        out.mkdir(parents=True, exist_ok=True)
        found = (searched if args.searches else digests)(out.resolve())
    if args.record:
        Path(args.record).write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
        return 0
    want = json.loads(Path(args.against).read_text())
    differ = sorted(k for k in want.keys() | found.keys() if want.get(k) != found.get(k))
    for name in differ:
        print(f"DIFFERS {name}: recorded {want.get(name, '-')[:16]}, now {found.get(name, '-')[:16]}")
    print(f"{len(found) - len(differ)} of {len(want)} plans identical")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
