"""Single-line mutants of real plans through `swapdsl exec --check`: refused with the line named, or exact.

Usage: python bench/mutate_plans.py [--cases 1000] [--seed 0] [--keep DIR]

Makes nine plans (belady, capuchin and ga, on small tiny_resnet and tiny_transformer configurations, each
under about a third of its no-swap need, or near its smallest feasible cap where that is more; a bf16
belady plan of tiny_transformer with every update on the host, a capuchin plan of tiny_resnet for two
data-parallel ranks, run in a loopback world: swapdsl/fuzz/loopback.py, and the exact planner's plan of
the MLP near its smallest feasible cap), then
runs CASES mutants spread over the plans and the mutation kinds (delete, duplicate or swap lines;
change a number, a name, a figure; swap the new values of two updates). Each is judged as `swapdsl exec MUTANT --check` judges it, in process, and
an accepted mutant once more on a slow bus. Prints the counts per kind and every case that was
neither refused with its line named nor exact; exits 1 if there was one.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from swapdsl.common.paths import STDLIB_DIR
from swapdsl.fuzz import run_cli
from swapdsl.fuzz.plans import KINDS, Mutant, VERDICTS, Verdict, campaign

MODELS = {"tiny_resnet": ("430KiB", ["-D", "batch=4", "-D", "width=4", "-D", "blocks=1"]),
          "tiny_transformer": ("2.2MiB", ["-D", "batch=2", "-D", "seq=8"])}


def make_plans(folder: Path, seed: int) -> dict[str, str]:
    """The base plans, made from inside FOLDER so that each names its model by file name alone: the same
    seed gives the same plans, and so the same mutants, wherever the folder is."""
    with contextlib.chdir(folder):
        return _plan_here(seed)


def _plan_here(seed: int) -> dict[str, str]:
    folder, texts = Path("."), {}
    for model, (cap, args) in MODELS.items():
        shutil.copy(Path(STDLIB_DIR) / "models" / f"{model}.swp", folder / f"{model}.swp")
        for method in ("belady", "capuchin", "ga"):
            out = folder / f"{model}-{method}.plan"
            search = ["--generations", "30", "--workers", "1", "--seed", str(seed)] if method == "ga" else []
            run = run_cli(["optimize", str(folder / f"{model}.swp"), "--memory", cap, "--method", method, *args,
                           *search, "-o", str(out)])
            if run.code != 0:
                sys.exit(f"could not plan {model} with {method}: {run.err or run.crash}")
            texts[out.stem] = out.read_text()
    # a bf16 plan with every update on the host: host runs, their waits and the refreshed weights
    model, (cap, args) = "tiny_transformer", MODELS["tiny_transformer"]
    out = folder / f"{model}-host.plan"
    run = run_cli(["optimize", str(folder / f"{model}.swp"), "--memory", "2.6MiB", "--method", "belady", *args,
                   "--precision", "bf16", "--host-updates", "all", "-o", str(out)])
    if run.code != 0:
        sys.exit(f"could not plan {model} with updates on the host: {run.err or run.crash}")
    texts[out.stem] = out.read_text()
    # a plan for two data-parallel ranks: all-reduces on the network lane (run in a loopback world)
    model, (cap, args) = "tiny_resnet", MODELS["tiny_resnet"]
    out = folder / f"{model}-ranks.plan"
    run = run_cli(["optimize", str(folder / f"{model}.swp"), "--memory", cap, "--method", "capuchin", *args,
                   "--ranks", "2", "--network", "1", "-o", str(out)])
    if run.code != 0:
        sys.exit(f"could not plan {model} for two ranks: {run.err or run.crash}")
    texts[out.stem] = out.read_text()
    # the exact planner's plan of the MLP near its smallest feasible cap: a phased program's segments
    shutil.copy(Path(STDLIB_DIR) / "models" / "mlp.swp", folder / "mlp.swp")
    out = folder / "mlp-exact.plan"
    run = run_cli(["optimize", str(folder / "mlp.swp"), "--memory", "2.7MiB", "--method", "exact", "--budget", "30",
                   "-o", str(out)])
    if run.code != 0:
        sys.exit(f"could not plan mlp with exact: {run.err or run.crash}")
    texts[out.stem] = out.read_text()
    return texts


def _statement(m: Mutant) -> str:
    """The kind of statement a mutant changed (its first word), or for a swap, of both lines."""
    if m.kind == "swap":
        i, j = (int(w) for w in m.what.split() if w.isdigit())
        lines = m.text.splitlines()
        return " / ".join(sorted({lines[i - 1].split()[0], lines[j - 1].split()[0]}))
    text = m.what.split(": ", 1)[1] if m.kind in ("delete", "duplicate") else m.what
    words = text.split()
    return " ".join(words[:1] + [w for w in words[1:2] if w in ("ms",)]) if words else "(empty)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", metavar="DIR", help="work in DIR (kept) rather than a temporary folder")
    args = ap.parse_args()
    folder = Path(args.keep or tempfile.mkdtemp(prefix="swapdsl-mutants-"))
    folder.mkdir(parents=True, exist_ok=True)
    bad: list[str] = []

    exact: collections.Counter[str] = collections.Counter()

    def note(name: str, mutant: Mutant, verdict: Verdict) -> None:
        if verdict.verdict == "exact":
            exact[f"{mutant.kind}: {_statement(mutant)}"] += 1
        if verdict.verdict not in ("refused", "exact"):
            bad.append(f"{name} line {mutant.line} [{mutant.kind}] {mutant.what[:140]}\n    -> {verdict.verdict}: "
                       f"{verdict.detail}")
            print(bad[-1], flush=True)

    started = time.perf_counter()
    plans = make_plans(folder, args.seed)
    counts = campaign(plans, folder, args.cases, args.seed, note)
    seconds = time.perf_counter() - started
    print(f"\n{args.cases} mutants of {len(plans)} plans in {seconds:.0f} s (seed {args.seed})\n")
    print(f"| kind | {' | '.join(VERDICTS)} |\n|---|{'---:|' * len(VERDICTS)}")
    for kind in KINDS:
        print(f"| {kind} | {' | '.join(str(counts[kind][v]) for v in VERDICTS)} |")
    total = {v: sum(counts[k][v] for k in KINDS) for v in VERDICTS}
    print(f"| all | {' | '.join(str(total[v]) for v in VERDICTS)} |")
    print("\naccepted and exact, by what was changed:")
    for what, n in exact.most_common():
        print(f"  {n:>4}  {what}")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
