"""Course tooling: building ``labs/`` from ``solutions/`` and grading submissions.

No notebook imports this subpackage; it needs the ``[course]`` extra (nbgrader, nbval).

* :mod:`perflab.course.build`: ``labs/`` from ``solutions/`` with nbgrader's preprocessors.
* :mod:`perflab.course.grading`: grade a folder of submissions.
* :mod:`perflab.course.report`: ``scores.csv`` and feedback files.
* :mod:`perflab.course.nbval_times`: pytest plugin printing nbval wall time per notebook.
"""
