"""files: a failed write told apart by its error (a full disk, a read-only filesystem, no
permission; never memory, whatever the words RESOURCE_EXHAUSTED), named with its path and
the free space there, and atomic writes that leave the earlier file whole."""

import errno
import json
import os
import shutil

import pytest

from capsjax.common import files

# What Orbax raises for a checkpoint on a full disk (TensorStore's words, 0.12.8).
TENSORSTORE_FULL = (
    'RESOURCE_EXHAUSTED: Error writing "w/0.0" in OCDBT database at local file '
    '"/mnt/small/run/checkpoints/60.orbax-checkpoint-tmp/state.orbax-checkpoint-tmp/'
    'ocdbt.process_0/": Failed writing: "/mnt/small/run/checkpoints/60.orbax-checkpoint-tmp/'
    'state.orbax-checkpoint-tmp/ocdbt.process_0/d/f5b9": Failed to write 2546518 bytes to file '
    "11: No space left on device [os_error_code='28']")
# The same failure with the operating system's words left out: RESOURCE_EXHAUSTED on a file.
TENSORSTORE_WRITE = ('RESOURCE_EXHAUSTED: Error writing "w/0.0" in OCDBT database at local '
                     'file "/mnt/small/run/checkpoints/60.orbax-checkpoint-tmp/"')
XLA_MEMORY = ("RESOURCE_EXHAUSTED: Out of memory allocating 12884901888 bytes (while "
              "allocating buffer for the train step)")


def os_error(code: int, path: str = "/run/summary.json") -> OSError:
  return OSError(code, os.strerror(code), path)


def raised_from(error: BaseException, outer: BaseException | None = None):
  """``outer`` (a new RuntimeError by default: each wraps its own cause) raised from
  ``error``, as Orbax and TensorStore wrap what they hit."""
  outer = RuntimeError("Orbax: save failed") if outer is None else outer
  try:
    try:
      raise error
    except BaseException as e:
      raise outer from e
  except BaseException as wrapped:
    return wrapped


@pytest.mark.parametrize("error", [
    os_error(errno.ENOSPC), os_error(errno.EDQUOT), raised_from(os_error(errno.ENOSPC)),
    ValueError(TENSORSTORE_FULL), ValueError(TENSORSTORE_WRITE),
    ValueError("Failed to write: [os_error_code='122']")])  # EDQUOT, by its number.
def test_a_full_disk_is_told_by_its_error(error):
  assert files.is_disk_full(error) and files.is_file_write_error(error)
  assert not files.is_not_writable(error)
  assert isinstance(files.write_error(error), files.DiskFull)


@pytest.mark.parametrize("error", [
    ValueError(XLA_MEMORY), MemoryError(), RuntimeError("wrapped"), os_error(errno.ENOENT),
    ValueError("RESOURCE_EXHAUSTED: Error opening local file \"/data/x\": Too many open files")])
def test_memory_and_other_failures_are_not_a_failed_write(error):
  assert not files.is_disk_full(error) and not files.is_file_write_error(error)
  assert files.write_error(error) is None  # It surfaces unchanged.


@pytest.mark.parametrize("code, permission", [(errno.EROFS, False), (errno.EACCES, True),
                                              (errno.EPERM, True)])
def test_an_unwritable_file_is_told_by_its_error(code, permission):
  error = raised_from(os_error(code))
  assert files.is_not_writable(error) and not files.is_disk_full(error)
  # Only a read-only filesystem is surely a write's (EACCES may be a read's).
  assert files.is_file_write_error(error) is not permission
  named = files.write_error(error, what="the run's summary")
  assert isinstance(named, files.NotWritable)
  why = "permission denied" if permission else "it is on a read-only filesystem"
  assert str(named) == (f"Cannot write the run's summary (/run/summary.json): {why}; choose a "
                        "--workdir you can write to.")


def test_a_full_disk_names_the_path_the_free_space_and_what_to_free(tmp_path, monkeypatch):
  usage = shutil._ntuple_diskusage(total=62_914_560, used=62_902_272, free=12_288)
  monkeypatch.setattr(files.shutil, "disk_usage", lambda path: usage)
  monkeypatch.setattr(files, "mount_point", lambda path: "/mnt/small")
  path = str(tmp_path / "summary.json")
  named = files.disk_full(os_error(errno.ENOSPC, path), what="the run's summary")
  assert str(named) == (
      f"The disk is full: writing the run's summary ({path}) failed; 12.3 kB free of 62.9 MB "
      "on /mnt/small. Free space there (old runs' workdirs or checkpoints, "
      "damaged_checkpoints/ folders) or choose a --workdir on another disk, then rerun the "
      "same command: what was written before is intact, and a training run resumes from its "
      "last complete checkpoint.")
  # Without a path given, the one TensorStore names (its folder may not exist any more).
  assert "(/mnt/small/run/checkpoints/60.orbax-checkpoint-tmp/state" in str(
      files.disk_full(ValueError(TENSORSTORE_FULL), what="a checkpoint"))


def test_free_space_and_sizes(tmp_path):
  assert files.format_size(512) == "512 B" and files.format_size(12_288) == "12.3 kB"
  assert files.format_size(2.5e12) == "2.5 TB"
  text = files.free_space(str(tmp_path / "not" / "made" / "yet"))  # Its nearest folder's.
  assert " free of " in text and text.endswith(f" on {files.mount_point(str(tmp_path))}")


def test_writing_names_a_failed_write_and_passes_anything_else(tmp_path):
  path = str(tmp_path / "metrics.jsonl")
  with pytest.raises(files.DiskFull, match=r"writing the metrics log \(.*metrics.jsonl\)"):
    with files.writing(path, "the metrics log"):
      raise os_error(errno.ENOSPC, path)
  with pytest.raises(KeyError):  # A bug is not a failed write.
    with files.writing(path, "the metrics log"):
      raise KeyError("step")
  with pytest.raises(OSError) as raised:  # Nor is a missing folder.
    with files.writing(path, "the metrics log"):
      raise os_error(errno.ENOENT, path)
  assert raised.type is FileNotFoundError


def test_a_file_kept_open_raises_a_failed_write_once(tmp_path):
  writes = files.Writes(str(tmp_path / "metrics.jsonl"), "the metrics log")
  with writes.closing():  # Nothing failed: a close's failure is raised.
    pass
  with pytest.raises(files.NotWritable):
    with writes.closing():
      raise os_error(errno.EROFS)
  writes = files.Writes(str(tmp_path / "metrics.jsonl"), "the metrics log")
  with pytest.raises(files.DiskFull):
    with writes():
      raise os_error(errno.ENOSPC)
  with writes.closing():  # The same bytes fail again on close: raised once already.
    raise os_error(errno.ENOSPC)


def test_atomic_writes_leave_the_earlier_file_whole(tmp_path):
  path = str(tmp_path / "summary.json")
  files.write_json(path, {"a": 1})
  with pytest.raises(files.DiskFull, match=r"writing the run's summary \(.*summary.json\)"):
    with files.atomic_write(path, what="the run's summary") as f:
      f.write('{"a": ')
      raise os_error(errno.ENOSPC, f.name)
  assert json.loads(open(path).read()) == {"a": 1} and os.listdir(tmp_path) == ["summary.json"]
  with pytest.raises(ValueError, match="a crash mid-write"):
    with files.atomic_write(path) as f:
      f.write("half")
      raise ValueError("a crash mid-write")
  assert json.loads(open(path).read()) == {"a": 1} and os.listdir(tmp_path) == ["summary.json"]
