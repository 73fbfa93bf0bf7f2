"""Repeated modules folded into `def`s. The lines one module of the exported model wrote (its scope, from
the exporter's node names) are a block; blocks that read alike but for their names and some integers
(channel counts, strides) become one `def` that takes the differing integers as arguments, called once per
module (`layer2_1 = bottleneck(layer2_0, 128, 512) as layer2_1`), so each parameter is named by its
module, dotted (`layer2_1.conv1_weight`)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import attrs

from swapdsl.importer.context import RESERVED, readable

_TOKEN = re.compile(r'"[^"]*"|\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+|\d+|[A-Za-z_]\w*|\s+|.')
_PARAM = re.compile(r"param (\w+): (.*?) = (.*?)( frozen)?")
_ASSIGN = re.compile(r"(\w+(?:, \w+)*,?) = (.*)")
MIN_OPS = 3  # a module of fewer op lines (a lone conv and its weight) stays inline


@attrs.frozen
class Stmt:
    """One line, cut into tokens: what it defines, and the text after `=` (a param's shape) as tokens."""

    defines: tuple[str, ...]
    tokens: tuple[str, ...]
    init: str = ""  # a param's initialiser and `frozen`: the first call's, in a def
    is_param: bool = False
    tuple_lhs: bool = False  # `a, = split(...)`


@attrs.frozen
class Block:
    """One module's run of lines [start, stop), the names it reads and those read after it."""

    scope: tuple[str, ...]
    start: int
    stop: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    key: tuple[object, ...]  # the lines with names by position, integers as `#`: equal keys, one def
    ints: tuple[int, ...]


@attrs.frozen
class Folded:
    defs: tuple[str, ...]  # lines before the model
    body: tuple[str, ...]  # the model's lines, a call where a block was
    renamed: dict[str, str]  # a folded parameter's flat name -> its name in the module's scope
    after: tuple[str, ...] = ()  # the lines after the body, reading the blocks' results by their new names


def parse(line: str) -> Stmt:
    m = _PARAM.fullmatch(line)
    if m:
        return Stmt((m.group(1),), tuple(_TOKEN.findall(m.group(2))), f"{m.group(3)}{m.group(4) or ''}", True)
    m = _ASSIGN.fullmatch(line)
    if not m:
        raise ValueError(f"not a line the importer writes: {line[:80]}")
    lhs = m.group(1)
    return Stmt(tuple(n.strip(",") for n in lhs.split(", ") if n.strip(",")), tuple(_TOKEN.findall(m.group(2))),
                tuple_lhs=lhs.endswith(","))


def refs(s: Stmt, names: set[str]) -> list[str]:
    """The model's names ``s`` reads (not an argument's keyword: `axis = 1`)."""
    out = []
    for k, t in enumerate(s.tokens):
        if t in names and not _keyword(s.tokens, k):
            out.append(t)
    return out


def _keyword(tokens: Sequence[str], k: int) -> bool:
    rest = [t for t in tokens[k + 1:k + 6] if not t.isspace()][:2]
    return len(rest) == 2 and rest[0] == "=" and rest[1] != "="


def fold(lines: Sequence[str], scopes: Sequence[tuple[str, ...]], classes: Mapping[tuple[str, ...], str],
         after: Sequence[str], sizes: Sequence[str], known: Sequence[str], enabled: bool = True) -> Folded:
    """``lines`` (the model's params and assignments; ``scopes``, the module each came from) with repeated
    blocks as defs. ``after``: the lines that follow and read some of them (outputs, the loss); ``sizes``:
    the model's size arguments; ``known``: the names defined before (inputs); ``classes``: a scope's
    module class, where the exporter says (the def's name). Not ``enabled``: the lines as they are."""
    if not enabled:
        return Folded((), tuple(lines), {}, tuple(after))
    lines, scopes = _hoist([parse(line) for line in lines], lines, scopes, set(known))
    stmts = [parse(line) for line in lines]
    names = set(known) | {n for s in stmts for n in s.defines}
    last_read: dict[str, int] = {}
    for i, s in enumerate(stmts):
        last_read.update((n, i) for n in refs(s, names))
    for line in after:
        last_read.update((t, len(lines)) for t in _TOKEN.findall(line) if t in names)
    blocks = [_block(stmts, scope, span, names, last_read) for scope, span in _runs(scopes).items()]
    chosen = _choose([b for b in blocks if b is not None])
    return _emit(lines, stmts, chosen, classes, list(sizes), names, after)


def _hoist(stmts: Sequence[Stmt], lines: Sequence[str], scopes: Sequence[tuple[str, ...]],
           known: set[str]) -> tuple[list[str], list[tuple[str, ...]]]:
    """Parameters that modules share (rotary tables, a mask, a tied table) declared first, outside them,
    so that the modules that read them read alike."""
    names = known | {n for s in stmts for n in s.defines}
    readers: dict[str, set[tuple[str, ...]]] = {}
    for s, scope in zip(stmts, scopes):
        for n in refs(s, names):
            readers.setdefault(n, set()).add(scope)
    shared = [k for k, s in enumerate(stmts) if s.is_param and len(readers.get(s.defines[0], ())) > 1]
    hoisted = set(shared)
    rest = [k for k in range(len(stmts)) if k not in hoisted]
    return [lines[k] for k in shared + rest], [()] * len(shared) + [scopes[k] for k in rest]


def _runs(scopes: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], tuple[int, int]]:
    """Each module whose lines are consecutive: its span; of modules with one span, the innermost."""
    at: dict[tuple[str, ...], list[int]] = {}
    for i, scope in enumerate(scopes):
        for k in range(1, len(scope) + 1):
            at.setdefault(scope[:k], []).append(i)
    spans: dict[tuple[int, int], tuple[str, ...]] = {}
    for scope, ix in at.items():
        if ix[-1] - ix[0] + 1 == len(ix) and len(scope) >= len(spans.get((ix[0], ix[-1] + 1), ())):
            spans[(ix[0], ix[-1] + 1)] = scope
    return {scope: span for span, scope in spans.items()}


