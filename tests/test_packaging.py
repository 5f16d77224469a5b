"""The package as a library: a wheel built from this tree carries the licence, `py.typed` and three
console scripts, and the scripts installed from it run the CLIs."""
import configparser
import importlib.metadata
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.helpers import REPO

SCRIPTS = {
    "hogwild-a3c-train": "hogwild_a3c.train:command",
    "hogwild-a3c-evaluate": "hogwild_a3c.evaluate:main",
    "hogwild-a3c-plot": "hogwild_a3c.plot:main",
}


def test_setup_cfg_declares_the_console_scripts_and_they_resolve_to_the_mains():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    lines = [line.strip() for line in cfg["options.entry_points"]["console_scripts"].splitlines() if line.strip()]
    declared = dict(line.split(" = ") for line in lines)
    assert declared == SCRIPTS
    for name, value in declared.items():
        target = importlib.metadata.EntryPoint(name, value, "console_scripts").load()
        assert callable(target) and (target.__module__, target.__name__) == tuple(value.split(":"))
    shipped = {item.strip() for item in cfg["options.package_data"]["hogwild_a3c"].split(",")}
    assert shipped == {"py.typed", "presets/*.json"}


def test_license_file_is_mit_and_matches_the_metadata():
    text = (REPO / "LICENSE").read_text()
    assert text.startswith("MIT License") and "Copyright (c) 2026 the hogwild_a3c authors" in text
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["metadata"]["license"] == "MIT" and cfg["metadata"]["license_files"] == "LICENSE"
    assert (REPO / "hogwild_a3c" / "py.typed").is_file()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """A wheel built from a copy of this tree (the tree itself gets no build/ or egg-info)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    src.mkdir()
    for name in ("setup.cfg", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "hogwild_a3c", src / "hogwild_a3c", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(base / "dist"),
         str(src)],
        check=True, capture_output=True, text=True, timeout=120,
    )
    (path,) = (base / "dist").glob("hogwild_a3c-*.whl")
    return path


def test_the_wheel_carries_license_py_typed_and_entry_points(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert "hogwild_a3c/py.typed" in names
        presets = {f"hogwild_a3c/presets/{name}.json" for name in ("atari", "universe", "vector")}
        assert presets <= set(names)
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        text = archive.read(entry_points).decode()
    for name, value in SCRIPTS.items():
        assert f"{name} = {value}" in text


def test_installed_console_scripts_run_the_clis(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=120)
    env = {**os.environ, "PYTHONPATH": str(target)}
    for name in SCRIPTS:
        proc = subprocess.run([str(target / "bin" / name), "--help"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.startswith("usage:"), (name, proc.stderr)
    # The script's exit status is main()'s: a usage error stays 2.
    proc = subprocess.run([str(target / "bin" / "hogwild-a3c-plot"), str(tmp_path / "nothing")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not a run directory" in proc.stderr
