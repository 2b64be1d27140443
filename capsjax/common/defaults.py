"""The one place for the defaults of keys a config may leave out (config files written before
the key existed, and workdirs' config.json of earlier versions): the dataset builder and the
model a config without ``dataset`` or ``model.name`` means.
:func:`capsjax.training.tasks.resolve_config` writes them into a run's resolved config, so
``config.json`` always names both."""

DATASET = "mnist"
MODEL = "capsnet"
