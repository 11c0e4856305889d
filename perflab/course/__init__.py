"""Course tooling: building ``labs/`` from ``solutions/`` and grading submissions.

No student notebook imports this subpackage (the solutions' graded parts import
:mod:`perflab.course.cases`, which needs only the standard library); it needs the
``[course]`` extra (nbgrader, nbval).

* :mod:`perflab.course.build`: ``labs/`` from ``solutions/`` with nbgrader's preprocessors.
* :mod:`perflab.course.cases`: graded checks on hidden cases (drawn in the grader, the
  student's answers as data, judged outside the sandbox); the kernel imports it.
* :mod:`perflab.course.checks`: the check-cell format (a self-check the student sees, a
  graded part that never reaches ``labs/``; older cells: a probe and a judge).
* :mod:`perflab.course.answers`: a submission's answers, the scan for the review column,
  the assembled notebook. :mod:`perflab.course.written`: written answers.
* :mod:`perflab.course.submission`: grade one notebook (the sandboxed run, the scores).
* :mod:`perflab.course.sandbox`: one bubblewrap sandbox per submission (an allow-list
  of folders: never the course repository);
  :mod:`perflab.course.selftest`: the probe that proves, before a batch, that nothing
  in the sandbox holds an answer;
  :mod:`perflab.course.slots`: its slot uids and the processes it leaves.
* :mod:`perflab.course.nbval_channel`: pytest plugin inside the sandbox (the verdict
  channel).
* :mod:`perflab.course.grading`: grade a folder of submissions; the ``grade`` command.
* :mod:`perflab.course.report`: ``scores.csv``, students' feedback, instructor files.
* :mod:`perflab.course.similarity`: similar answer cells (winnowing, as MOSS does) for
  the review column and ``instructor/similarity.csv``.
* :mod:`perflab.course.release`: the students' copy of the course
  (``perflab course release``): no solutions, tests or grader.
* :mod:`perflab.course.nbval_times`: pytest plugin printing nbval wall time per notebook.
"""
