"""The simulated link: the alpha-beta model of a shared link (fake clock) and the DDP hook."""
from __future__ import annotations

import pytest
import torch

from perflab.distributed.link_hook import LinkHookState, register_link_hook
from perflab.core.simulated import LinkModel, SimulatedLink, ring_allreduce_wire_bytes
from perflab.core.timing import FakeClock

LINK = SimulatedLink(name="test", alpha_s=0.001, beta_bytes_per_s=1e6)  # 1 ms, 1 MB/s


def model(world_size: int = 2) -> tuple[LinkModel, FakeClock]:
    clock = FakeClock(tick_s=0.0)
    return LinkModel(LINK, world_size=world_size, clock=clock), clock


def test_one_message_takes_2_p_minus_1_alphas_plus_wire_bytes_over_beta():
    m, clock = model()  # p = 2: a ring of 2 hops, 2 * 1 ms of latency (Patarasuk & Yuan 2009)
    clock.advance(5.0)
    assert m.schedule(1000) == (5.0, pytest.approx(5.0 + 2 * 0.001 + 0.001))


def test_buckets_queue_on_a_busy_link_in_order():
    m, clock = model()
    _, d0 = m.schedule(2000)           # 0 -> 0.004
    clock.advance(0.001)               # next bucket ready while the link is busy
    s1, d1 = m.schedule(1000)
    assert s1 == pytest.approx(0.001)
    assert d1 == pytest.approx(d0 + 0.003)      # waits for the first, then 2 x 1 ms + 1 ms
    clock.advance(1.0)                 # link idle again: no queueing
    s2, d2 = m.schedule(0)
    assert d2 == pytest.approx(s2 + 0.002)


def test_reset_forgets_the_queue():
    m, _ = model()
    m.schedule(10_000)                 # busy until 0.012
    m.reset()
    assert m.schedule(0)[1] == pytest.approx(0.002)


def test_ring_factor_scales_the_bytes():
    assert ring_allreduce_wire_bytes(1000, 2) == 1000
    assert ring_allreduce_wire_bytes(1000, 4) == 1500
    assert ring_allreduce_wire_bytes(1000, 1) == 0
    m4, _ = model(world_size=4)
    assert m4.duration_s(1000) == pytest.approx(6 * 0.001 + 0.0015)  # 2(p-1) hops
    m1, _ = model(world_size=1)
    assert m1.duration_s(1000) == 0.0  # one rank: nothing sent, no hop


@pytest.mark.parametrize("nbytes, world_size", [(-1, 2), (10, 0), (10, 1.5)])
def test_wire_bytes_rejects_bad_input(nbytes, world_size):
    with pytest.raises(ValueError, match="nbytes|world_size"):
        ring_allreduce_wire_bytes(nbytes, world_size)


def test_link_model_rejects_a_non_link():
    with pytest.raises(ValueError, match="SimulatedLink"):
        LinkModel("1gbe")  # type: ignore[arg-type]


def test_hook_state_records_and_resets():
    m, clock = model()
    state = LinkHookState(m, compression="fp16")
    rec = state._book(3, 1000)
    assert (rec.index, rec.nbytes, rec.start_s) == (3, 1000, 0.0)
    assert state.records == [rec]
    state.reset()
    assert state.records == [] and m.link_free_s < 0


def test_hook_state_rejects_unknown_compression():
    with pytest.raises(ValueError, match="compression"):
        LinkHookState(model()[0], compression="int8")


@pytest.mark.parametrize("kwargs, match", [
    (dict(compression="int8"), "compression"),
    (dict(link="1gbe"), "SimulatedLink"),
    (dict(), "DistributedDataParallel"),
])
def test_register_link_hook_rejects_bad_input(kwargs, match):
    args = dict(link=LINK)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        register_link_hook(torch.nn.Linear(2, 2), **args)


@pytest.mark.slow
def test_hook_on_two_ranks_delays_buckets_and_averages_like_ddp():
    """Two gloo ranks, a 3-layer MLP in 1 MiB buckets, link 2 ms + 100 MB/s."""
    from perflab.analysis.collectives import link_hook_probe
    from perflab.distributed import launch_fn

    link = SimulatedLink(name="t", alpha_s=0.002, beta_bytes_per_s=100e6)
    out = launch_fn(link_hook_probe, 2, device="cpu", timeout_s=120,
                    args=([256, 512, 512, 64], 1.0, link, ("none", "fp16"), 2, True))
    r0, r1 = out
    for variant in ("none", "fp16", "baseline"):  # every rank holds the same weights
        assert r0[variant]["param_sum"] == pytest.approx(r1[variant]["param_sum"], rel=1e-9)
    # the hook averages exactly as DDP's own allreduce does
    assert r0["none"]["param_sum"] == pytest.approx(r0["baseline"]["param_sum"], rel=1e-9)
    assert r0["fp16"]["param_sum"] == pytest.approx(r0["baseline"]["param_sum"], rel=1e-3)
    full, half = r0["none"]["records"][-1], r0["fp16"]["records"][-1]
    assert len(full) == len(half) >= 2
    assert [n // 2 for _, n, _, _ in full] == [n for _, n, _, _ in half]  # fp16: half bytes
    free = float("-inf")
    for _, nbytes, start_s, done_s in full:  # a shared link, used in order
        assert done_s == pytest.approx(max(start_s, free) + 2 * link.alpha_s + nbytes / link.beta_bytes_per_s)
        free = done_s
    # the step waits for the last modelled completion
    assert r0["none"]["step_s"][-1] >= full[-1][3] - 1e-3  # (timer resolution)
