"""A user's training data: one array per model input, first axis = examples, read through memory maps.

``open_dataset`` checks a folder of ``NAME.npy`` files (or one ``.npz``) against the model's
``input`` declarations before anything runs (and reads it once: an ``.npz`` member's CRC, float
inputs' values, which must be finite, label ranges); ``Order`` says which examples make batch k (in order,
or shuffled per epoch by a generator seeded with (seed, epoch), so a position alone restores it);
``Loader`` gathers the next batch on a thread of its own while the current step runs.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import DType, Graph
from swapdsl.graph.ops.registry import np_dtype
from swapdsl.runtime.data import integer_ranges, rng_for

Batch = dict[str, np.ndarray]


@attrs.frozen
class Dataset:
    path: str
    arrays: Mapping[str, np.ndarray] = attrs.field(repr=False)  # memory maps where the file allows
    examples: int
    batch: int
    # inputs read as another dtype than the file's: labels and token ids of a wider integer type (PyTorch's
    # int64), narrowed batch by batch once their range is checked
    dtypes: Mapping[str, np.dtype] = attrs.field(factory=dict, repr=False)

    @property
    def batches_per_epoch(self) -> int:
        return self.examples // self.batch

    @property
    def dropped(self) -> int:
        """Examples of each epoch left out: the last partial batch."""
        return self.examples - self.batches_per_epoch * self.batch


DIGEST_CHUNK = 64 << 20  # bytes hashed at a time (a memory map is read once, never whole into memory)


def fingerprint(ds: Dataset) -> str:
    """SHA-256 of the data's arrays (names, dtypes, shapes and bytes, in name order): what a checkpoint
    records of its run's data, so that resuming on data changed at the same path is refused."""
    h = hashlib.sha256()
    for name in sorted(ds.arrays):
        a = ds.arrays[name]
        h.update(f"{name} {a.dtype.str} {a.shape}\n".encode())
        rows = max(1, DIGEST_CHUNK // max(1, a[:1].nbytes))
        for start in range(0, a.shape[0], rows):
            h.update(np.ascontiguousarray(a[start:start + rows]).reshape(-1).view(np.uint8))
    return h.hexdigest()


def batch_size(g: Graph) -> int:
    """The examples in one step: every input's first axis, which must agree."""
    if not g.inputs:
        raise SwpError(f"the model `{g.name}` has no inputs, so there is no data to give it",
                       hints=["train it without --data (its step reads only its parameters)"])
    sizes = {name: g.type_of(name).shape[0] if g.type_of(name).shape else None for name in g.inputs}
    for name, n in sizes.items():
        if n is None:
            raise SwpError(f"input `{name}` is a scalar, so data cannot be split into batches along its first axis")
    if len(set(sizes.values())) > 1:
        shown = ", ".join(f"`{k}` {v}" for k, v in sizes.items())
        raise SwpError(f"the model's inputs disagree on the batch size (first axis): {shown}")
    return next(iter(sizes.values()))


def array_names(path: str) -> set[str]:
    """The arrays a data set at ``path`` names (a folder's ``NAME.npy`` files, an ``.npz``'s members),
    unread and unchecked (``open_dataset`` checks them); none where it is neither."""
    where = Path(path)
    if where.is_dir():
        return {p.stem for p in where.glob("*.npy")}
    try:
        with zipfile.ZipFile(where) as z:
            return {n.removesuffix(".npy") for n in z.namelist()}
    except (OSError, zipfile.BadZipFile, ValueError):
        return set()


def open_dataset(path: str, g: Graph, flag: str = "--data", ranks: int = 1, partial: bool = False) -> Dataset:
    """The arrays at ``path`` for ``g``'s inputs, checked: names, dtypes, shapes, example counts, label ranges.
    Its batches are ``ranks`` times ``g``'s: each data-parallel rank reads its own rows of each. Training
    needs one whole batch; evaluation and prediction (``partial``) take fewer, as one partial batch."""
    where = Path(path)
    batch = batch_size(g) * ranks
    if where.is_dir():
        found = {p.stem: p for p in sorted(where.glob("*.npy"))}
        arrays = {name: _load_npy(found[name], flag) for name in g.inputs if name in found}
        listing = [f"{n}.npy" for n in found]
    elif where.is_file():
        arrays = _load_npz(where, flag)
        listing = [f"{n}" for n in arrays]
    elif where.exists():
        raise SwpError(f"{flag} `{path}` is not a regular file or a folder",
                       hints=["give a folder of NAME.npy files or one .npz file, one array per model input"])
    else:
        raise SwpError(f"{flag} `{path}`: no such file or folder",
                       hints=["give a folder of NAME.npy files or one .npz file, one array per model input"])
    missing = [n for n in g.inputs if n not in arrays]
    if missing:
        raise SwpError(f"{flag} `{path}` has no array for input `{missing[0]}`",
                       hints=[f"the model's inputs: {', '.join(g.inputs)}",
                              f"found: {', '.join(listing) or 'no .npy arrays'}"])
    ranged, narrowed = integer_ranges(g), {}
    for name in g.inputs:
        arrays[name] = _bf16_records(arrays[name], g.type_of(name).dtype)
        if (want := _check_array(name, arrays[name], g, flag, path, name in ranged)) is not None:
            narrowed[name] = want
    counts = {name: arrays[name].shape[0] for name in g.inputs}
    if len(set(counts.values())) > 1:
        shown = ", ".join(f"`{k}` {v}" for k, v in counts.items())
        raise SwpError(f"{flag} `{path}`: the inputs hold different numbers of examples: {shown}")
    examples = counts[g.inputs[0]]
    if examples < (1 if partial else batch):
        if partial:
            raise SwpError(f"{flag} `{path}` holds no examples")
        raise SwpError(f"{flag} `{path}` holds {examples} examples, fewer than one batch of {batch}",
                       hints=["use more data or a smaller batch (-D batch=N when planning)"])
    _check_ranges(arrays, g, flag, path)
    for name in g.inputs:
        if arrays[name].dtype.kind == "f" or g.type_of(name).dtype.is_float:
            _check_finite(name, arrays[name], flag, path)
    return Dataset(path, {name: arrays[name] for name in g.inputs}, examples, batch, narrowed)


# NumPy's header reader parses Python literals: on a damaged header it raises whatever the tokenizer or
# ast.literal_eval does (SyntaxError, tokenize.TokenError, RecursionError, ...), a short file EOFError, a
# size mmap cannot map OverflowError. All of them mean "not a readable array" here.
_UNREADABLE = (Exception,)


def _load_npy(file: Path, flag: str) -> np.ndarray:
    if not file.is_file():  # a FIFO would block the read forever
        raise SwpError(f"{flag}: `{file}` is not a regular file", hints=["each input is one NAME.npy file"])
    try:
        with open(file, "rb") as f:  # (np.load takes a file without the magic for a pickle, and says so)
            npy = f.read(len(np.lib.format.MAGIC_PREFIX)) == np.lib.format.MAGIC_PREFIX
        array = np.load(file, mmap_mode="r", allow_pickle=False) if npy else None
    except _UNREADABLE as exc:
        raise SwpError(f"{flag}: cannot read `{file}` as a .npy array: {_reason(exc)}") from None
    if array is None:
        raise SwpError(f"{flag}: `{file}` is not a .npy file (it does not start with NumPy's header)",
                       hints=["write each input with numpy.save"])
    return array


def _load_npz(file: Path, flag: str) -> dict[str, np.ndarray]:
    """Each member of an .npz, its CRC checked: a memory map where it is stored uncompressed, else read
    into memory."""
    try:
        with zipfile.ZipFile(file) as z:
            members = [m for m in z.infolist() if m.filename.endswith(".npy")]
            return {m.filename[:-4]: _npz_member(file, z, m) for m in members}
    except _UNREADABLE as exc:
        raise SwpError(f"{flag}: cannot read `{file}` as an .npz archive: {_reason(exc)}",
                       hints=["write it with numpy.savez, or give a folder of NAME.npy files"]) from None


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _drain(f: Any, chunk: int = 1 << 24) -> None:
    """Read a member to its end: there zipfile compares its CRC-32 and raises BadZipFile if it differs."""
    while f.read(chunk):
        pass


def _npz_member(file: Path, z: zipfile.ZipFile, m: zipfile.ZipInfo) -> np.ndarray:
    if m.compress_type != zipfile.ZIP_STORED:  # read once, through zipfile, which checks the CRC at the end
        with z.open(m) as f:
            _check_declared_size(f, m)
        with z.open(m) as f:
            a = np.lib.format.read_array(f, allow_pickle=False)
            _drain(f)
            return a
    with z.open(m) as f:  # a stored member is memory-mapped, so read through here once for its CRC
        _drain(f)
    with open(file, "rb") as raw:
        raw.seek(m.header_offset)
        local = raw.read(30)  # the local file header: its name and extra field lengths are at 26 and 28
        start = m.header_offset + 30 + int.from_bytes(local[26:28], "little") + int.from_bytes(local[28:30], "little")
        raw.seek(start)
        version = np.lib.format.read_magic(raw)
        if version not in ((1, 0), (2, 0)):
            with z.open(m) as f:
                return np.lib.format.read_array(f, allow_pickle=False)
        header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = header(raw)
        offset = raw.tell()
    if dtype.hasobject:
        raise ValueError(f"member {m.filename} holds Python objects")
    return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=shape, order="F" if fortran else "C")


