"""Single-line mutants of a plan file, and the verdict on each: refused cleanly, or trains exactly.

A mutant deletes, duplicates or swaps lines, changes one number, name or figure of one line, or repeats
a run as a `recompute` later in the program. Run
through ``swapdsl exec --check`` (in process), each must be either refused with exit code 2 and an
error that names a line of the plan, or accepted and train exactly like the reference executor; an
accepted mutant is run a second time with a slow simulated bus, so that a missing wait shows up as a
wrong number rather than as luck, and once with every kernel slowed down (a copy that does not wait for the
kernel writing its source); and its replay must order every two conflicting accesses (``races.py``: a
missing wait no timing showed).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable
from pathlib import Path

import attrs

from swapdsl.fuzz import run_cli
from swapdsl.fuzz.loopback import loopback_world
from swapdsl.fuzz.races import unordered


KINDS = ("delete", "duplicate", "swap", "number", "name", "figure", "update", "recompute")
VERDICTS = ("refused", "exact", "wrong", "crash", "unplaced")  # unplaced: exit 2 without naming a line
EXACT = 1e-6  # relative: planned execution is the reference's arithmetic, op for op
_NUMBER = re.compile(r"(?<![\w.\"])-?\d+(?![\w.])")
_FLOAT = re.compile(r"(?<![\w\"])-?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?(?![\w@+])")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


@attrs.frozen
class Mutant:
    kind: str
    line: int  # 1-based, the line changed (for a swap, the first of the two)
    text: str
    what: str  # the changed line as it reads now, or what was done


PROGRAM = ("run ", "recompute ", "swapin ", "swapout ", "free ", "host ")


def mutate(text: str, kind: str, rng: random.Random, focus: tuple[str, ...] = ()) -> Mutant | None:
    """One mutant of ``kind`` (None when this plan offers no such change at the drawn spot). ``focus``:
    change only lines that start so (e.g. ``PROGRAM``, the instructions), where there are any."""
    lines = text.splitlines()
    body = list(range(1, len(lines)))  # never the header line: a plan without it is not a plan at all
    focused = [k for k in body if lines[k].startswith(focus)] if focus else []
    i = rng.choice(focused or body)
    if kind == "delete":
        return Mutant(kind, i + 1, _join(lines[:i] + lines[i + 1:]), f"deleted: {lines[i]}")
    if kind == "duplicate":
        j = rng.choice(body)
        return Mutant(kind, j + 1, _join(lines[:j] + [lines[i]] + lines[j:]), f"copied before line {j + 1}: {lines[i]}")
    if kind == "swap":
        j = _near(i, body, rng)
        if lines[i] == lines[j]:
            return None
        out = list(lines)
        out[i], out[j] = out[j], out[i]
        return Mutant(kind, min(i, j) + 1, _join(out), f"swapped lines {i + 1} and {j + 1}")
    if kind == "update":
        return _swap_update_values(lines, rng)
    if kind == "recompute":  # a run repeated as a recomputation somewhere after it
        runs = [k for k in body if lines[k].startswith("run ")]
        if not runs:
            return None
        i = rng.choice(runs)
        j = rng.randrange(i + 1, len(lines) + 1)
        again = "recompute " + lines[i][len("run "):]
        return Mutant(kind, j + 1, _join(lines[:j] + [again] + lines[j:]), f"recomputed before line {j + 1}: {again}")
    changed = {"number": _new_number, "name": _new_name, "figure": _new_figure}[kind](lines[i], lines, rng)
    if changed is None or changed == lines[i]:
        return None
    return Mutant(kind, i + 1, _join(lines[:i] + [changed] + lines[i + 1:]), changed)


def mutate_members(text: str, rng: random.Random) -> Mutant | None:
    """A mutant of the bucket members on a data-parallel plan's ``ranks`` line (None: it has none): one
    number dropped, added, changed or swapped with another, or the list cut short or made odd."""
    lines = text.splitlines()
    k = next((k for k, line in enumerate(lines) if line.startswith("ranks ") and " members " in line), None)
    if k is None:
        return None
    head, _, tail = lines[k].partition(" members ")
    members = tail.split()
    i, j = rng.randrange(len(members)), rng.randrange(len(members))
    new = list(members)
    move = rng.choice(("drop", "add", "change", "swap", "cut", "odd"))
    if move == "drop":
        del new[i]
    elif move == "add":
        new.insert(i, str(rng.randrange(int(max(members, key=int)) + 2)))
    elif move == "change":
        new[i] = rng.choice([members[j], str(int(members[i]) + 1), "0", "-1", str(10**30), "9" * 5000])
    elif move == "swap":
        new[i], new[j] = new[j], new[i]
    elif move == "cut":
        new = new[: i]
    else:
        new[i] = rng.choice(["x", "1.5", "\"0\"", ""])
    changed = f"{head} members {' '.join(new)}".rstrip()
    if changed == lines[k]:
        return None
    return Mutant("members", k + 1, _join(lines[:k] + [changed] + lines[k + 1:]), f"{move}: {changed[:120]}")


def _join(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def _near(i: int, body: list[int], rng: random.Random) -> int:
    """Another line: a neighbour half the time (reorders instructions), anywhere otherwise."""
    if rng.random() < 0.5:
        return min(max(i + rng.choice((-3, -2, -1, 1, 2, 3)), body[0]), body[-1])
    return rng.choice(body)


def _swap_update_values(lines: list[str], rng: random.Random) -> Mutant | None:
    ups = [k for k, line in enumerate(lines) if line.startswith("update ")]
    if len(ups) < 2:
        return None
    a, b = rng.sample(ups, 2)
    va, vb = _STRING.findall(lines[a])[1], _STRING.findall(lines[b])[1]
    out = list(lines)
    out[a] = lines[a][: lines[a].rindex(va)] + vb
    out[b] = lines[b][: lines[b].rindex(vb)] + va
    return Mutant("update", min(a, b) + 1, _join(out), f"swapped the new values of lines {a + 1} and {b + 1}")


def _outside_strings(line: str, pattern: re.Pattern[str]) -> list[re.Match[str]]:
    spans = [m.span() for m in _STRING.finditer(line)]
    return [m for m in pattern.finditer(line) if not any(a <= m.start() < b for a, b in spans)]


def _replace_one(line: str, found: list[re.Match[str]], rng: random.Random,
                 choices: Callable[[str], list[str]]) -> str | None:
    """``line`` with one of the ``found`` matches replaced by one of ``choices(match text)``."""
    if not found:
        return None
    m = rng.choice(found)
    return line[: m.start()] + rng.choice(choices(m.group())) + line[m.end():]


def _new_number(line: str, lines: list[str], rng: random.Random) -> str | None:
    def choices(text: str) -> list[str]:
        v = int(text)
        other = [m.group() for m in _outside_strings(rng.choice(lines), _NUMBER)]  # a number of another line
        return [str(n) for n in (v + 1, v - 1, v + 256, v - 256, 0, -1, 2 * v, v // 2, 10**30, -(10**30))] \
            + other[:1] + ["9" * 5000]

    return _replace_one(line, _outside_strings(line, _NUMBER), rng, choices)


def _new_name(line: str, lines: list[str], rng: random.Random) -> str | None:
    names = [n for ln in lines if ln.startswith("tensor ") for n in _STRING.findall(ln)[:1]]
    odd = [json.dumps(x) for x in ("x", "", "%", "\u00e9")] + ['"\\q"']  # the last is a bad escape
    return _replace_one(line, list(_STRING.finditer(line)), rng,
                        lambda _: [rng.choice(names)] if names and rng.random() < 0.8 else odd)


def _new_figure(line: str, lines: list[str], rng: random.Random) -> str | None:
    def choices(text: str) -> list[str]:
        v = float(text)
        return [repr(v * 10), repr(v / 10), "0.0", "-1.0", "1e308", "1e999", "-1e999", repr(v + 0.5)]

    return _replace_one(line, _outside_strings(line, _FLOAT), rng, choices)


# ---- verdicts -----------------------------------------------------------------------------------


@attrs.frozen
class Verdict:
    verdict: str  # one of VERDICTS
    detail: str = ""


def judge(mutant: Mutant, folder: Path, slow_s: float = 0.002) -> Verdict:
    """Run ``swapdsl exec --check`` on the mutant (written into ``folder``, beside its model)."""
    path = folder / "mutant.plan"
    path.write_text(mutant.text, encoding="utf-8")
    with loopback_world(mutant.text):  # (a data-parallel plan's ranks, all this process)
        return _judged(path, slow_s)


def _judged(path: Path, slow_s: float) -> Verdict:
    run = run_cli(["exec", str(path), "--steps", "2", "--check", "--json", "--backend", "numpy"])
    if run.code is None:
        return Verdict("crash", run.crash)
    if run.code == 2:
        named = f" --> {path}:" in run.err
        return Verdict("refused" if named else "unplaced", run.err.splitlines()[0])
    if run.code != 0:
        return Verdict("crash", f"exit {run.code}: {run.err[-500:]}")
    diff = json.loads(run.out)["max_rel_diff"]
    if diff > EXACT:
        return Verdict("wrong", f"max rel diff {diff:.3g}")
    for copy_s, kernel_s, what in ((slow_s, 0.0, "a slow bus"), (0.0, slow_s, "slow kernels")):
        slow = _delayed_diff(path, copy_s, kernel_s)
        if slow > EXACT:
            return Verdict("wrong", f"max rel diff {slow:.3g} on {what}")
    from swapdsl import api

    races = unordered(api.read_checked(str(path), need_model=True)[0])  # (what no timing showed, if any)
    return Verdict("wrong", f"unordered accesses: {races[0]}") if races else Verdict("exact")


def _delayed_diff(path: Path, copy_delay_s: float, kernel_delay_s: float) -> float:
    """The plan run once more with every copy or every kernel slowed down, against the reference."""
    from swapdsl import api

    run = api.execute_plan(*api.read_checked(str(path), need_model=True), steps=1, backend="numpy", check=True,
                           copy_delay_s=copy_delay_s, kernel_delay_s=kernel_delay_s)
    assert run.max_rel_diff is not None
    return run.max_rel_diff


def campaign(plans: dict[str, str], folder: Path, cases: int, seed: int,
             on_case: Callable[[str, Mutant, Verdict], None] | None = None,
             kinds: tuple[str, ...] = KINDS) -> dict[str, dict[str, int]]:
    """``cases`` mutants spread over ``plans`` (name -> text, each plan's model in ``folder``) and
    ``kinds``; returns the count of each verdict per kind."""
    rng = random.Random(seed)
    counts = {k: dict.fromkeys(VERDICTS, 0) for k in kinds}
    names = sorted(plans)
    n = misses = 0
    while n < cases:
        name, kind = names[n % len(names)], kinds[(n // len(names)) % len(kinds)]
        mutant = mutate(plans[name], kind, rng)
        if mutant is None:
            misses += 1
            if misses > 100 * (cases + 1):
                raise RuntimeError(f"the plans offer no `{kind}` mutants")
            continue
        verdict = judge(mutant, folder)
        counts[kind][verdict.verdict] += 1
        if on_case is not None:
            on_case(name, mutant, verdict)
        n += 1
    return counts
