"""Property-based test of RunConfig (hypothesis): every value a user can type is either
accepted (and then a tiny run of it trains) or refused with a ValueError that names the
field, never another exception, never a hang (issue 13).

Each example sets a random subset of fields to a random mix of valid values and junk
(None, bools, huge and negative ints, NaN and infinities, strings, lists). Valid ranges
are kept small so an accepted config trains in about a second; world_size stays 1 (a
data-parallel run would start processes), so the DDP-only fields are refused unless
they keep their defaults.
"""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perflab import RunConfig, run

JUNK = st.one_of(st.none(), st.booleans(), st.integers(-10**9, 10**9),
                 st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
                 st.lists(st.integers(0, 3), max_size=2))


def _field(valid: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(valid, JUNK)


FIELDS = {
    "label": _field(st.text(max_size=12)),
    "device": _field(st.sampled_from(["auto", "cpu", "cuda", "tpu"])),
    "model": _field(st.just("tiny")),
    "image_size": _field(st.integers(16, 40)),
    "batch_size": _field(st.integers(2, 8)),
    "steps": _field(st.integers(2, 3)),
    "warmup_steps": _field(st.integers(0, 1)),
    "lr": _field(st.floats(1e-4, 1.0)),
    "num_workers": _field(st.integers(0, 1)),
    "persistent_workers": _field(st.booleans()),
    "prefetch_factor": _field(st.one_of(st.none(), st.integers(1, 2))),
    "threads": _field(st.one_of(st.none(), st.integers(1, 2))),
    "seed": _field(st.integers(0, 2**32 - 1)),
    "amp": _field(st.sampled_from(["off", "fp16"])),       # bf16 is emulated here: slow
    "channels_last": _field(st.booleans()),
    "compile": _field(st.just("off")),                      # compiling takes minutes
    "checkpointing": _field(st.sampled_from(["none", "per_stage", 2])),
    "storage_latency_ms": _field(st.floats(0, 2)),
    "decoded_cache": _field(st.sampled_from(["off", "memory"])),
    "device_prefetch": _field(st.booleans()),
    "compute_only": _field(st.booleans()),
    "world_size": _field(st.just(1)),
    "bucket_cap_mb": _field(st.floats(0.5, 50)),
    "accumulation_steps": _field(st.integers(1, 2)),
}

CONFIGS = st.fixed_dictionaries({}, optional=FIELDS)
#: Fields not drawn keep these (a tiny model and size, so an accepted config trains in
#: about a second), not RunConfig's ResNet-18 defaults.
TINY = dict(model="tiny", image_size=32, batch_size=4)


def _names_a_field(message: str, fields: dict) -> bool:
    return any(name in message for name in fields)


@settings(max_examples=250, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(kw=CONFIGS)
def test_every_value_is_accepted_and_trains_or_refused_naming_the_field(tiny_dataset, kw):
    try:
        config = RunConfig(dataset=tiny_dataset, **{**TINY, **kw})
    except ValueError as e:
        assert _names_a_field(str(e), kw), f"{e} does not name any of {sorted(kw)}"
        return
    # accepted: a tiny run of exactly this config must train (2 steps, nothing saved)
    result = run(config.replace(steps=2, warmup_steps=0), progress=False, save=False)
    assert result.step.n == 2 and all(t > 0 for t in result.step.times_s)
    assert len(result.losses) == 2 and all(math.isfinite(v) for v in result.losses)


def test_the_strategy_reaches_both_outcomes(tiny_dataset):
    """The property above is only worth something if hypothesis both builds valid
    configs and refuses invalid ones; check both happen over the same search space."""
    accepted = refused = 0

    @settings(max_examples=200, deadline=None, derandomize=True)
    @given(kw=CONFIGS)
    def count(kw):
        nonlocal accepted, refused
        try:
            RunConfig(dataset=tiny_dataset, **{**TINY, **kw})
            accepted += 1
        except ValueError:
            refused += 1

    count()
    assert accepted >= 10 and refused >= 100, (accepted, refused)


@pytest.mark.parametrize("kw", [dict(lr=float("inf")), dict(batch_size=True),
                                dict(image_size=10**6)])
def test_the_property_would_catch_a_silently_accepted_value(tiny_dataset, kw):
    """Wrong answer: a value the issue found accepted silently is refused now."""
    with pytest.raises(ValueError):
        RunConfig(dataset=tiny_dataset, **kw)
