"""The machinery of a run, which research code can ignore: the workdir and its lock
(``workdirs``), checkpoints (``checkpointing``), ``config.json`` (``runconfig``), signals and
preemption (``preemption``), a process of the job lost (``lost_peer``), reports and progress
(``reporting``), devices and hosts (``hardware``, ``distributed``, ``hostmemory``) and the
command lines' shared flags and errors (``cli``). It imports only :mod:`capsjax.common`
(tests/test_import_layers.py); what a resume changed and a sweep's results, which resolve router
and optimiser settings, are in :mod:`capsjax.training`. Imports nothing by itself."""
