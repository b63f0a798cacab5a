"""The package's entry points: `python -m teraio` (version, demo) and setup.py's metadata."""
import os
import pathlib
import re
import subprocess
import sys

import teraio

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_module(*args, cwd=None):
    package_root = str(pathlib.Path(teraio.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "teraio", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)


def test_version_names_the_build():
    done = run_module("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"teraio {teraio.__version__} (torch ")


def test_setup_py_reads_the_package_version():
    text = (ROOT / "setup.py").read_text()
    assert "version=version()" in text
    init = (ROOT / "python" / "teraio" / "__init__.py").read_text()
    assert re.search(r'^__version__ = "([^"]+)"', init, re.MULTILINE).group(1) == teraio.__version__


def test_unknown_command_and_bad_arguments_are_refused():
    assert run_module("train").returncode == 2
    done = run_module("demo", "--steps", "2")
    assert done.returncode == 2 and "--steps must exceed" in done.stderr


def test_demo_passes_on_a_tiny_model(tmp_path):
    done = run_module("demo", "--size", "tiny", "--steps", "6", "--out", str(tmp_path / "out"))
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "PASS: 6 losses" in done.stdout
    for name in ("trace.json", "plan.json", "timeline.json", "report.json"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
    assert not list((tmp_path / "out" / "swap").iterdir()), "the demo left its swap file behind"
