"""Input data: the embedded dataset and the input pipeline a training step reads from.

The locally built ``photo-patches`` ImageFolder (:mod:`~perflab.data.loader.dataset`), the
``Dataset``, transforms and ``DataLoader`` factory (:mod:`~perflab.data.loader.loader`), batched
augmentation (:mod:`~perflab.data.loader.augment`), the decoded-image cache
(:mod:`~perflab.data.loader.cache`) and the device prefetcher with the pipeline's efficiency
(:mod:`~perflab.data.loader.prefetch`). Imports only :mod:`perflab.core`.
"""
