"""Collectives across data-parallel ranks (``graph/dataparallel.py`` places them): every rank runs the same
step on its own shard of the batch, and each gradient is averaged over the ranks before its update. Small
gradients travel in buckets, as in PyTorch's DDP: ``bucket_pack`` copies them into one flat tensor, one
all-reduce averages it, and ``bucket_unpack`` takes each gradient's average back out of it.

A kernel reaches the other ranks through ``KernelContext.comm`` (mpi4py's interface: MPI on NumPy; on CuPy
NCCL on the current stream, or MPI through host memory, ``runtime/nccl.py``; a CuPy array given to MPI's
communicator, in the reference executor, goes through host memory here). Every rank receives the same
sums (MPI sums in one order for all; NCCL's ring reduces each chunk once and passes the result on), so the
ranks' parameters stay bit-identical.
"""

from __future__ import annotations

from swapdsl.common.errors import SwpError
from swapdsl.graph.ir import TensorType
from swapdsl.graph.ops.registry import Array, Attrs, KernelContext, OpDef, Types, on_cuda, register

REDUCIBLE = frozenset({"f32", "f64"})  # the dtypes MPI sums (a half gradient has no MPI type)


def _allreduce_infer(ins: Types, a: Attrs) -> TensorType:
    (x,) = ins
    if x.dtype.label not in REDUCIBLE:
        raise SwpError(f"data-parallel gradients are averaged in f32 or f64, not {x.dtype.label}")
    if not (isinstance(a["ranks"], int) and a["ranks"] >= 2 and a["link_bw"] > 0):
        raise SwpError(f"`allreduce_mean` needs ranks >= 2 and a positive link bandwidth, got {a}")
    return x


def _allreduce_mean(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """out = the mean of ``x`` over the ranks."""
    (x,) = ins
    comm = c.comm
    if comm is None or comm.Get_size() != a["ranks"]:
        have = 1 if comm is None else comm.Get_size()
        raise SwpError(f"this step averages gradients over {a['ranks']} ranks, and it runs in {have}",
                       hints=[f"run it with `mpiexec -n {a['ranks']} swapdsl exec ...`"])
    if on_cuda(c.xp) and not getattr(comm, "on_device", False):  # MPI's (the reference executor on CuPy)
        host = c.xp.asnumpy(x)
        comm.Allreduce(host.copy(), host)
        out.set(host)
    else:
        comm.Allreduce(x, out)
    c.xp.divide(out, out.dtype.type(a["ranks"]), out=out)


def _pack_infer(ins: Types, a: Attrs) -> TensorType:
    dtypes = {x.dtype for x in ins}
    if len(dtypes) != 1:
        raise SwpError(f"a gradient bucket holds tensors of one dtype, not {sorted(d.label for d in dtypes)}")
    return TensorType((sum(x.numel for x in ins),), ins[0].dtype)


def _pack(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """out = the inputs, flattened, one after another."""
    start = 0
    for x in ins:
        c.xp.copyto(out[start:start + x.size], x.reshape(-1))
        start += x.size


def _unpack_infer(ins: Types, a: Attrs) -> TensorType:
    (flat,) = ins
    shape, start = tuple(a["shape"]), a["start"]
    out = TensorType(shape, flat.dtype)
    if flat.rank != 1 or not (isinstance(start, int) and 0 <= start <= flat.numel - out.numel):
        raise SwpError(f"`bucket_unpack` takes {shape} from {start} of a flat bucket; it has {flat.shape}")
    return out


def _unpack(c: KernelContext, ins: list[Array], out: Array, a: Attrs) -> None:
    """out = the bucket's elements from ``start``, in ``out``'s shape."""
    c.xp.copyto(out, ins[0][a["start"]:a["start"] + out.size].reshape(out.shape))


def ring_seconds(ins: Types, a: Attrs) -> float:
    """A ring all-reduce's time: each rank sends and receives 2 (N - 1) / N of the bytes over its link, in
    2 (N - 1) steps of a fixed latency."""
    n = a["ranks"]
    return 2 * (n - 1) / n * ins[0].nbytes / a["link_bw"] + 2 * (n - 1) * LINK_LATENCY_S


LINK_LATENCY_S = 5e-6  # one message between ranks (an MPI or NCCL hop on a fast network)

register(
    OpDef("allreduce_mean", (1, 1), _allreduce_infer, lambda ins, o, a: 0, _allreduce_mean),
    OpDef("bucket_pack", (2, None), _pack_infer, lambda ins, o, a: 0, _pack),
    OpDef("bucket_unpack", (1, 1), _unpack_infer, lambda ins, o, a: 0, _unpack, bytes_read=lambda ins, o, a: o.nbytes),
)
