"""Which class each name in a config means: the models (``config.model.name``), datasets
(``config.dataset``), routers (``config.model.routing.name``) and evaluators
(``config.evals.NAME.type``).

Each is read from its package's files (:mod:`capsjax.common.registry`: a module registers by a
top-level ``MODEL = ...``, ``DATASET = ...``, ``ROUTER = ...`` or ``EVALUATOR = ...``; a
researcher's own class is named by import path). They live here, below every package they name,
so that resolving a config (:mod:`capsjax.config.schema`) finds each class's settings without
importing those packages statically.
"""

from capsjax.common.registry import Registry

MODELS = Registry("model", "config.model.name", "capsjax.models", "MODEL")
DATASETS = Registry("dataset", "config.dataset", "capsjax.datasets", "DATASET", attribute="name")
ROUTERS = Registry("router", "config.model.routing.name", "capsjax.routing", "ROUTER")
EVALUATORS = Registry("evaluator", "config.evals.NAME.type", "capsjax.evaluators",
                      "EVALUATOR", attribute="type_name")
