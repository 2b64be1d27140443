"""The training loop and what it runs: a task (dataset builder + model, and the one forward
function: ``tasks``), the evaluation runner (``evaluation``), the set-up every command shares
(``runtime``), the train state and jitted step (``train_step``), the step arithmetic (``plan``),
optimisers and schedules (``optimizers``), the train log and its watches (``train_log``,
``monitors``), ensembles (``ensemble``) and a run's figures (``run_figures``). The loop itself
is :func:`capsjax.train.train_and_evaluate`. Imports nothing by itself."""