def _block(stmts: Sequence[Stmt], scope: tuple[str, ...], span: tuple[int, int], names: set[str],
           last_read: Mapping[str, int]) -> Block | None:
    start, stop = span
    run = stmts[start:stop]
    if sum(not s.is_param for s in run) < MIN_OPS:
        return None
    local: dict[str, int] = {}
    inputs: list[str] = []
    key: list[object] = []
    ints: list[int] = []
    for s in run:
        toks: list[object] = []
        for k, t in enumerate(s.tokens):
            if t in names and not _keyword(s.tokens, k):
                if t not in local and t not in inputs:
                    inputs.append(t)
                toks.append(("v", local[t]) if t in local else ("i", inputs.index(t)))
            elif t.isdigit():
                toks.append("#")
                ints.append(int(t))
            else:
                toks.append(t)
        local.update((d, len(local)) for d in s.defines)
        # a frozen parameter's initialiser (a constant the graph computes) must be every call's
        key.append((s.is_param, s.init if s.init.endswith(" frozen") else "", len(s.defines), tuple(toks)))
    outputs = tuple(d for s in run for d in s.defines if last_read.get(d, -1) >= stop)
    if not outputs:
        return None
    return Block(scope, start, stop, tuple(inputs), outputs,
                 (tuple(key), tuple(local[o] for o in outputs), len(inputs)), tuple(ints))


def _choose(blocks: Sequence[Block]) -> list[list[Block]]:
    """Classes of equal blocks, the largest blocks first; a block inside one already taken stays there."""
    classes: dict[tuple[object, ...], list[Block]] = {}
    for b in sorted(blocks, key=lambda b: b.start):
        classes.setdefault(b.key, []).append(b)
    taken: set[int] = set()
    chosen = []
    for bs in sorted(classes.values(), key=lambda bs: (bs[0].start - bs[0].stop, bs[0].start)):
        free = [b for b in bs if not taken.intersection(range(b.start, b.stop))]
        if len(free) >= 2:
            taken.update(i for b in free for i in range(b.start, b.stop))
            chosen.append(free)
    return sorted(chosen, key=lambda bs: bs[0].start)


def _emit(lines: Sequence[str], stmts: Sequence[Stmt], chosen: Sequence[list[Block]],
          classes: Mapping[tuple[str, ...], str], sizes: Sequence[str], names: set[str],
          after: Sequence[str]) -> Folded:
    used = set(names) | set(RESERVED) | set(sizes)
    calls: set[str] = set(RESERVED)
    defs: list[str] = []
    body = list(lines)
    renamed: dict[str, str] = {}
    for bs in chosen:
        name = _fresh(_snake(classes.get(bs[0].scope, "block")), used)
        text, call_lines, names_of = _define(name, bs, stmts, sizes, calls)
        defs += text + [""]
        for b, call in zip(bs, call_lines):
            body[b.start:b.stop] = [call] + [None] * (b.stop - b.start - 1)  # type: ignore[list-item]
        renamed.update(names_of)
    inside = {i for bs in chosen for b in bs for i in range(b.start, b.stop)}
    left = {d for i, s in enumerate(stmts) if i not in inside for d in s.defines}
    values = {b.outputs[0]: line.rsplit(" as ", 1)[1] for bs in chosen for b in bs
              for line in [body[b.start]] if len(b.outputs) == 1}  # type: ignore[index]
    values = {old: new for old, new in values.items() if new not in left and new not in values}
    lines = [_rename(line, values) for line in body if line is not None]
    return Folded(tuple(defs), tuple(lines), renamed, tuple(_rename(line, values) for line in after))


