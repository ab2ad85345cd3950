"""aqua.vllm when the host has no memory left for a reclaim: the simulated machine of this file
has 16 MiB of host memory for the driver to allocate (simcuda's AQUA_SIM_HOST_MEMORY, read once
per process, hence a file of its own), less than the aqua tensor a reclaim would move there."""

from __future__ import annotations

import os

import pytest

os.environ["AQUA_SIM_HOST_MEMORY"] = "16MiB"

from test_vllm import (Engine, aqua_worker, run_prefix_scenario, spec,  # noqa: E402
                       step_until_reply)


@pytest.fixture
def aquad_config() -> str:
    return "reclaim-deadline: 2s\ndram-budget: 4GiB\n"


def test_a_reclaim_the_host_cannot_take_fails_and_blocks_stay_readable(aquad, producer):
    """The lender takes its memory back, but the 64 MiB of chunks cannot get host memory: the
    reclaim is not honoured (RECLAIM_FAILED; aquad reports the missed deadline, the producer's
    reclaim times out incomplete), the blocks stay in the lender's memory at the same
    addresses, and every stored block still loads back identical."""
    producer.eval("ctx.offer(256 << 20)")
    e = Engine(spec())
    try:
        w = aqua_worker(e)

        def reclaim_the_host_cannot_take() -> None:
            producer.send(eval="ctx.reclaim(aqua.ALL, timeout=5)")
            reply = step_until_reply(e, producer)
            assert not reply["complete"], reply
            assert "missed the reclaim deadline of lease" in aquad.log_text()  # reported
            st = w.stats()
            assert st.reclaims_failed > 0 and st.migrations == 0, st
            assert st.peer_bytes == w.tensor.info().max_bytes and st.dram_bytes == 0, st
            assert w.tensor.dptr == w.dptr

        run_prefix_scenario(e, producer, reclaim_the_host_cannot_take)
    finally:
        e.shutdown()
    # The worker's shutdown returns the lease: the lender gets its memory back then.
    assert producer.eval("sum(x.nbytes for x in poll_until(ctx, 'Reclaimed') "
                         "if type(x).__name__ == 'Reclaimed')") > 0
