"""Course tooling: building ``labs/`` from ``solutions/`` and grading submissions.

No notebook imports this subpackage; it needs the ``[course]`` extra (nbgrader, nbval).

* :mod:`perflab.course.build`: ``labs/`` from ``solutions/`` with nbgrader's preprocessors.
* :mod:`perflab.course.checks`: the check-cell format (a probe in the kernel, a judge
  outside it).
* :mod:`perflab.course.answers`: a submission's answers, the scan for reaches into the
  machinery, the assembled notebook, written answers.
* :mod:`perflab.course.sandbox`: one bubblewrap sandbox per submission.
* :mod:`perflab.course.nbval_channel`: pytest plugin inside the sandbox (the verdict
  channel).
* :mod:`perflab.course.grading`: grade a folder of submissions; the ``grade`` command.
* :mod:`perflab.course.report`: ``scores.csv``, students' feedback, instructor files.
* :mod:`perflab.course.nbval_times`: pytest plugin printing nbval wall time per notebook.
"""
