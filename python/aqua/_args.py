"""Arguments checked before they reach ctypes, which would silently wrap an int that does not fit
its C type (2**32 + 2 as a c_int is 2) or take a NaN for a number of milliseconds."""

from __future__ import annotations

import errno
import math
import operator
import re
from typing import Any, Optional

from .errors import InvalidArgumentError

U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
I32_MAX = (1 << 31) - 1


#: README.md, "Sizes": the units of aquad's config, aquactl and the examples (common/parse-util.c),
#: either case. tests/sizes.txt holds the grammar as cases, checked here and in C.
SIZE_UNITS = {"": 1, "b": 1,
              **{p + b: 1000 ** (i + 1) for i, p in enumerate("kmgtp") for b in ("", "b")},
              **{p + "i" + b: 1 << 10 * (i + 1) for i, p in enumerate("kmgtp") for b in ("", "b")}}
_SIZE = re.compile(r"\s*([0-9]+)(?:\.([0-9]+))?\s*([A-Za-z]*)\s*")


class SizeError(ValueError):
    """A size that is malformed (range=False) or over 2**64 - 1 bytes (range=True)."""

    def __init__(self, text: str, range: bool) -> None:
        super().__init__(f"{text!r} is over 2**64 - 1 bytes" if range else
                         f"{text!r} is not a size such as 8GiB, 512MiB, 1.5GB or 4096")
        self.range = range


def parse_size(text: str) -> int:
    """Bytes of a size such as "8GiB", "512 MiB", "1.5GB", "8G" or "4096": K, M, G, T, P (and
    KB..PB) are powers of 1000, Ki..Pi (and KiB..PiB) powers of 1024, either case; a fraction of
    a byte is rounded to the nearest (half up), with the fraction's first 19 digits, as in C."""
    m = _SIZE.fullmatch(text)
    if not m or m.group(3).lower() not in SIZE_UNITS:
        raise SizeError(text, range=False)
    whole, frac = int(m.group(1)), (m.group(2) or "")[:19]
    factor = SIZE_UNITS[m.group(3).lower()]
    denom = 10 ** len(frac)
    n = whole * factor + (int(frac or "0") * factor + denom // 2) // denom
    if whole > U64_MAX or n > U64_MAX:
        raise SizeError(text, range=True)
    return n


def _refuse(call: str, what: str, text: str) -> InvalidArgumentError:
    return InvalidArgumentError(call, -errno.EINVAL, f"{what} {text}")


def integer(value: Any, what: str, lo: int, hi: int, call: str) -> int:
    """value as an int in lo .. hi (an int, or anything with __index__; never a bool)."""
    if isinstance(value, bool):
        raise _refuse(call, what, f"must be an integer, not {value!r}")
    try:
        n = operator.index(value)
    except TypeError:
        raise _refuse(call, what, f"must be an integer, not {value!r}") from None
    if not lo <= n <= hi:
        raise _refuse(call, what, f"must be in {lo} .. {hi}, not {n}")
    return n


def u64(value: Any, what: str, call: str) -> int:
    return integer(value, what, 0, U64_MAX, call)


def seconds(value: Optional[float], what: str, call: str, *, positive: bool = False) -> Optional[float]:
    """None, or a finite number of seconds (>= 0; > 0 with positive) that fits an int of ms."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _refuse(call, what, f"must be seconds, not {value!r}")
    t = float(value)
    if not math.isfinite(t) or t < 0 or (positive and t == 0) or t * 1000 > I32_MAX:
        bound = "> 0" if positive else ">= 0"
        raise _refuse(call, what, f"must be finite seconds {bound} and at most {I32_MAX // 1000}, "
                                  f"not {value!r}")
    return t
