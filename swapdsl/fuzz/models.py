"""Mutated model files through `swapdsl check --training`: a clean verdict for each, in bounded time.

A case takes a stdlib model (and, one time in five, the stdlib's ``layers.swp`` it imports) and
applies one mutation: an edit of characters, tokens or lines; an odd number (huge, negative,
infinite, tiny); deep nesting (brackets, calls, unary operators); or a very long line. Run in
process, each must end with exit code 0, or exit code 2 and an error placed at a file position;
never a traceback, never a hang (``TIME_LIMIT_S``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path

import attrs

from swapdsl.common.paths import STDLIB_DIR
from swapdsl.fuzz import run_cli

KINDS = ("char", "token", "line", "number", "nesting", "long")
VERDICTS = ("ok", "refused", "unplaced", "crash", "hang")  # unplaced: exit 2 without a file position
TIME_LIMIT_S = 10.0
SMALL = ("mlp", "tiny_transformer", "tiny_resnet")
_TOKEN = re.compile(r'\s+|\w+|"[^"\n]*"|\*\*|//|==|!=|<=|>=|.', re.S)
_NUMBER = re.compile(r"(?<![\w.])\d+(\.\d*)?([eE][-+]?\d+)?(?![\w.])")
_ALPHABET = "()[]{},:=+-*/@%.<>!#\"\n 019_aexz"
_TOKENS = ["(", ")", "[", "]", "{", "}", ",", ":", "=", "+", "-", "*", "**", "/", "//", "@", ".", "==", "not",
           "and", "if", "else", "for", "in", "def", "model", "return", "input", "param", "minimize", "with",
           "import", "true", "0", "1", "-1", "1e999", "x", "relu", "range", "report", "argmax", "<", ">=", "\n"]
_ODD = ["0", "-1", "1e999", "1e-400", "99999999999999999999999999", "9223372036854775808", "2147483648",
        "1e26", "100000", "3.5", "0.0", "10 ** 10 ** 10", "(0 - 1)", "1e308 * 10"]


@attrs.frozen
class Case:
    kind: str
    file: str  # which file was mutated
    what: str  # the mutation, in words
    files: dict[str, str] = attrs.field(hash=False)  # file name -> text (the model is model.swp)


def seeds(models: tuple[str, ...] = SMALL) -> dict[str, dict[str, str]]:
    """The unmutated cases: each model file with the stdlib layers beside it."""
    layers = (Path(STDLIB_DIR) / "layers.swp").read_text(encoding="utf-8")
    return {m: {"model.swp": (Path(STDLIB_DIR) / "models" / f"{m}.swp").read_text(encoding="utf-8"),
                "layers.swp": layers} for m in models}


def mutate(files: dict[str, str], kind: str, rng: random.Random) -> Case:
    name = "layers.swp" if rng.random() < 0.2 else "model.swp"
    text, what = _MUTATIONS[kind](files[name], rng)
    return Case(kind, name, what, {**files, name: text})


def _char(text: str, rng: random.Random) -> tuple[str, str]:
    i = rng.randrange(len(text) + 1)
    c = rng.choice(_ALPHABET)
    op = rng.choice(["delete", "insert", "replace"])
    if op == "delete" or (op == "replace" and i < len(text)):
        tail = text[i + 1:]
    else:
        tail = text[i:]
    return text[:i] + ("" if op == "delete" else c) + tail, f"{op} {c!r} at {i}"


def _token(text: str, rng: random.Random) -> tuple[str, str]:
    toks = _TOKEN.findall(text)
    words = [k for k, t in enumerate(toks) if not t.isspace()]
    i, j = rng.choice(words), rng.choice(words)
    op = rng.choice(["delete", "duplicate", "swap", "replace"])
    if op == "delete":
        toks[i] = ""
    elif op == "duplicate":
        toks[i] = toks[i] + " " + toks[i]
    elif op == "swap":
        toks[i], toks[j] = toks[j], toks[i]
    else:
        toks[i] = rng.choice(_TOKENS + [toks[j]])
    return "".join(toks), f"{op} token {i}"


def _line(text: str, rng: random.Random) -> tuple[str, str]:
    lines = text.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    op = rng.choice(["delete", "duplicate", "swap"])
    if op == "delete":
        del lines[i]
    elif op == "duplicate":
        lines.insert(j, lines[i])
    else:
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines), f"{op} line {i + 1}"


def _number(text: str, rng: random.Random) -> tuple[str, str]:
    found = list(_NUMBER.finditer(text))
    if not found:
        return _char(text, rng)
    m, new = rng.choice(found), rng.choice(_ODD)
    return text[:m.start()] + new + text[m.end():], f"number at {m.start()} -> {new}"


def _expression_spot(text: str, rng: random.Random) -> int:
    """A place where an expression starts: just after `= ` of an assignment (or anywhere, failing that)."""
    spots = [m.end() for m in re.finditer(r"\w = ", text)]
    return rng.choice(spots) if spots else rng.randrange(len(text) + 1)


def _nesting(text: str, rng: random.Random) -> tuple[str, str]:
    n = rng.choice([10, 99, 100, 101, 250, 1000, 5000])
    opener, closer = rng.choice([("(", ")"), ("relu(", ")"), ("[", "]"), ("-", ""), ("not ", ""), ("if true {\n", "}\n")])
    i = _expression_spot(text, rng)
    j = text.find("\n", i)
    j = len(text) if j < 0 else j
    return text[:i] + opener * n + text[i:j] + closer * n + text[j:], f"{n} x {opener!r} at {i}"


def _long(text: str, rng: random.Random) -> tuple[str, str]:
    n = rng.choice([1_000, 10_000, 100_000, 250_000])
    i = _expression_spot(text, rng)
    j = text.find("\n", i)
    j = len(text) if j < 0 else j
    form = rng.choice(["sum", "comment", "name"])
    if form == "sum":  # the expression, added to itself n times
        expr = text[i:j]
        return text[:i] + " + ".join([f"({expr})"] * n) + text[j:], f"a sum of {n} terms at {i}"
    if form == "comment":
        return text[:j] + " #" + "x" * (4 * n) + text[j:], f"a comment of {4 * n} characters at {j}"
    return text[:i] + "y" * (4 * n) + text[j:], f"a name of {4 * n} characters at {i}"


_MUTATIONS: dict[str, Callable[[str, random.Random], tuple[str, str]]] = {
    "char": _char, "token": _token, "line": _line, "number": _number, "nesting": _nesting, "long": _long,
}


# ---- verdicts -----------------------------------------------------------------------------------


@attrs.frozen
class Verdict:
    verdict: str  # one of VERDICTS
    detail: str = ""


def judge(case: Case, folder: Path, limit_s: float = TIME_LIMIT_S) -> Verdict:
    """``swapdsl check model.swp --training`` on the case, written into ``folder``, in process."""
    for name, text in case.files.items():
        (folder / name).write_text(text, encoding="utf-8")
    run = run_cli(["check", str(folder / "model.swp"), "--training"], limit_s)
    if run.crash == "hang":
        return Verdict("hang", f"over {limit_s:.0f} s")
    if run.code is None:
        return Verdict("crash", run.crash)
    first = (run.err.splitlines() or [""])[0]
    if run.code == 0:
        return Verdict("ok")
    if run.code == 2:
        return Verdict("refused" if run.placed else "unplaced", first)
    return Verdict("crash", f"exit {run.code}: {first}")


def case_of(seed: int, index: int, sources: dict[str, dict[str, str]]) -> tuple[str, Case]:
    """Case ``index`` of a run seeded ``seed``: the same pair gives the same case on any machine."""
    rng = random.Random(f"{seed}:{index}")
    model = sorted(sources)[index % len(sources)]
    return model, mutate(sources[model], KINDS[(index // len(sources)) % len(KINDS)], rng)
