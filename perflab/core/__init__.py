"""The core: what every layer above stands on, and nothing else of perflab's.

One experiment's configuration (:mod:`~perflab.core.config`, with the RunConfig <-> command
line flags beside it in :mod:`~perflab.core.config_flags`), the only clock
(:mod:`~perflab.core.timing`), what a measurement is (:mod:`~perflab.core.measurement`),
memory accounting (:mod:`~perflab.core.memory`), a run's result and the folder of saved
results (:mod:`~perflab.core.result`, :mod:`~perflab.core.result_store`), atomic storage
(:mod:`~perflab.core.storage`), where things live on disk (:mod:`~perflab.core.paths`),
the machine's provenance (:mod:`~perflab.core.env`), dtype helpers
(:mod:`~perflab.core.dtypes`) and the specs of what a config can simulate: a network link
and a straggler (:mod:`~perflab.core.simulated`). The core imports no other perflab
folder.
"""
