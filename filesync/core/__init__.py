"""The pure core: the exclusion rule, the three-way reconcile and its bulk in-sync filters
(``quiet``), the safety guards, plain data.

Nothing here does I/O beyond reading an ignore file when a rule is built; everything is a
function of its arguments, property-tested in ``tests/core``.
"""
