"""What every part of capsjax shares: errors (:mod:`capsjax.common.errors`), registries by name
or import path (``registry``), config variants as keywords (``config_args``), the platform
programs are built for (``platform``), PNG figures (``figures``) and atomic files (``files``).
The settings and their resolution are :mod:`capsjax.config`'s. Imports nothing by itself."""
