"""perflab.calls_to: a check's spy on public perflab functions, restored afterwards."""
from __future__ import annotations

import pytest

import perflab
from perflab.labs.checking import calls_to
from perflab import compare
from perflab.core import measurement


def test_calls_through_every_binding_are_recorded_and_restored():
    real = measurement.compare
    m = perflab.Measurement("a", (0.1, 0.2, 0.3))
    ns = {"compare": compare, "my_alias": compare, "other": 1}
    with calls_to("compare", namespace=ns) as called:
        measurement.compare(m, m)                 # the defining module
        perflab.compare(m, m)                     # perflab's public name
        ns["my_alias"](m, m)                      # `from perflab import compare as ...`
    assert called == ["compare"] * 3
    assert measurement.compare is real and perflab.compare is real
    assert ns == {"compare": real, "my_alias": real, "other": 1}


def test_an_answer_that_does_not_delegate_records_nothing_and_errors_restore():
    with calls_to("compare") as called:
        sum([1, 2])
    assert called == []
    with pytest.raises(RuntimeError):
        with calls_to("compare"):
            raise RuntimeError("student code failed")
    assert perflab.compare is measurement.compare


@pytest.mark.parametrize("name, match", [("not_a_name", "not a public perflab name"),
                                         ("PHASES", "not a function")])
def test_bad_names_are_refused(name, match):
    with pytest.raises(ValueError, match=match):
        with calls_to(name):
            pass


def test_resolve_finds_a_name_whose_module_another_import_loaded_first():
    """In a fresh interpreter, importing an earlier library module loads
    ``perflab.train.step`` as a side effect; the look-up used to skip it then (so Lab 08's
    ``forbid=["build_training"]`` raised in a fresh kernel)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c",
                          "from perflab.labs.checking import resolve\n"
                          "print(resolve('build_training').__module__)"],
                         capture_output=True, text=True, timeout=300)
    assert out.stdout.strip() == "perflab.train.step", out.stderr[-2000:]


def test_watch_calls_records_a_helper_however_reached_and_only_once():
    from perflab.labs.checking import resolve, watch_calls

    real = resolve("compare")
    alias = real
    m = perflab.Measurement("a", (0.1, 0.2, 0.3))

    def closure(fn=alias):
        return fn(m, m)

    with watch_calls({"compare": real}) as seen:
        closure()
        measurement.compare(m, m)
    assert seen == ["compare"]
