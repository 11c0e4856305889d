"""The notebook faces: ipywidgets panels that run experiments and plot them.

:mod:`~perflab.ui.shell` holds the panel shell every panel is built on;
:mod:`~perflab.ui.widgets` the before/after
:func:`~perflab.ui.widgets.experiment_panel`; :mod:`~perflab.ui.panels` the
DDP bucket, simulated-link and ladder panels; :mod:`~perflab.ui.scaling_panel` Lab 09's
scaling panel; :mod:`~perflab.ui.plan_panel` Lab 12's planning panel (a model, no
launch); :mod:`~perflab.ui.kernel_panel` Lab 11's attention panel. Nothing below this folder imports ipywidgets.
"""
