"""bench/vmm_costs.py on a machine without CUDA: its options parse, sizes read as the other bench
scripts read them, the pages kept resident go through the driver's calls in order and back, and
it says plainly that it needs a device (the timed driver calls run on GPUs only)."""
import pathlib
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import vmm_costs  # noqa: E402

SCRIPT = pathlib.Path(vmm_costs.__file__)


def test_sizes_parse():
    assert vmm_costs.parse_size("16MiB") == 16 << 20
    assert vmm_costs.parse_size("1.5GiB") == 3 << 29
    assert vmm_costs.parse_size("0") == 0


class FakeDriver:
    """Records each call's name; reserves at 0x1000000."""

    device = 0

    def __init__(self):
        self.calls = []

    def call(self, name, *args):
        self.calls.append(name)
        if name == "cuMemAddressReserve":
            args[0]._obj.value = 0x1000000

    try_call = call


def test_resident_pages_are_mapped_for_the_duration_and_given_back():
    driver = FakeDriver()
    with vmm_costs.resident(driver, 2 << 20, 6 << 20) as held:
        assert held == 3
        assert driver.calls == ["cuMemCreate"] * 3 + ["cuMemAddressReserve"] + ["cuMemMap"] * 3 + ["cuMemSetAccess"]
    assert driver.calls[8:] == ["cuMemUnmap"] * 3 + ["cuMemRelease"] * 3 + ["cuMemAddressFree"]
    # Less than a page: nothing is made.
    nothing = FakeDriver()
    with vmm_costs.resident(nothing, 2 << 20, 1 << 20) as held:
        assert held == 0
    assert nothing.calls == []


def test_the_busy_and_resident_options_exist_and_a_cpu_machine_is_refused():
    shown = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--busy" in shown.stdout and "--resident" in shown.stdout
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for machines without one")
    run = subprocess.run([sys.executable, str(SCRIPT), "--busy", "--resident", "1GiB", "--pages", "16MiB"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "needs a CUDA device" in run.stderr
