"""The machinery of a run, which research code can ignore: the workdir and its lock (``workdirs``),
checkpoints (``checkpointing``) and their earlier layouts (``checkpoint_forms``), signals and
preemption (``preemption``), a process of the job lost (``lost_peer``), reports and progress
(``reporting``), devices and hosts (``hardware``, ``distributed``, ``hostmemory``), the command
lines' shared flags and errors (``cli``) and what a run keeps for comparisons (``predictions``). It
imports only :mod:`capsjax.common` and :mod:`capsjax.config` (tests/test_import_layers.py), where
``config.json``, its migrations and what a resume changed live; the statistics of comparisons are in
:mod:`capsjax.stats`, a sweep's results in :mod:`capsjax.training`. Imports nothing by itself."""
