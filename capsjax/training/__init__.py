"""The training loop and what it runs, a module each (docs/code.md says what each holds, in the
row of ``capsjax/training/``). The config they read is :mod:`capsjax.config`'s. The loop itself
is :func:`capsjax.train.train_and_evaluate`. Imports nothing by itself."""
