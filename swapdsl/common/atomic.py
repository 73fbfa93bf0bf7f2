"""Writing a file all at once or not at all."""

from __future__ import annotations

import contextlib
import glob
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from swapdsl.common.checks import NAME_MAX, too_long
from swapdsl.common.errors import SwpError


def check_writable(path: str | Path, what: str = "file") -> None:
    """Refuse early (before any long work) a target that cannot be written: the same test as the write."""
    target = _target(path, what)
    folder = _folder(target, path, what)
    try:
        fd, tmp = tempfile.mkstemp(prefix=_prefix(target), suffix=".tmp", dir=folder)
    except OSError as exc:
        raise SwpError(f"cannot write the {what} `{path}`: {exc.strerror or exc}") from None
    os.close(fd)
    Path(tmp).unlink(missing_ok=True)


# what each kind of file a command writes holds, by its usual suffix: a target named for another kind is
# refused (a prediction named `x.npy` would be an .npz archive under the name of one array)
# (the first suffix is the one to suggest; a log may be called `.json` too, as JSON lines often are)
SUFFIXES = {"plan": (".plan",), "checkpoint": (".safetensors",), "weights": (".safetensors",),
            "prediction": (".npz",), "profile": (".json",), "log": (".jsonl", ".json"), "model": (".swp",),
            "plot": (".png", ".pdf", ".svg")}
_OURS = {".plan", ".safetensors", ".npz", ".npy", ".json", ".jsonl", ".swp", ".onnx"}
_EVERY_SUFFIX = {"plot"}  # kinds named for their format whatever the suffix (a figure called `.jpg` is refused)


def check_outputs(outputs: Iterable[tuple[str | os.PathLike[str] | None, str]],
                  inputs: Iterable[tuple[str | os.PathLike[str] | None, str]],
                  may_replace: Iterable[tuple[str, str]] = ()) -> None:
    """Refuse, before anything is read or written, a command whose output (path, what) is empty, is named
    for another kind of file, or is the same file (through links too) as one of its inputs or another of its
    outputs: a file an input folder holds counts as that input. ``may_replace``: pairs of (output, input)
    kinds that may name the same file (a checkpoint saved over the one resumed from)."""
    outs = [(os.fspath(p), what) for p, what in outputs if p is not None]
    ins = [(os.fspath(p), what) for p, what in inputs if p is not None]
    allowed = set(may_replace)
    for path, what in outs:
        if not path.strip():
            raise SwpError(f"the {what}'s file name is empty")
        if "\0" in path:
            raise SwpError(f"the {what}'s file name holds a NUL byte")
        if too_long(path):
            raise SwpError(f"the {what}'s file name has a part longer than {NAME_MAX} bytes: `{path[:60]}...`")
        check_suffix(path, what)
    seen: list[tuple[str, str, tuple[object, ...]]] = []
    for path, what in [(p, w) for p, w in ins if os.path.exists(p)]:
        seen += [(path, what, key) for key in _input_keys(path)]
    for path, what in outs:
        key = _key(path)
        for other, kind, k in seen:
            if k == key and (what, kind) not in allowed:
                inside = "" if _key(other) == key else f" (a file in `{other}`)"
                raise SwpError(f"the {what} `{path}` is the {kind} `{other}`{inside}: writing it would destroy it",
                               hints=[f"give the {what} another file name"])
        seen.append((path, what, key))


def check_suffix(path: str | os.PathLike[str], what: str) -> None:
    """Refuse a file of kind ``what`` named for another kind of file (see SUFFIXES)."""
    suffix, takes = Path(path).suffix.lower(), SUFFIXES.get(what, ())
    checked = suffix in _OURS or (what in _EVERY_SUFFIX and suffix)
    if takes and checked and suffix not in takes:
        named = " or ".join([", ".join(f"`{t}`" for t in takes[:-1]), f"`{takes[-1]}`"][-len(takes):])
        raise SwpError(f"`{os.fspath(path)}` is named as a `{suffix}` file; {what} files take {named}",
                       hints=[f"name it `{Path(path).with_suffix(takes[0])}`"])


def _key(path: str) -> tuple[object, ...]:
    """The file ``path`` names, through symbolic links: its device and inode where it exists (hard links
    too), else its resolved path."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(path))


def _input_keys(path: str) -> list[tuple[object, ...]]:
    """The files an input names: itself, or a data folder's arrays (the ``.npy`` files it is read for)."""
    if not os.path.isdir(path):
        return [_key(path)]
    try:
        return [_key(str(p)) for p in Path(path).glob("*.npy")] + [_key(path)]
    except OSError:  # (a folder that cannot be listed cannot be read either: its reader says so)
        return [_key(path)]


def write_text_atomically(path: str | Path, text: str, what: str = "file") -> None:
    write_bytes_atomically(path, text.encode("utf-8"), what)


def write_bytes_atomically(path: str | Path, data: bytes, what: str = "file") -> None:
    with atomic_path(path, what) as tmp, open(tmp, "wb") as f:
        f.write(data)


@contextlib.contextmanager
def atomic_path(path: str | Path, what: str = "file") -> Iterator[str]:
    """A temporary file's path in the same folder, for the caller to write; then flushed to disk and
    renamed over the target (or removed, if the caller fails). A symbolic link is followed: its target is
    replaced, in the target's own folder, and the link stays. An existing target that is not a regular
    file (a device such as /dev/null, a FIFO, a socket) is refused, never replaced.

    A writer killed before the rename leaves its temporary file behind; the next write to the same
    target removes those whose writer is gone (the temporary file's name carries its process id)."""
    target = _target(path, what)
    folder = _folder(target, path, what)
    _remove_stale(target, folder)
    try:
        fd, tmp = tempfile.mkstemp(prefix=_prefix(target), suffix=".tmp", dir=folder)
        os.close(fd)
    except OSError as exc:
        raise SwpError(f"cannot write the {what} `{path}`: {exc.strerror or exc}") from None
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise SwpError(f"cannot write the {what} `{path}`: {exc.strerror or exc}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _target(path: str | Path, what: str) -> Path:
    """The file a write to ``path`` replaces: ``path``, or where its symbolic links lead."""
    given = Path(path)
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    if target.is_dir():
        raise SwpError(f"`{path}` is a directory; give a file name for the {what}")
    if target.exists() and not target.is_file():
        kind = _KINDS.get(stat.S_IFMT(target.stat().st_mode), "not a regular file")
        raise SwpError(f"cannot write the {what} `{path}`: it is {kind}, not a regular file",
                       hints=["give the path of a regular file (it is replaced) or of a new one"])
    return target


_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
          stat.S_IFSOCK: "a socket"}


def _folder(target: Path, path: str | Path, what: str) -> Path:
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise SwpError(f"cannot write `{path}`: " + (f"`{folder}` is a file, not a folder" if folder.exists() else
                                                     f"folder `{folder}` does not exist"))
    return folder


def _prefix(target: Path) -> str:
    return f".{target.name}.{os.getpid()}."


def _remove_stale(target: Path, folder: Path) -> None:
    for tmp in folder.glob(f".{glob.escape(target.name)}.*.tmp"):
        pid = tmp.name[len(target.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True
