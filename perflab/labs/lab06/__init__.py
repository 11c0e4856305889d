"""Lab 06, DDP overlap: the ranks' bodies (:mod:`~perflab.labs.lab06.ranks`) and what its
check cells compare a student's DDP wrapper with (:mod:`~perflab.labs.lab06.checks`)."""
