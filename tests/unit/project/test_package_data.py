"""Every file the packages read at run time ships in the wheel: each non-Python file under
`rclc/` and `rclc_graph/` matches a `[tool.setuptools.package-data]` pattern of its package
(setuptools expands them with glob, relative to the package folder, as here). A file left
out works from a checkout and fails only once installed (the web UI, the task families'
`words.yaml`)."""

from __future__ import annotations

import glob
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.paths import ROOT


def _data_files() -> list[str]:
    """The non-Python files under both packages, as paths in a wheel."""
    found = []
    for package in ("rclc", "rclc_graph"):
        for path in sorted((ROOT / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".py", ".pyc"):
                found.append(path.relative_to(ROOT).as_posix())
    return found


def test_every_data_file_in_the_packages_is_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {f"{package}/{path}" for package in ("rclc", "rclc_graph") for pattern in patterns.get(package, [])
               for path in glob.glob(pattern, root_dir=ROOT / package)}
    unshipped = [path for path in _data_files() if path not in shipped]
    assert unshipped == [], "add these to [tool.setuptools.package-data] in pyproject.toml"


def test_a_built_wheel_holds_every_data_file(tmp_path):
    """The same, from a wheel setuptools builds (a copy of the sources, so no build folder or
    egg-info lands in the checkout)."""
    pytest.importorskip("setuptools")
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in ("rclc", "rclc_graph"):
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index",
         "--wheel-dir", str(tmp_path / "dist"), str(source)],
        check=True, capture_output=True, timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "rclc_graph/experiments/tasks/words.yaml" in names
    assert [path for path in _data_files() if path not in names] == []
