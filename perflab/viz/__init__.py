"""Figures and plots: what the analyses, the ladder and the panels draw with.

:mod:`~perflab.viz.figures` makes a matplotlib figure that shows inline without pyplot's
global state (nbval-stable PNGs); :mod:`~perflab.viz.plots` draws runs and their phases,
:mod:`~perflab.viz.rank_plots` per-rank timelines, :mod:`~perflab.viz.scaling_plots`
scaling curves and per-rank state bytes, :mod:`~perflab.viz.plan_plots` a layout's memory
and step time as stacked bars and predicted against published throughput,
:mod:`~perflab.viz.kernel_plots` Lab 11's panel bars. Imports only
:mod:`perflab.core`.
"""
