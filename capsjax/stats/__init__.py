"""The statistics of comparisons: two setups on the same examples (``paired``: these trained
models, digit by digit, and the setup, training runs as the units; the seed pairs a difference
needs), comparisons at matched familiar error (``matched``), and the test errors chosen during
training, kept apart for comparison only (``chosen``). Host-side NumPy; it reads the files the
run machinery writes (:mod:`capsjax.runs`: predictions, metrics, config.json) and imports
nothing above it (tests/test_import_layers.py). Imports nothing by itself."""
