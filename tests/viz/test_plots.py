"""perflab.viz.plots on synthetic RunResults (fixed numbers, no training)."""
from __future__ import annotations

import pytest
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

from perflab.core.config import RunConfig
from perflab.viz.figures import PHASE_COLORS, figure_to_png
from perflab.viz.plots import plot_comparison, plot_phases, plot_throughput
from perflab.core.result import RunResult
from tests.synthetic import synthetic_result

PNG = b"\x89PNG\r\n\x1a\n"


def synth(config: RunConfig, data_ms: float, n: int = 8) -> RunResult:
    """Phases data/forward/backward/optimizer/other in ms, each +-2 % around a fixed value."""
    return synthetic_result(config, {"data": data_ms, "forward": 40.0, "backward": 80.0,
                                     "optimizer": 10.0, "other": 1.0}, n=n)


@pytest.fixture
def results() -> list[RunResult]:
    base = RunConfig(device="cpu", model="tiny")
    return [synth(base, 60.0), synth(base.replace(label="fast loader"), 5.0),
            synth(base.replace(batch_size=64), 30.0)]


def _ytick_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_yticklabels()]


def test_plot_phases_one_stacked_bar_per_result(results):
    fig = plot_phases(results)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    assert len(ax.containers) == 5  # data, forward, backward, optimizer, other
    assert all(len(c) == 3 for c in ax.containers)
    assert [c.get_label() for c in ax.containers] == list(PHASE_COLORS)
    assert _ytick_labels(ax) == [r.label for r in results]
    assert _ytick_labels(ax)[1] == "fast loader"
    assert "ms, mean" in ax.get_xlabel()
    assert [t.get_text() for t in ax.get_legend().get_texts()] == list(PHASE_COLORS)
    # segments of the first bar add up to its mean step time (ms)
    total = sum(c.patches[0].get_width() for c in ax.containers)
    assert total == pytest.approx(results[0].step.mean * 1e3)
    data_bar = ax.containers[0].patches[1]
    assert data_bar.get_width() == pytest.approx(results[1].phases["data"].mean * 1e3)


def test_phase_colours_are_consistent(results):
    a = plot_phases(results).axes[0]
    b = plot_phases(results[:1]).axes[0]
    assert [c.patches[0].get_facecolor() for c in a.containers] == \
        [c.patches[0].get_facecolor() for c in b.containers]


def test_plot_throughput_bars_whiskers_and_speedups(results):
    fig = plot_throughput(results)
    ax = fig.axes[0]
    bars, = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert len(bars) == 3
    assert _ytick_labels(ax) == [r.label for r in results]
    assert bars.patches[0].get_width() == pytest.approx(results[0].samples_per_s)
    texts = [t.get_text() for t in ax.texts]
    assert texts[0] == "1.00x"
    assert texts[1] == f"{results[1].samples_per_s / results[0].samples_per_s:.2f}x"
    assert "samples/s" in ax.get_xlabel()
    assert bars.errorbar is not None  # the CI whiskers
    lo, hi = results[0].samples_per_s_ci95
    segs = bars.errorbar.lines[2][0].get_segments()
    assert segs[0][:, 0] == pytest.approx([lo, hi])


def test_plot_into_given_axes(results):
    fig = Figure()
    ax = fig.add_subplot()
    assert plot_phases(results, ax=ax) is fig
    assert plot_throughput(results[:2], ax=fig.add_subplot(2, 1, 2)) is fig


def test_plot_comparison_two_panels_with_device_in_title(results):
    fig = plot_comparison(results[:2], title="loader")
    assert isinstance(fig, Figure) and len(fig.axes) == 2
    assert tuple(fig.get_size_inches()) == pytest.approx((11, 4))
    title = fig._suptitle.get_text()
    assert "loader" in title and "cpu" in title
    assert fig._repr_png_().startswith(PNG)


def test_figure_to_png_bytes(results):
    png = figure_to_png(plot_comparison(results), dpi=50)
    assert isinstance(png, bytes) and png.startswith(PNG)
    with pytest.raises(ValueError, match="dpi"):
        figure_to_png(Figure(), dpi=0)


@pytest.mark.parametrize("fn", [plot_phases, plot_throughput, plot_comparison])
def test_empty_results_raise(fn):
    with pytest.raises(ValueError, match="at least one RunResult"):
        fn([])
