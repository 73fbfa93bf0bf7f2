"""Device profiles: what the cost model knows about a GPU and its link to the host.

Peak figures are the vendors' datasheet numbers; the efficiencies turn them
into what kernels and copies sustain in practice (roughly what cuBLAS/cuDNN
reach on large layers, and what pinned cudaMemcpyAsync reaches on the bus).
A profile written by `swapdsl profile` adds measured per-op times.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import attrs

from swapdsl.common.checks import not_too_long
from swapdsl.common.errors import SwpError, did_you_mean
from swapdsl.graph.ir import DType

GIB = 2**30


@attrs.frozen
class Device:
    name: str
    memory_bytes: int
    flops: tuple[tuple[str, float], ...]  # dtype class -> peak FLOP/s
    mem_bw: float  # device memory bytes/s
    h2d_bw: float  # host -> device bytes/s, pinned memory
    d2h_bw: float  # device -> host bytes/s, pinned memory
    launch_s: float  # fixed cost of one kernel
    copy_latency_s: float = 10e-6  # fixed cost of one copy
    compute_efficiency: float = 0.6
    memory_efficiency: float = 0.8
    source: str = ""
    op_times: tuple[tuple[str, float], ...] = ()  # measured: op key -> seconds (see devices.costs.op_key)
    # bytes/s an op run on the host sustains (optimiser updates moved off the device); `swapdsl profile`
    # measures it on the machine it runs on
    host_bw: float = 20e9

    def peak_flops(self, dtype: str) -> float:
        table = dict(self.flops)
        return table.get(dtype, table["f32"])

    def slower_bus(self, times: float) -> Device:
        """This device with its copies ``times`` slower, latency aside: small graphs with tensors that many
        times larger beside the same op times, where the bus limits the step (bench/exact_gap.py's ``--bus``)."""
        if times == 1.0:
            return self
        return attrs.evolve(self, name=f"{self.name}-bus-{times:g}", h2d_bw=self.h2d_bw / times,
                            d2h_bw=self.d2h_bw / times)

    def to_json(self) -> dict[str, Any]:
        d = attrs.asdict(self)
        d["flops"] = dict(self.flops)
        d["op_times"] = dict(self.op_times)
        return d


def _gpu(name: str, mem_gib: float, f64: float, f32: float, f16: float, mem_bw: float, link_bw: float,
         launch_s: float, source: str) -> Device:
    t = 1e12
    return Device(name, int(mem_gib * GIB), (("f64", f64 * t), ("f32", f32 * t), ("f16", f16 * t), ("bf16", f16 * t)),
                  mem_bw * 1e9, link_bw * 1e9, link_bw * 1e9, launch_s, source=source)


# host_bw (20 GB/s, every profile): what a multithreaded element-wise update sustains over a server's DRAM,
# about a fifth of a two-socket DDR5 system's peak; an assumption until `swapdsl profile` measures it.
# Link bandwidths are sustained pinned-memory copy rates: PCIe 3.0 x16 ~12 GB/s of 15.75,
# PCIe 4.0 x16 ~25 of 31.5, PCIe 5.0 x16 ~50 of 63; NVLink-C2C 450 GB/s per direction (900 total).
BUILTIN: dict[str, Device] = {d.name: d for d in [
    _gpu("v100-16gb", 16, 7.0, 14.0, 112.0, 900, 12.0, 5e-6,
         "NVIDIA Tesla V100 PCIe datasheet (2018): 14 TFLOPS FP32, 112 tensor FP16, 900 GB/s HBM2; PCIe 3.0 x16"),
    _gpu("v100-32gb", 32, 7.0, 14.0, 112.0, 900, 12.0, 5e-6,
         "NVIDIA Tesla V100 PCIe 32GB datasheet: as v100-16gb with 32 GB HBM2; PCIe 3.0 x16"),
    _gpu("a100-40gb", 40, 9.7, 19.5, 312.0, 1555, 25.0, 4e-6,
         "NVIDIA A100 datasheet (2020): 19.5 TFLOPS FP32, 312 FP16/BF16 tensor, 1555 GB/s HBM2; PCIe 4.0 x16"),
    _gpu("h100-80gb", 80, 34.0, 67.0, 989.0, 3350, 50.0, 3e-6,
         "NVIDIA H100 SXM5 datasheet (2022): 67 TFLOPS FP32, 989 dense FP16/BF16, 3.35 TB/s HBM3; PCIe 5.0 x16"),
    _gpu("h200", 141, 34.0, 67.0, 989.0, 4800, 50.0, 3e-6,
         "NVIDIA H200 SXM datasheet (2024): H100 compute, 141 GB HBM3e at 4.8 TB/s; PCIe 5.0 x16"),
    _gpu("gh200", 96, 34.0, 67.0, 989.0, 4000, 450.0, 3e-6,
         "NVIDIA GH200 Grace Hopper datasheet (2023): H100 compute, 96 GB HBM3 at 4 TB/s; NVLink-C2C 900 GB/s"),
]}

DEFAULT_DEVICE = "v100-16gb"


def detect_device() -> str:
    """The built-in profile closest to the GPU CuPy sees, else the default."""
    try:
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(0)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    except Exception:
        return DEFAULT_DEVICE
    lowered = name.lower()
    for key, profile in (("gh200", "gh200"), ("h200", "h200"), ("h100", "h100-80gb"), ("a100", "a100-40gb")):
        if key in lowered:
            return profile
    if "v100" in lowered:
        return "v100-32gb" if props.get("totalGlobalMem", 0) > 20 * GIB else "v100-16gb"
    return DEFAULT_DEVICE


def load_device(spec: str | None) -> Device:
    """A built-in profile by name, or a JSON profile file."""
    if spec is None:
        return BUILTIN[detect_device()]
    if spec in BUILTIN:
        return BUILTIN[spec]
    path = Path(spec)
    not_too_long(spec, "the device profile")
    if not spec.endswith(".json"):
        raise SwpError(f"unknown device `{spec}`", hints=did_you_mean(spec, list(BUILTIN))
                       or [f"devices: {', '.join(BUILTIN)}, or a profile .json file"])
    if not path.exists():
        raise SwpError(f"no such device profile: `{spec}`")
    if not path.is_file():
        raise SwpError(f"the device profile `{spec}` is not a regular file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return device_from_json(data)
    except OSError as exc:
        raise SwpError(f"cannot read the device profile `{spec}`: {exc.strerror or exc}") from None
    except RecursionError:
        raise SwpError(f"`{spec}` is not a valid device profile: its JSON is nested too deeply") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SwpError(f"`{spec}` is not a valid device profile: {exc}",
                       hints=["write one with `swapdsl profile`, or see `swapdsl devices --json`"]) from None


FLOPS_CLASSES = tuple(DType.names())  # the dtypes a profile may give peak FLOP/s for (an op's output's)
EFFICIENCIES = ("compute_efficiency", "memory_efficiency")  # shares of a peak: in (0, 1]
_REQUIRED = ("name", "memory_bytes", "flops", "mem_bw", "h2d_bw", "d2h_bw", "launch_s")


def device_from_json(d: dict[str, Any]) -> Device:
    """A profile from its JSON object (``to_json``'s), every field checked: a ValueError says which."""
    if not isinstance(d, dict):
        raise ValueError("expected one JSON object")
    unknown = set(d) - {a.name for a in attrs.fields(Device)}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}")
    missing = [k for k in _REQUIRED if k not in d]
    if missing:
        raise ValueError(f"missing field{'s' if len(missing) > 1 else ''} {', '.join(missing)}")
    d = dict(d)
    for key in ("flops", "op_times"):
        table = d.get(key, {})
        if not (isinstance(table, dict) and all(_real(v) and 0 < v < math.inf for v in table.values())):
            raise ValueError(f"{key} must be an object of positive finite numbers")
        d[key] = tuple(sorted((str(k), float(v)) for k, v in table.items()))
    if not set(dict(d["flops"])) <= set(FLOPS_CLASSES) or "f32" not in dict(d["flops"]):
        raise ValueError(f"flops takes {', '.join(FLOPS_CLASSES)} (f32 needed), not {sorted(dict(d['flops']))}")
    for key in ("mem_bw", "h2d_bw", "d2h_bw", "launch_s", "host_bw", "copy_latency_s", *EFFICIENCIES):
        if key in d and not (_real(d[key]) and (0 <= d[key] if key == "copy_latency_s" else 0 < d[key])
                             and d[key] <= (1 if key in EFFICIENCIES else math.inf) and math.isfinite(d[key])):
            raise ValueError(f"{key} is {d[key]!r}: expected a finite number "
                             + ("in (0, 1]" if key in EFFICIENCIES else "0 or more" if key == "copy_latency_s"
                                else "above 0"))
    if not (isinstance(d["name"], str) and type(d["memory_bytes"]) is int and 0 < d["memory_bytes"] <= 2**50):
        raise ValueError("name must be a string and memory_bytes an integer from 1 to 2^50")
    return Device(**d)


def _real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)
