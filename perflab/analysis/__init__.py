"""The analyses: one module per question a lab asks of a run, a trace or a model.

Profiling and diagnosis (:mod:`~perflab.analysis.profiling`,
:mod:`~perflab.analysis.diagnosis`), trace reading and HTA-style breakdowns
(:mod:`~perflab.analysis.trace`, :mod:`~perflab.analysis.trace_analysis`), recordings made
on GPU machines elsewhere (:mod:`~perflab.analysis.recordings`: profiler traces and
nccl-tests tables), mixed precision
(:mod:`~perflab.analysis.amp`), torch.compile (:mod:`~perflab.analysis.compilation`,
:mod:`~perflab.analysis.compile_cache`), FLOPs, MFU and the roofline
(:mod:`~perflab.analysis.flops`, :mod:`~perflab.analysis.roofline`), memory
(:mod:`~perflab.analysis.memory_parts`, :mod:`~perflab.analysis.checkpointing`,
:mod:`~perflab.analysis.max_batch`, :mod:`~perflab.analysis.accumulation`), the input
pipeline (:mod:`~perflab.analysis.loader_tuning`), collectives and DDP overlap
(:mod:`~perflab.analysis.collectives`, :mod:`~perflab.analysis.overlap`), stragglers
(:mod:`~perflab.analysis.stragglers`), sharding and scaling
(:mod:`~perflab.analysis.sharding`, :mod:`~perflab.analysis.zero`,
:mod:`~perflab.analysis.scaling`). Analyses may use :mod:`perflab.experiment` and
everything below it, never the ladder, the panels or a lab's glue.
"""
