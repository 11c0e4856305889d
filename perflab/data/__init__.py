"""Input data: the embedded dataset and the input pipeline a training step reads from.

The locally built ``photo-patches`` ImageFolder (:mod:`~perflab.data.dataset`), the
``Dataset``, transforms and ``DataLoader`` factory (:mod:`~perflab.data.loader`), batched
augmentation (:mod:`~perflab.data.augment`), the decoded-image cache
(:mod:`~perflab.data.cache`) and the device prefetcher with the pipeline's efficiency
(:mod:`~perflab.data.prefetch`). Imports only :mod:`perflab.core`.
"""
