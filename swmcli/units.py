"""Byte sizes: parse what users type ("24GiB", "30GB", "512MB") and print bytes with units.

GiB = 2**30 and GB = 10**9, as everywhere in swm.
"""

import re

from swmcli.errors import UsageError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
    "t": 10**12,
    "tb": 10**12,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Bytes in ``text`` ("24GiB", "1.5 GB", "4096"); a clear UsageError for anything else."""
    if isinstance(text, int):
        value, unit = text, ""
    else:
        match = _SIZE.match(str(text))
        if not match or match.group(2).lower() not in _UNITS:
            raise UsageError(
                f"cannot read {text!r} as a size",
                hint="write a number and a unit, e.g. 24GiB, 30GB, 512MiB",
            )
        value, unit = float(match.group(1)), match.group(2).lower()
    size = int(value * _UNITS[unit])
    if size <= 0:
        raise UsageError(f"size {text!r} must be positive", hint="e.g. 24GiB")
    return size


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units: 1536 -> '1.50 KiB', 3e10 -> '27.94 GiB'."""
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def format_gb(n: float) -> str:
    """``n`` bytes in decimal units, for figures compared with vendor sizes: 3.01e10 -> '30.1 GB'.

    GB from 0.1 GB up to 1,000 GB; MB below, TB above.
    """
    if n >= 1e12:
        return f"{n / 1e12:.1f} TB"
    if n >= 1e8:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.1f} MB"
