"""Packaging: Python ≥ 3.11, and every console script of pyproject.toml names a command line whose `--help` works
(the same `main` as its `python -m` module)."""
import importlib
import sys
import tomllib
from pathlib import Path

import pytest

PYPROJECT = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
SCRIPTS = PYPROJECT["project"]["scripts"]


def test_python_version_and_extras():
    assert PYPROJECT["project"]["requires-python"] == ">=3.11" and sys.version_info >= (3, 11)
    extras = PYPROJECT["project"]["optional-dependencies"]
    for extra in ("eval", "wandb", "trackio"):  # the optional extras are all in the test extra, so CI tests them
        assert set(extras[extra]) <= set(extras["test"])


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_help(name, capsys):
    module, _, function = SCRIPTS[name].partition(":")
    main = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out.lower()
