"""The machinery of a run, which research code can ignore: the workdir and its lock
(``workdirs``), checkpoints (``checkpointing``), ``config.json`` (``runconfig``), signals and
preemption (``preemption``), a process of the job lost (``lost_peer``), reports and progress
(``reporting``), devices and hosts (``hardware``, ``distributed``, ``hostmemory``), the
command lines' shared flags and errors (``cli``) and what a run keeps for comparisons
(``predictions``). It imports only :mod:`capsjax.common` (tests/test_import_layers.py); the
statistics of comparisons are in :mod:`capsjax.stats`, and what a resume changed and a sweep's
results, which resolve router and optimiser settings, in :mod:`capsjax.training`. Imports
nothing by itself."""