def _check_declared_size(f: Any, m: zipfile.ZipInfo) -> None:
    """Refuse a member whose header claims more bytes than the member holds, before memory is set aside."""
    version = np.lib.format.read_magic(f)
    header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = header(f)
    if any(n < 0 for n in shape) or int(np.prod(shape, dtype=object)) * dtype.itemsize > m.file_size:
        raise ValueError(f"member {m.filename} claims shape {shape} of {dtype}, more than its {m.file_size} bytes")


def _bf16_records(a: np.ndarray, dtype: DType) -> np.ndarray:
    """A bf16 input's array as NumPy stores bf16 (`numpy.save` of ml_dtypes.bfloat16 writes two-byte void
    records, which read back as `|V2`): viewed as bf16 again."""
    if dtype is DType.bf16 and a.dtype.kind == "V" and a.dtype.itemsize == 2 and a.dtype.names is None:
        return a.view(np_dtype(np, dtype))
    return a


def _check_array(name: str, a: np.ndarray, g: Graph, flag: str, path: str, ranged: bool) -> np.dtype | None:
    """Shape and dtype against the model's input (``ranged``: labels or ids, whose range is checked after:
    any integer dtype then, narrowed batch by batch to the model's, which is returned; else None)."""
    t = g.type_of(name)
    want = np.dtype(np_dtype(np, t.dtype))
    narrowed = want if ranged and a.dtype.kind in "iu" and want.kind in "iu" and a.dtype != want else None
    expected = f"[N, {', '.join(map(str, t.shape[1:]))}]" if t.rank > 1 else "[N]"
    if a.ndim != t.rank or tuple(a.shape[1:]) != t.shape[1:]:
        raise SwpError(f"{flag} `{path}`: input `{name}` has shape [{', '.join(map(str, a.shape))}], "
                       f"expected {expected} (N examples of the model's {t})",
                       hints=["the first axis counts examples; the rest must match the model's input"])
    if a.dtype != want and narrowed is None:
        raise SwpError(f"{flag} `{path}`: input `{name}` has dtype {a.dtype}, expected {want} (the model's {t})",
                       hints=[f"convert it once, e.g. numpy.save(..., a.astype("
                              f"{'ml_dtypes' if want.name == 'bfloat16' else 'numpy'}.{want}))"])
    return narrowed


