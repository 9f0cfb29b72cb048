"""Where a reported number comes from: the code's commit (and whether the tree had uncommitted changes),
the package versions and the machine. Every report the tools write (quickstart `report.json`, evaluate
`summary.json`, sweep `DONE.json`) carries `provenance()` next to its full config.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys

PACKAGES = ("zarya_jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "transformers", "tokenizers",
            "safetensors", "numpy")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", _ROOT, *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_version() -> dict:
    """{'commit': sha or None (not a git checkout), 'dirty': uncommitted changes to tracked files}."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def describe(prov: dict) -> str:
    """The line a Markdown report opens with: 'Code: commit <sha12>[ (uncommitted changes)]; <devices>.'"""
    commit = (prov.get("commit") or "unknown")[:12] + (" (uncommitted changes)" if prov.get("dirty") else "")
    return f"Code: commit {commit}; {prov.get('devices', '')}."


def package_versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def provenance() -> dict:
    """Commit, dirty flag, package versions, Python, platform and the JAX devices."""
    import jax

    devices = jax.devices()
    return {**code_version(), "packages": package_versions(), "python": sys.version.split()[0],
            "platform": platform.platform(), "devices": f"{len(devices)} × {devices[0].device_kind}"}
