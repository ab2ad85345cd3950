"""The size grammar of README.md's "Sizes", as the Python package reads it: every case of
tests/sizes.txt, which common/test-parse-util.c checks against aquad's own parser, and aqua.vllm's
keys that take sizes."""

from __future__ import annotations

from pathlib import Path

import pytest

from aqua._args import SizeError, parse_size

TABLE = Path(__file__).resolve().parents[2] / "tests" / "sizes.txt"


def cases() -> list[tuple[str, str]]:
    out = []
    for line in TABLE.read_text().splitlines():
        if line.startswith("#") or "\t" not in line:
            continue
        text, want = line.split("\t", 1)
        out.append((text, want))
    assert len(out) > 50, f"only {len(out)} cases in {TABLE}"
    return out


@pytest.mark.parametrize("text,want", cases())
def test_every_size_of_the_shared_table(text: str, want: str) -> None:
    if want in ("EINVAL", "ERANGE"):
        with pytest.raises(SizeError) as e:
            parse_size(text)
        assert e.value.range == (want == "ERANGE"), str(e.value)
    else:
        assert parse_size(text) == int(want)


def test_aqua_vllm_reads_sizes_with_the_same_grammar() -> None:
    pytest.importorskip("vllm")
    from aqua.vllm import _bytes

    assert _bytes("capacity_bytes", "8G") == 8 * 10**9
    assert _bytes("capacity_bytes", "8Gi") == 8 << 30
    assert _bytes("capacity_bytes", "1.5 GiB") == 3 << 29
    assert _bytes("capacity_bytes", 4096) == 4096
    with pytest.raises(ValueError, match=r"'capacity_bytes' must be a size such as 8GiB.*'8 parsecs'"):
        _bytes("capacity_bytes", "8 parsecs")
    with pytest.raises(ValueError, match="over 2"):
        _bytes("capacity_bytes", "16384PiB")
