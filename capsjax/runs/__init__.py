"""The machinery of a run, which research code can ignore: the workdir and its lock
(``workdirs``), checkpoints (``checkpointing``), ``config.json`` (``runconfig``), signals and
preemption (``preemption``), atomic files (``files``), reports and progress (``reporting``),
devices and hosts (``hardware``, ``distributed``, ``hostmemory``), the command lines' shared
flags and errors (``cli``), and a sweep's results (``sweep_results``). Imports nothing by
itself."""
