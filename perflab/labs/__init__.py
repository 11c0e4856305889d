"""Per-lab glue: what exactly one notebook needs, one-way to the library.

:mod:`~perflab.labs.catalog` is the lab map (titles, objectives, what each lab can do on
this machine, the measured lab times); :mod:`~perflab.labs.checking` the helpers a check
cell uses (:func:`~perflab.labs.checking.calls_to`). ``lab06`` (DDP: rank bodies and
check helpers), ``lab07`` (stragglers), ``lab08`` (the capstone: its changes and
workloads, trace and memory-timeline readers, the report's check), ``lab09`` (sharding,
FSDP2 prefetch order), ``lab10`` (tensor and pipeline parallelism), ``lab11`` (kernels:
attention references, memory and timing, ring attention's ranks) and ``lab12`` (planning
the cluster: the student's types, the published rows) each import the
library and never another lab (an import-linter
independence contract): what two labs need moves down into the library.
"""