def _rename(line: str, names: Mapping[str, str]) -> str:
    """``line`` with each model name in ``names`` (a block's result) named as its call (`layer2_1`)."""
    m = _ASSIGN.fullmatch(line)
    lhs, rhs = (re.sub(r"\w+", lambda n: names.get(n.group(), n.group()), m.group(1)) + " = ", m.group(2)) if m \
        else ("", line)
    tokens = _TOKEN.findall(rhs)
    return lhs + "".join(names[t] if t in names and not _keyword(tokens, k) else t for k, t in enumerate(tokens))


def _define(name: str, bs: Sequence[Block], stmts: Sequence[Stmt], sizes: Sequence[str],
            calls: set[str]) -> tuple[list[str], list[str], dict[str, str]]:
    """The def of a class of blocks, one call line per block, and the scoped name of each parameter."""
    first = bs[0]
    run = stmts[first.start:first.stop]
    exprs, groups = _int_arguments(bs)
    taken = set(RESERVED)
    params = {d for s in stmts if s.is_param for d in s.defines}
    args = [_fresh(t if t in params else "x" if k == 0 else f"x{k + 1}", taken) for k, t in enumerate(first.inputs)]
    size_args = [z for z in sizes if any(z in s.tokens for s in run)]
    taken.update(size_args)
    n_args = [_fresh(f"n{k + 1}", taken) for k in range(len(groups))]
    prefixes = (readable("/".join(first.scope)) + "_", readable(first.scope[-1]) + "_")
    local = [_fresh(_strip(d, prefixes), taken) for s in run for d in s.defines]
    ints = iter(e.format(*n_args) for e in exprs)
    out, k = [f"def {name}({', '.join(args + size_args + n_args)}) {{"], 0
    for s, (*_, toks) in zip(run, first.key[0]):  # type: ignore[misc]
        rhs = "".join(next(ints) if t == "#" else t if not isinstance(t, tuple) else
                      local[t[1]] if t[0] == "v" else args[t[1]] for t in toks)
        mine = local[k:k + len(s.defines)]
        k += len(s.defines)
        out.append(f"    param {mine[0]}: {rhs} = {s.init}" if s.is_param else
                   f"    {', '.join(mine)}{',' if s.tuple_lhs and len(mine) == 1 else ''} = {rhs}")
    out += [f"    return {', '.join(local[p] for p in first.key[1])}", "}"]  # type: ignore[union-attr]
    call_lines, scoped = [], {}
    for i, b, where in zip(range(len(bs)), bs, _call_names(bs)):
        call = _fresh(where, calls)
        values = [str(g[i]) for g in groups]
        call_lines.append(f"{', '.join(b.outputs)} = {name}({', '.join(list(b.inputs) + size_args + values)}) as {call}")
        mine = [d for s in stmts[b.start:b.stop] for d in s.defines]
        scoped.update((d, f"{call}.{local[p]}") for p, d in enumerate(mine) if d in params)
    return out, call_lines, scoped


def _int_arguments(bs: Sequence[Block]) -> tuple[list[str], list[tuple[int, ...]]]:
    """Each integer's text in the def: the number where every block has the same one, else an argument
    (`{0}`) or a multiple of one (`4 * {0}`); and the values of each argument, block by block."""
    groups: list[tuple[int, ...]] = []
    exprs = []
    for column in zip(*(b.ints for b in bs)):
        if len(set(column)) == 1:
            exprs.append(str(column[0]))
            continue
        base = next((g for g in groups if all(a and c % a == 0 for a, c in zip(g, column))
                     and len({c // a for a, c in zip(g, column)}) == 1), None)
        if base is not None and base != column:
            exprs.append(f"{column[0] // base[0]} * {{{groups.index(base)}}}")
            continue
        if column not in groups:
            groups.append(column)
        exprs.append(f"{{{groups.index(column)}}}")
    return exprs, groups


def _call_names(bs: Sequence[Block]) -> list[str]:
    """Each block's call by its module's own name (`layer2_1`, `fc1`), or by its whole path where two
    blocks' own names are the same (`wq` in `layers.0` and `layers.1`: `layers_0_wq`, `layers_1_wq`)."""
    own = [readable(b.scope[-1]) for b in bs]
    return own if len(set(own)) == len(own) else [readable("/".join(b.scope)) for b in bs]


def _strip(name: str, prefixes: Sequence[str]) -> str:
    """A name inside its module: `layer1_1_conv1` -> `conv1`, `layer1_1_relu` -> `relu_out` (the prefix
    is the module's whole path, or its own name alone, as the exporter wrote its names)."""
    for prefix in prefixes:
        if name.startswith(prefix) and len(name) > len(prefix):
            name = name[len(prefix):]
            break
        if name == prefix[:-1]:
            name = "out"
            break
    return f"{name}_out" if name in RESERVED else name


def _snake(qualified: str) -> str:
    """`transformers.models.gpt2.modeling_gpt2.GPT2Block` -> `gpt2_block`."""
    last = qualified.rsplit(".", 1)[-1]
    return readable(re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", last))


def _fresh(base: str, taken: set[str]) -> str:
    base = base if base[:1].isalpha() or base[:1] == "_" else f"v{base}"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name
