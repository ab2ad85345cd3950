"""Arguments checked before they reach ctypes, which would silently wrap an int that does not fit
its C type (2**32 + 2 as a c_int is 2) or take a NaN for a number of milliseconds."""

from __future__ import annotations

import errno
import math
import operator
from typing import Any, Optional

from .errors import InvalidArgumentError

U64_MAX = (1 << 64) - 1
U32_MAX = (1 << 32) - 1
I32_MAX = (1 << 31) - 1


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
