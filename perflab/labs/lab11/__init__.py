"""Lab 11, kernels: the bytes of an unfused chain (:mod:`~perflab.labs.lab11.fusion`), the
naive attention and the inputs the lab compares against (:mod:`~perflab.labs.lab11.attention`),
peak bytes allocated inside a call (:mod:`~perflab.labs.lab11.memory`), Triton where it
imports (:mod:`~perflab.labs.lab11.kernels`), the ring's ranks
(:mod:`~perflab.labs.lab11.ring`), the GPU timings (:mod:`~perflab.labs.lab11.gpu`) and the
lab's plots (:mod:`~perflab.labs.lab11.plots`)."""
