"""bench/vmm_costs.py on a machine without CUDA: its options parse, sizes read as the other bench
scripts read them, and it says plainly that it needs a device (the driver calls run on GPUs only)."""
import importlib.util
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "bench" / "vmm_costs.py"


def load():
    spec = importlib.util.spec_from_file_location("vmm_costs", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sizes_parse():
    vmm_costs = load()
    assert vmm_costs.parse_size("16MiB") == 16 << 20
    assert vmm_costs.parse_size("1.5GiB") == 3 << 29
    assert vmm_costs.parse_size("0") == 0


def test_the_busy_and_resident_options_exist_and_a_cpu_machine_is_refused():
    shown = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--busy" in shown.stdout and "--resident" in shown.stdout
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for machines without one")
    run = subprocess.run([sys.executable, str(SCRIPT), "--busy", "--resident", "1GiB", "--pages", "16MiB"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "needs a CUDA device" in run.stderr
