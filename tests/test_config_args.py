"""config_args.parse_arg: config variants as keyword arguments, typed by their defaults, the
older single-token spellings kept; every config file's variants parsed the same way."""

import pathlib

import pytest

from capsjax.common import config_args
from capsjax.config import runconfig

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"


def test_keywords_bare_typed_and_defaults():
  args = config_args.parse_arg("smoke,width=8,rate=0.5,name=x", "f.py", smoke=False,
                               baseline=False, width=4, rate=1.0, name="a")
  assert args.to_dict() == {"smoke": True, "baseline": False, "width": 8, "rate": 0.5,
                            "name": "x"}
  assert isinstance(args.width, int) and isinstance(args.rate, float)
  assert config_args.parse_arg(None, "f.py", smoke=False).smoke is False
  assert config_args.parse_arg("", "f.py", smoke=False).smoke is False
  assert config_args.parse_arg(" smoke , ", "f.py", smoke=False).smoke is True
  assert config_args.parse_arg("smoke=false", "f.py", smoke=True).smoke is False
  with pytest.raises(AttributeError):  # Locked: a typo in the config file fails loudly.
    config_args.parse_arg("", "f.py", smoke=False).smok


def test_aliases_expand_to_keywords():
  args = config_args.parse_arg("baseline_smoke", "f.py", baseline=False, smoke=False,
                               aliases={"baseline_smoke": "baseline,smoke"})
  assert args.baseline and args.smoke


@pytest.mark.parametrize("arg,match", [
    ("smok", r"f.py: unknown variant keyword 'smok' in 'smok'; accepted \(with defaults\): "
             r"smoke=False, width=4"),
    ("width", r"variant keyword 'width' needs a value \(width=...\); its default is 4"),
    ("width=wide", r"variant keyword width='wide' is not a int \(its default is 4\)"),
    ("smoke=maybe", r"variant keyword smoke='maybe' is not a bool"),
])
def test_bad_keywords_are_named_with_what_is_accepted(arg, match):
  with pytest.raises(ValueError, match=match):
    config_args.parse_arg(arg, "f.py", smoke=False, width=4)


def test_config_files_combine_keywords_and_keep_the_old_spellings():
  affnist = runconfig.import_config_file(CONFIGS / "affnist.py")
  combined = affnist.get_config("baseline,smoke").to_dict()
  assert combined == affnist.get_config("smoke,baseline").to_dict()
  assert combined == affnist.get_config("baseline_smoke").to_dict()
  assert combined["model"]["name"] == "baseline_cnn"
  assert combined["model"]["conv_features"] == (8, 8, 4)  # The smoke sizes.
  with pytest.raises(ValueError, match="configs/affnist.py: unknown variant keyword 'tiny'"):
    affnist.get_config("tiny")


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.py")
                                        if p.stem != "images"))
def test_every_config_file_has_its_smoke_variant_and_refuses_unknown_ones(name):
  module = runconfig.import_config_file(CONFIGS / f"{name}.py")
  full, smoke = module.get_config(), module.get_config("smoke")
  assert smoke.train.num_steps < 100 and full.to_dict() != smoke.to_dict()
  assert module.get_config("").to_dict() == full.to_dict()
  with pytest.raises(ValueError, match=f"configs/{name}.py: unknown variant keyword"):
    module.get_config("nonsense")
