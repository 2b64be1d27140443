"""The config: what a run's settings are and how a config file becomes one run's resolved config
(:func:`~capsjax.config.schema.resolve_config`: a frozen
:class:`~capsjax.config.schema.ResolvedConfig`), below everything that reads it (it imports only
:mod:`capsjax.common`). What each module holds: docs/code.md. Imports nothing by itself."""