def _check_ranges(arrays: Mapping[str, np.ndarray], g: Graph, flag: str, path: str, chunk: int = 1 << 22) -> None:
    """Labels and token ids index a table: each must be in [0, its range), checked in chunks."""
    for name, limit in integer_ranges(g).items():
        flat = arrays[name].reshape(-1) if arrays[name].flags.c_contiguous else np.ravel(arrays[name])
        for lo in range(0, flat.size, chunk):
            part = flat[lo:lo + chunk]
            low, high = int(part.min()), int(part.max())
            if low < 0 or high >= limit:
                bad = int(np.flatnonzero((part < 0) | (part >= limit))[0]) + lo
                raise SwpError(f"{flag} `{path}`: input `{name}` holds {int(flat[bad])} at flat index {bad}, "
                               f"outside [0, {limit})", hints=[f"`{name}` indexes {limit} classes or rows"])


def _check_finite(name: str, a: np.ndarray, flag: str, path: str, chunk: int = 1 << 22) -> None:
    """Float inputs hold no NaN or infinity (a step on one would make every parameter NaN), checked in chunks."""
    flat = a.reshape(-1) if a.flags.c_contiguous else np.ravel(a)
    per_example = max(1, flat.size // max(1, a.shape[0]))
    for lo in range(0, flat.size, chunk):
        part = flat[lo:lo + chunk]
        if not np.isfinite(part).all():
            bad = int(np.flatnonzero(~np.isfinite(part))[0]) + lo
            raise SwpError(f"{flag} `{path}`: input `{name}` holds {flat[bad]} at flat index {bad} (example "
                           f"{bad // per_example})", hints=["training on it would make every parameter NaN: "
                                                            "clean or drop those examples"])


@attrs.frozen
class Order:
    """Which examples make the batch at each position (0, 1, ...: one per step, across epochs)."""

    examples: int
    batch: int
    shuffle: bool
    seed: int

    @property
    def per_epoch(self) -> int:
        return self.examples // self.batch

    def epoch_of(self, position: int) -> int:
        return position // self.per_epoch

    def indices(self, position: int) -> np.ndarray | slice:
        epoch, k = divmod(position, self.per_epoch)
        if not self.shuffle:
            return slice(k * self.batch, (k + 1) * self.batch)
        return self.permutation(epoch)[k * self.batch:(k + 1) * self.batch]

    def permutation(self, epoch: int) -> np.ndarray:
        return rng_for(self.seed, f"shuffle:{epoch}").permutation(self.examples)


def gather(ds: Dataset, where: np.ndarray | slice) -> Batch:
    """One batch, read into memory (sorted reads: a memory map is read in file order)."""
    if isinstance(where, slice):
        return {name: np.ascontiguousarray(a[where], dtype=ds.dtypes.get(name, a.dtype))
                for name, a in ds.arrays.items()}
    order = np.argsort(where, kind="stable")
    out = {}
    for name, a in ds.arrays.items():
        rows = np.empty((len(where),) + a.shape[1:], ds.dtypes.get(name, a.dtype))
        rows[order] = a[where[order]]
        out[name] = rows
    return out


class Loader:
    """Batches from ``position`` on, each gathered on a background thread while the one before it is used.

    ``read`` (tests) replaces ``gather``."""

    def __init__(self, ds: Dataset, order: Order, position: int,
                 read: Callable[[Dataset, Any], Batch] = gather) -> None:
        self.ds, self.order, self.read = ds, order, read
        self._ready: queue.Queue[tuple[int, Batch | BaseException]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(position,), name="swapdsl-loader", daemon=True)
        self._thread.start()

    def _fill(self, position: int) -> None:
        while not self._stop.is_set():
            try:
                item: Batch | BaseException = self.read(self.ds, self.order.indices(position))
            except BaseException as exc:  # handed to the consumer, which raises it
                item = exc
            while not self._stop.is_set():
                try:
                    self._ready.put((position, item), timeout=0.1)
                    break
                except queue.Full:
                    continue
            position += 1

    def next(self) -> tuple[int, Batch]:
        """(position, batch): the batch prepared while the last step ran."""
        position, item = self._ready.get()
        if isinstance(item, BaseException):
            raise item
        return position, item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
