"""The machinery of a run, which research code can ignore: the workdir and its lock, checkpoints,
signals, a process of the job lost, reports and progress, devices and hosts, the command lines'
shared flags and errors, what a run keeps for comparisons (what each module holds: docs/code.md).
It imports only :mod:`capsjax.common` and :mod:`capsjax.config` (tests/test_import_layers.py),
where ``config.json``, its migrations and what a resume changed live; the statistics of
comparisons are in :mod:`capsjax.stats`, a sweep's results in :mod:`capsjax.training`. Imports
nothing by itself."""
