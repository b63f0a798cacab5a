"""bench/vmm_costs.py on a machine without CUDA: its options parse, sizes read as the other bench
scripts read them, the pages kept resident go through the driver's calls in order and back, the
copying threads' waits return only once their event has passed and bad copy options are refused,
a pause of the copies wraps each timed stretch and opens only once the threads are quiet, and it
says plainly that it needs a device (the timed driver calls run on GPUs only)."""
import pathlib
import subprocess
import sys
import threading

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


class PendingEvent:
    """An event the fake driver reports not ready `pending` times, then done."""

    cuda_event = 0x1234

    def __init__(self, pending):
        self.pending = pending
        self.synchronized = False

    def synchronize(self):
        self.synchronized = True


class QueryDriver:
    def __init__(self, event):
        self.event, self.queries = event, 0

    def try_call(self, name, handle):
        assert name == "cuEventQuery" and handle.value == PendingEvent.cuda_event
        self.queries += 1
        if self.event.pending > 0:
            self.event.pending -= 1
            return vmm_costs.CUDA_ERROR_NOT_READY
        return 0


def test_a_polled_wait_asks_until_the_event_has_passed_and_a_blocking_one_blocks():
    event = PendingEvent(pending=3)
    driver = QueryDriver(event)
    vmm_costs.wait_for_event(driver, event, "poll")
    assert driver.queries == 4 and not event.synchronized
    blocked = PendingEvent(pending=3)
    vmm_costs.wait_for_event(QueryDriver(blocked), blocked, "block")
    assert blocked.synchronized


def test_a_polled_wait_raises_on_a_driver_error():
    class Failing(QueryDriver):
        def try_call(self, name, handle):
            return 700  # CUDA_ERROR_ILLEGAL_ADDRESS

    event = PendingEvent(pending=0)
    with pytest.raises(RuntimeError, match="cuEventQuery: CUDA error 700"):
        vmm_costs.wait_for_event(Failing(event), event, "poll")


def test_bad_copy_options_are_refused_and_no_copies_read_no():
    with pytest.raises(ValueError, match="copy wait"):
        vmm_costs.Copying(FakeDriver(), 8 << 20, wait="spin")
    with pytest.raises(ValueError, match="copy chunk"):
        vmm_costs.Copying(FakeDriver(), 512 << 20)
    with pytest.raises(ValueError, match="copy ways"):
        vmm_costs.Copying(FakeDriver(), 8 << 20, ways=("sideways",))
    assert vmm_costs.describe_copying(vmm_costs.contextlib.nullcontext()) == "no"


def test_the_busy_resident_and_copying_options_exist_and_a_cpu_machine_is_refused():
    shown = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0
    assert all(option in shown.stdout for option in ("--busy", "--resident", "--copying", "--copy-wait", "--copy-pause",
                                                     "--copy-ways"))
    unpaused = subprocess.run([sys.executable, str(SCRIPT), "--copy-pause"], capture_output=True, text=True, timeout=60)
    assert unpaused.returncode == 2 and "give --copying too" in unpaused.stderr
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the refusal is for machines without one")
    run = subprocess.run([sys.executable, str(SCRIPT), "--busy", "--resident", "1GiB", "--pages", "16MiB",
                          "--copying", "8MiB", "--copy-wait", "block"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0 and "needs a CUDA device" in run.stderr


def test_a_measurement_maps_sets_access_both_ways_and_gives_everything_back(monkeypatch):
    class Stream:
        def synchronize(self):
            pass

    class Allowing(FakeDriver):
        def try_call(self, name, *args):  # the whole range's unmap allowed, as on the H100 and H200
            self.call(name, *args)
            return 0

    monkeypatch.setattr(vmm_costs.torch.cuda, "current_stream", lambda: Stream())
    driver = Allowing()
    row = vmm_costs.measure(driver, 2 << 20, 6 << 20)
    calls = driver.calls
    # Access once over the range twice, then page by page; every page mapped is unmapped.
    assert calls.count("cuMemSetAccess") == 1 + 1 + 3
    assert calls.count("cuMemMap") == 3 * 3
    assert calls.count("cuMemUnmap") == 3 + 1 + 3  # one by one, the whole range at once, one by one
    assert calls[-1] == "cuMemAddressFree" and calls.count("cuMemRelease") == 3
    last_map = len(calls) - 1 - calls[::-1].index("cuMemMap")
    assert calls[last_map + 1:last_map + 4] == ["cuMemSetAccess"] * 3
    for key in ("noop_call_us", "map_us_per_page", "set_access_us_per_page", "set_access_each_us_per_page",
                "unmap_each_us_per_page", "release_us_per_page"):
        assert row[key] >= 0
    assert row["pages"] == 3 and row["busy"] is False


def test_a_pause_wraps_every_timed_stretch_and_each_page_of_access_set_page_by_page(monkeypatch):
    class Stream:
        def synchronize(self):
            pass

    monkeypatch.setattr(vmm_costs.torch.cuda, "current_stream", lambda: Stream())
    driver = FakeDriver()
    seen = []

    class Pause:
        def __enter__(self):
            seen.append(len(driver.calls))

        def __exit__(self, *exc):
            return False

    vmm_costs.measure(driver, 2 << 20, 6 << 20, around=Pause)
    # create, map, access over the range, unmap one by one, release: once each; access page by page:
    # once a page (3 pages).
    assert len(seen) == 5 + 3
    pages_by_page = [driver.calls[at] for at in seen if driver.calls[at] == "cuMemSetAccess"]
    assert len(pages_by_page) == 1 + 3


def test_quiet_opens_only_once_both_threads_have_nothing_queued_and_lets_them_go_after():
    copying = vmm_costs.Copying.__new__(vmm_costs.Copying)  # no device: the threads are stand-ins
    copying.hush, copying.stop, copying.errors = threading.Event(), threading.Event(), []
    copying.hushed = {way: threading.Event() for way in ("to_device", "to_host")}
    release = threading.Event()

    def stand_in(way):
        copying.hush.wait(5)
        if way == "to_host":
            release.wait(5)  # still draining its queued chunk
        copying.hushed[way].set()

    threads = [threading.Thread(target=stand_in, args=(way,)) for way in copying.hushed]
    for thread in threads:
        thread.start()
    opened = threading.Event()

    def pause():
        with copying.quiet():
            assert copying.hush.is_set()
            opened.set()

    pauser = threading.Thread(target=pause)
    pauser.start()
    assert not opened.wait(0.2)  # one way still has a chunk queued
    release.set()
    assert opened.wait(5)
    pauser.join(5)
    for thread in threads:
        thread.join(5)
    assert not copying.hush.is_set()  # the copies go on after
    copying.hushed["to_device"].clear()
    copying.errors.append("to_device: failed")
    with pytest.raises(RuntimeError, match="stopped before they were quiet"):
        with copying.quiet():
            pass


def test_a_row_of_copies_one_way_says_which():
    copying = vmm_costs.Copying.__new__(vmm_costs.Copying)  # no device: only what the words read
    copying.chunk, copying.wait, copying.gb_per_s = 8 << 20, "poll", {"to_device": 50.0}
    copying.buffers = {"to_device": None}
    assert vmm_costs.describe_copying(copying, paused=True) == (
        "8 MiB chunks into the device only, poll, paused for the calls, 50.0/0.0 GB/s in/out")
    copying.buffers = {"to_device": None, "to_host": None}
    assert vmm_costs.describe_copying(copying) == "8 MiB chunks, poll, 50.0/0.0 GB/s in/out"
