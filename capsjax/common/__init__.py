"""What every part of capsjax shares: errors (:mod:`capsjax.common.errors`), registries by name
or import path (``registry``), config variants as keywords (``config_args``), settings declared
beside their code and the one resolver (``settings``), the platform programs are built for
(``platform``), PNG figures (``figures``) and atomic files (``files``). Imports nothing by
itself."""
