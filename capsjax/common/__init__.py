"""What every part of capsjax shares: errors (:mod:`capsjax.common.errors`), registries by name
or import path (``registry``), config variants as keywords (``config_args``), the default
dataset and model (``defaults``) and PNG figures (``figures``). Imports nothing by itself."""
