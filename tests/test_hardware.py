"""hardware: the devices line, and the warning when JAX fell back to the CPU."""

from capsjax.runs import hardware


def test_warns_only_on_cpu_with_an_accelerator_present(tmp_path, monkeypatch):
  monkeypatch.delenv("JAX_PLATFORMS", raising=False)
  gpu = tmp_path / "nvidia0"
  gpu.write_text("")
  files = ((str(tmp_path / "missing"), "a TPU", "tpu"), (str(gpu), "an NVIDIA GPU", "cuda12"))
  warning = hardware.cpu_fallback_warning("cpu", files)
  assert "an NVIDIA GPU" in warning and str(gpu) in warning and '".[cuda12]"' in warning
  assert hardware.cpu_fallback_warning("gpu", files) is None
  assert hardware.cpu_fallback_warning("cpu", files[:1]) is None
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")  # Chosen on purpose.
  assert hardware.cpu_fallback_warning("cpu", files) is None


def test_describe_names_backend_and_devices():
  line = hardware.describe()
  assert "backend cpu: 4 x cpu in 1 process(es)" in line
