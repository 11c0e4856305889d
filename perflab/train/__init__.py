"""Training: one step for one process and for every rank, and the workloads labs train.

:mod:`~perflab.train.step` builds the model, data and optimizer of a
:class:`~perflab.core.config.RunConfig` and runs one timed training step (autocast,
GradScaler, activation checkpointing and the compiled model are visible in it);
:mod:`~perflab.train.loop` loops that step on one process
(:func:`~perflab.train.loop.train_loop`); :mod:`~perflab.train.workloads` holds the small
self-contained training set-ups and synthetic inputs the labs' exercises run on.
Deciding between one process and ranks is :mod:`perflab.experiment`'s job, not this
folder's.
"""
