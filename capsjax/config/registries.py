"""Which class each name in a config means: the models (``config.model.name``), datasets
(``config.dataset``), routers (``config.model.routing.name``) and evaluators
(``config.evals.NAME.type``), each a table of names to import paths
(:class:`capsjax.common.registry.Registry`).

They live here, below every package they name, so that resolving a config
(:mod:`capsjax.config.schema`) finds each class's settings without importing the packages
statically: a class is imported when it is first asked for, so a module that fails to import
breaks only the configs that use it. A researcher's own class needs no line here: the config
names it by import path (``"package.module:Class"`` or ``"path/to/file.py:Class"``).
"""

from capsjax.common.registry import Registry

# name -> "module:Class": one line per model.
MODELS = Registry("model", "config.model.name", {
    "capsnet": "capsjax.models.capsnet:CapsNet",
    "baseline_cnn": "capsjax.models.baseline_cnn:BaselineCNN",
    "efficient_capsnet": "capsjax.models.efficient_capsnet:EfficientCapsNet",
    "em_capsnet": "capsjax.models.em_capsnet:EMCapsNet",
})

# name -> "module:Class": one line per dataset.
DATASETS = Registry("dataset", "config.dataset", {
    "mnist": "capsjax.datasets.mnist:MNIST",
    "multimnist": "capsjax.datasets.multimnist:MultiMNIST",
    "cifar10": "capsjax.datasets.images:CIFAR10",
    "svhn": "capsjax.datasets.images:SVHN",
    "smallnorb": "capsjax.datasets.images:SmallNORB",
}, attribute="name")

# name -> "module:ROUTER": one line per router.
ROUTERS = Registry("router", "config.model.routing.name", {
    "dynamic": "capsjax.routing.dynamic:ROUTER",
    "uniform": "capsjax.routing.uniform:ROUTER",
    "random": "capsjax.routing.random_coupling:ROUTER",
    "self_attention": "capsjax.routing.self_attention:ROUTER",
    "inverted_dot_product": "capsjax.routing.inverted_dot_product:ROUTER",
    "self_routing": "capsjax.routing.self_routing:ROUTER",
    "em": "capsjax.routing.em:ROUTER",
    "variational_bayes": "capsjax.routing.variational_bayes:ROUTER",
})

# type -> "module:Class": one line per evaluator.
EVALUATORS = Registry("evaluator", "config.evals.NAME.type", {
    "split": "capsjax.evaluators.splits:SplitEvaluator",
    "shifted": "capsjax.evaluators.splits:ShiftGridEvaluator",
    "randomly_shifted": "capsjax.evaluators.splits:RandomlyShiftedEvaluator",
    "affine_mnist": "capsjax.evaluators.affine:AffineMNISTEvaluator",
    "affnist": "capsjax.evaluators.affine:AffNISTEvaluator",
    "adversarial": "capsjax.evaluators.adversarial:AdversarialEvaluator",
    "reconstruction_detection": "capsjax.evaluators.detection:ReconstructionDetectionEvaluator",
    "transforms": "capsjax.evaluators.transforms:TransformsEvaluator",
    "crop_average": "capsjax.evaluators.crops:CropAverageEvaluator",
}, attribute="type_name")
