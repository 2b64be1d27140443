"""The dataset builder and the model a config without ``dataset`` or ``model.name`` means
(config files written before the key existed, and workdirs' config.json of earlier versions).
:func:`capsjax.training.tasks.resolve_config` writes them into a run's resolved config, so
``config.json`` always names both. The other keys a config may leave out are
``capsjax.common.config_keys.OPTIONAL_KEYS``."""

DATASET = "mnist"
MODEL = "capsnet"
