"""What every part of capsjax shares: errors (:mod:`capsjax.common.errors`), registries by name
or import path (``registry``), config variants as keywords (``config_args``), the default
dataset and model (``defaults``), PNG figures (``figures``), atomic files (``files``), the
platform programs are built for (``platform``) and the keys config files declare without JAX
(``config_keys``). Imports nothing by itself."""
