"""The optimization ladder: a measured search over the techniques of Labs 01-07.

:mod:`~perflab.ladder.rungs` names each technique (a rung) and the config it makes,
:mod:`~perflab.ladder.search` climbs them greedily or exhaustively with a statistical
test per step (:func:`~perflab.ladder.search.climb`), and :mod:`~perflab.ladder.report`
holds the result, its table and its plot.
"""
