"""The grader's references: what only judges need, never the student's kernel.

A judge (``judge_answer`` in a solution's graded part) runs in the grader and may
import from here; the grading sandbox covers this folder with an empty tmpfs
(:func:`perflab.course.sandbox.grader_only_paths`) and ``perflab course release``
leaves ``perflab/course/`` out, so a submission cannot answer an exercise by calling
the reference that judges it.

* :mod:`perflab.course.references.lab06`: the mean gradients of a drawn DDP run, DDP's
  buckets (torch's own assignment) and fp16 rounding, what the student's three DDP
  variants must give on the runs the grader draws.
* :mod:`perflab.course.references.lab07`: the all-gather of one float per rank and the
  b_r / B loss weighting (also what instructors' recording runs use).
* :mod:`perflab.course.references.lab09`: single-process AdamW, what every ZeRO /
  FSDP variant of Lab 09 must equal.
* :mod:`perflab.course.references.lab10`: the unsharded tensor-parallel block, the
  unsplit pipeline's loss and gradients, the stage split, the op order and stash peak of
  GPipe and 1F1B as torch's schedules run them, and the seal that ties one launch's
  records to the cases the grader drew.
* :mod:`perflab.course.references.sealing`: the seal (an HMAC under this grading
  process's key) that ties one launch's records to the cases drawn here, for the checks
  of Labs 06 and 10 that share a launch.
* :mod:`perflab.course.references.traces`: hidden windows of the real GPU traces in
  ``perflab/recordings/gpu`` (perturbed by the grader) and HTA's idle, temporal and
  overlap analyses of them (Labs 01, 08 and 06).
"""
