"""Reading .swp files and resolving their imports into a Program."""

from __future__ import annotations

import hashlib
from pathlib import Path

import attrs

from swapdsl.common.errors import Span, SwpError
from swapdsl.common.paths import STDLIB_DIR
from swapdsl.lang import ast
from swapdsl.lang.parser import parse


@attrs.frozen
class Program:
    """The entry module and every module it imports, by resolved path."""

    entry: str
    modules: dict[str, ast.Module]
    imports: dict[str, tuple[str, ...]]  # module path -> the paths it imports, in order
    sources: dict[str, str]

    @property
    def sha256(self) -> str:
        """Hash of every source the model depends on (entry first, then by path)."""
        h = hashlib.sha256()
        for path in [self.entry] + sorted(p for p in self.sources if p != self.entry):
            h.update(self.sources[path].encode("utf-8"))
        return h.hexdigest()


def read_source(path: str | Path, what: str = "a .swp file") -> str:
    """A file's text, or an SwpError that says why it cannot be read (``what`` the file should be)."""
    p = Path(path)
    if p.is_dir():
        raise SwpError(f"`{path}` is a directory, not {what}")
    if p.exists() and not p.is_file():  # a FIFO or a device would block the read, or never end it
        raise SwpError(f"`{path}` is not a regular file")
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise SwpError(f"no such file: `{path}`") from None
    except OSError as exc:
        raise SwpError(f"cannot read `{path}`: {exc.strerror}") from None
    if (kind := _named_kind(p)) is not None or (kind := _text_kind(data)) is not None:
        raise SwpError(f"`{path}` is {kind[0]}, not {what}", hints=[kind[1]])
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # (a byte-order mark some editors write)
    except UnicodeDecodeError as exc:
        if (kind := _binary_kind(data)) is not None:
            raise SwpError(f"`{path}` is {kind[0]}, not {what}", hints=[kind[1]]) from None
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SwpError(
            f"`{path}` is not valid UTF-8 (byte 0x{data[exc.start]:02x})",
            Span.point(str(path), line, col),
            hints=[f"{what} is UTF-8 text"],
        ) from None


def _named_kind(path: Path) -> tuple[str, str] | None:
    """What a file is by its suffix, where the suffix alone tells (an ONNX file may even decode as text)."""
    if path.suffix.lower() == ".onnx":
        return "an ONNX model", f"turn it into a model first: `swapdsl import {path} -o {path.stem}.swp`"
    return None


def _text_kind(data: bytes) -> tuple[str, str] | None:
    """What a text file that is neither a model nor a plan is, by its first bytes (neither starts with `{`)."""
    if data.startswith(b'{"event": '):
        return "a training log (`exec --log` wrote it)", "draw it with `swapdsl plot-log`"
    if data.lstrip()[:1] == b"{":
        profile = b'"memory_bytes"' in data  # (what every device profile has)
        return "a JSON file", "a device profile goes to --device FILE.json" if profile else "give the model's text"
    return None


def _binary_kind(data: bytes) -> tuple[str, str] | None:
    """What a binary file a user might give in place of a text one is, by its first bytes, and where it
    belongs; None if none of these."""
    if data.startswith(b"\x93NUMPY"):
        return "a NumPy array", "arrays go to --data DIR (one NAME.npy per input)"
    if data.startswith(b"PK\x03\x04"):
        return "a zip archive (an .npz?)", "an .npz of arrays goes to --data FILE.npz"
    if data.startswith(b"\x89PNG"):
        return "a PNG image", "give the text file it was drawn from"
    header = int.from_bytes(data[:8], "little") if len(data) > 9 else 0
    if data[8:9] == b"{" and 0 < header <= len(data) - 8:
        return "a safetensors checkpoint", "a checkpoint goes to exec or predict as --init (or --resume)"
    return None


def load(path: str | Path) -> Program:
    """Parse ``path`` and, depth first, every file it imports."""
    entry = _display_path(Path(path)) if Path(path).is_file() else str(path)
    modules: dict[str, ast.Module] = {}
    imports: dict[str, tuple[str, ...]] = {}
    sources: dict[str, str] = {}
    _load(entry, modules, imports, sources, stack=[])
    return Program(entry, modules, imports, sources)


def _load(
    path: str,
    modules: dict[str, ast.Module],
    imports: dict[str, tuple[str, ...]],
    sources: dict[str, str],
    stack: list[str],
) -> None:
    text = read_source(path)
    sources[path] = text
    module = parse(text, path)
    modules[path] = module
    stack.append(path)
    resolved = []
    for imp in module.imports:
        target = resolve_import(imp, path)
        if target in stack:
            cycle = " -> ".join(_short(p) for p in stack[stack.index(target) :] + [target])
            raise SwpError(f"import cycle: {cycle}", imp.span)
        if target not in modules:
            _load(target, modules, imports, sources, stack)
        if target not in resolved:  # (one file imported by two names is one module, not two)
            resolved.append(target)
    imports[path] = tuple(resolved)
    stack.pop()


def resolve_import(imp: ast.Import, importer: str) -> str:
    """Next to the importing file first, then in the stdlib."""
    rel = imp.path if imp.path.endswith(".swp") else imp.path + ".swp"
    candidates = [Path(importer).parent / rel, STDLIB_DIR / rel]
    for cand in candidates:
        if cand.is_file():
            return _display_path(cand)
    odd = next((c for c in candidates if c.exists()), None)  # (a folder of that name, say)
    raise SwpError(
        f"cannot find imported file `{rel}`" + (f": `{odd}` is not a regular file" if odd is not None else ""),
        imp.span,
        notes=["looked in: " + ", ".join(str(c) for c in candidates)],
    )


def _display_path(p: Path) -> str:
    # Short relative paths in messages when the file is under the working directory.
    resolved = p.resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(resolved)


def _short(path: str) -> str:
    return Path(path).name
