"""The training loop and what it runs: a task (dataset builder + model, and the one forward
function: ``tasks``), the evaluation batched (``evaluation``), the set-up every command shares
(``setup``), the train state and jitted step (``train_step``), the step arithmetic (``budget``),
optimisers and schedules (``optimizers``), the train log that feeds the model's watches
(``train_log``), restoring a run to evaluate it (``restoring``), ensembles (``ensemble``), a
run's figures (``run_figures``), a sweep's results (``sweep_results``), its search of each
point's hyperparameters and their trials (``search``, ``trials``), which runs share one
program (``vectorize``) and a step's memory (``memory``). The config they read is
:mod:`capsjax.config`'s. The loop itself is :func:`capsjax.train.train_and_evaluate`. Imports
nothing by itself."""
