"""The routing-diagnostics figure draws what a router supplied, and nothing it did not."""

from capsjax.common import figures


def _panels(monkeypatch, records):
  drawn = []
  monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(
      [ax.get_title() for ax in fig.axes if ax.axison]))
  figures.save_routing_diagnostics("unused.png", records)
  return drawn


def test_one_panel_per_supplied_diagnostic_from_the_last_record_that_has_any(monkeypatch):
  records = [
      {"kind": "test", "step": 10, "accuracy": 0.5, "coupling_entropy": [2.3, 2.0, 1.9],
       "logit_change": [0.0, 0.4, 0.1]},
      {"kind": "test", "step": 20, "accuracy": 0.9, "by_shift": {"0": 0.9},
       "coupling_entropy": [2.30], "agreement": [0.7], "pose_change": [1.2]},
      {"kind": "train", "step": 21, "loss": 0.1},
  ]
  assert _panels(monkeypatch, records) == [["coupling_entropy", "agreement", "pose_change"]]


def test_no_figure_without_routing_diagnostics(monkeypatch):
  assert _panels(monkeypatch, [{"kind": "test", "step": 5, "accuracy": 0.5,
                                "by_shift": {"1": 0.4}}]) == []
