"""Human-readable sizes and counts."""

from __future__ import annotations

import re

from swapdsl.common.errors import SwpError

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}

ALIGN = 256  # every arena region's offset and size are multiples of this
MAX_BYTES = 2**50  # 1 PiB: no tensor, memory cap or arena swapdsl handles is larger


def parse_size(text: str) -> int:
    """'8GiB', '512MiB', '1.5GB' or a plain number of bytes -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        unit = m.group(2).lower().removesuffix("i") if m else ""
        said = (f"`{m.group(2)}` could mean {m.group(1)}{unit.upper()}iB ({unit.upper()}iB: powers of 2) or "
                f"{m.group(1)}{unit.upper()}B (powers of 10)" if m and unit in ("k", "m", "g", "t", "p") else "")
        raise SwpError(f"cannot read the memory size `{text}`" + (f": {said}" if said else ""),
                       hints=["write e.g. 8GiB, 512MiB, 1.5GB or a number of bytes"])
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1:
        raise SwpError(f"the memory size `{text}` is not positive")
    if value > MAX_BYTES:
        raise SwpError(f"the memory size `{text}` is larger than the limit of 1 PiB ({MAX_BYTES} bytes)")
    if m.group(2).lower() in ("", "b") and not value.is_integer():  # (with a larger unit: whole bytes below it)
        raise SwpError(f"the memory size `{text}` is not a whole number of bytes",
                       hints=["give whole bytes, or a unit: 1.5GiB, 512MiB"])
    return int(value)


def parse_share(text: str) -> float | None:
    """'1/3' or '33%' -> the share it names (in (0, 1]); None for anything else (a size, say)."""
    m = re.fullmatch(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*|\s*([0-9]*\.?[0-9]+)\s*%\s*", text)
    if not m:
        return None
    share = int(m.group(1)) / int(m.group(2)) if m.group(2) and int(m.group(2)) else (
        float(m.group(3)) / 100 if m.group(3) else 0.0)
    if not 0 < share <= 1:
        raise SwpError(f"the memory share `{text}` is not in (0, 1]",
                       hints=["write e.g. 1/3 or 33%: that share of the model's no-swap arena"])
    return share


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_count(n: float, unit: str = "") -> str:
    """1234567 -> '1.23 M' (decimal prefixes, as FLOP counts are quoted)."""
    for prefix in ("", "K", "M", "G", "T", "P"):
        if abs(n) < 1000 or prefix == "P":
            return f"{n:.0f} {unit}".rstrip() if prefix == "" else f"{n:.2f} {prefix}{unit}"
        n /= 1000
    raise AssertionError("unreachable")


def arena_bytes(nbytes: int) -> int:
    """The bytes a buffer takes in an arena: its size rounded up to ALIGN (at least ALIGN)."""
    return max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
