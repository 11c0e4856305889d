"""Lab 08 (the capstone): the report check (:mod:`~perflab.labs.lab08.report`), the
workloads the student's ``make_training`` builds on (:mod:`~perflab.labs.lab08.workloads`)
and the profiler rows the roofline and memory exercises read
(:mod:`~perflab.labs.lab08.traces`). Import from the submodules."""
