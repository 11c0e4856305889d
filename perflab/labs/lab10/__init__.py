"""Lab 10, tensor and pipeline parallelism: the models and references its checks recompute
(:mod:`~perflab.labs.lab10.models`), the collectives counter for DTensor
(:mod:`~perflab.labs.lab10.comm`) and the ranks' bodies (:mod:`~perflab.labs.lab10.ranks`)."""
