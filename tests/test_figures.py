"""The routing-diagnostics figure draws what a router supplied, and nothing it did not."""

from capsjax.common import figures


def _panels(monkeypatch, records):
  drawn = []
  monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(
      [ax.get_title().split("\n")[0] for ax in fig.axes if ax.axison]))
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


def test_a_tiny_change_is_said_and_drawn_as_tiny(monkeypatch):
  """The trained model's coupling entropy moves 2.3026 -> 2.3010 (0.07%): the title says so
  and the axis spans at least 2% of the values, not the change alone."""
  drawn = []
  monkeypatch.setattr(figures, "save", lambda fig, path: drawn.append(
      [(ax.get_title(), ax.get_ylim()) for ax in fig.axes if ax.axison]))
  figures.save_routing_diagnostics("unused.png", [
      {"kind": "test", "step": 5, "coupling_entropy": [2.3026, 2.3018, 2.3010]}])
  [[(title, (low, high))]] = drawn
  assert title == "coupling_entropy\n2.3026 -> 2.301 (-0.069%)"
  assert high - low >= 0.02 * 2.3010
  assert figures.change_text([0.1, 0.4]) == "0.1 -> 0.4 (+300%)"
  assert figures.change_text([0.0, 0.5]) == "0 -> 0.5"
