"""The config: what a run's settings are and how a config file becomes one run's resolved
config, below everything that reads it (it imports only :mod:`capsjax.common`).

``settings`` (:class:`~capsjax.config.settings.Setting`: a setting's default, meaning, type and
range; the one resolver of a table), ``registries`` (which class each name in a config means:
models, datasets, routers, evaluators), ``run_settings`` (the run's own settings), ``optimizer``
(``config.optimizer``'s), ``schema`` (:func:`~capsjax.config.schema.resolve_config`, what each
command does once at its entry: a frozen :class:`~capsjax.config.schema.ResolvedConfig`),
``runconfig`` (config files, ``config.json``), ``migrations`` (earlier forms of ``config.json``),
``history`` (what a resumed run changed), ``per_run`` (the numbers the runs of one program may
differ in) and ``precision`` (``matmul_precision``'s scope). Imports nothing by itself."""
