"""The side panel is installed with the distribution: `pip install` (editable or not) runs the
build hook and puts the prebuilt extension where JupyterLab looks for it."""

import json
from importlib.metadata import version
from pathlib import Path

import pytest

jupyter_paths = pytest.importorskip("jupyter_core.paths")

NAME = "cellscale-labextension"


def _installed() -> Path:
    for root in jupyter_paths.jupyter_path("labextensions"):
        if (Path(root) / NAME / "package.json").is_file():
            return Path(root) / NAME
    pytest.fail(
        f"{NAME} is not installed in any of {jupyter_paths.jupyter_path('labextensions')}: "
        f"run scripts/install (or `.venv/bin/pip install -e .`)"
    )


def test_the_built_panel_is_installed_with_the_distribution():
    ext = _installed()
    meta = json.loads((ext / "package.json").read_text())
    assert meta["name"] == NAME
    assert meta["version"] == version("cellscale"), "labextension/package.json and pyproject.toml disagree on version"
    build = meta["jupyterlab"]["_build"]  # written by the builder: the package is built, not just copied
    assert (ext / build["load"]).is_file()
    install = json.loads((ext / "install.json").read_text())
    assert install["packageName"] == "cellscale"
