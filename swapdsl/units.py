"""Human-readable sizes and counts."""

from __future__ import annotations


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
