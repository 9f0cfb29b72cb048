"""Packaging: Python ≥ 3.11, and every console script of pyproject.toml names a command line whose `--help` works
(the same `main` as its `python -m` module), ended as `python -m` ends it (`experiments.cli.main`)."""
import importlib
import os
import subprocess
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


def entry(name: str):
    """The object console script `name` calls (what pip's wrapper imports: `module:attr[.attr]`)."""
    module, _, attrs = SCRIPTS[name].partition(":")
    obj = importlib.import_module(module)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_console_script_help(name, capsys):
    script = entry(name)
    # A `cli.script`: the module's own `main`, ended by `cli.main`, not a bare `main` whose status pip's
    # wrapper hands to sys.exit (the interpreter teardown that crashes after a signal).
    assert getattr(script, "module", None), f"{name} → {SCRIPTS[name]} is not an experiments.cli.script"
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(script.module).main(["--help"])
    assert exit_info.value.code in (0, None)
    assert "usage:" in capsys.readouterr().out.lower()


@pytest.mark.parametrize("status", [0, 2, 130])
def test_console_script_exits_as_python_m(status, tmp_path):
    """What pip's wrapper runs (`sys.exit(script())`) for a command that returns `status`: the process exits
    with it, and after a signal (status > 128) without the interpreter's teardown (an atexit hook stands
    for the teardown that crashes while XLA's threads run)."""
    (tmp_path / "command_under_test.py").write_text(f"def main(argv=None):\n    return {status}\n")
    code = ("import atexit, sys; atexit.register(print, 'teardown ran', flush=True); "
            "from experiments.cli import script; sys.exit(script('command_under_test')())")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(Path(__file__).parents[1])]),
           "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr
    assert ("teardown ran" in proc.stdout) == (status <= 128)


def test_front_door_imported_on_first_use():
    """`from zarya_jax import Sampler, load_for_inference` (README) works, and `import zarya_jax` alone does
    not load the samplers (the root stays light for the commands and tools that only read configs)."""
    code = ("import sys, zarya_jax; assert 'zarya_jax.inference' not in sys.modules "
            "and 'zarya_jax.sampling' not in sys.modules, sorted(sys.modules); "
            "from zarya_jax import Sampler, load_for_inference; "
            "assert Sampler.__module__ == load_for_inference.__module__ == 'zarya_jax.inference'; "
            "assert set(zarya_jax.__all__) <= set(dir(zarya_jax)); "
            "print(hasattr(zarya_jax, 'no_such_name'))")
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
