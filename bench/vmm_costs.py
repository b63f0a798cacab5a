"""What CUDA's virtual memory calls cost on this machine, per call and per GiB, at two page sizes.

teraio.paged maps every block from 2 MiB pages (the driver's granularity). On W3 it spent
74 microseconds per page mapping and 33 per page unmapping (bench/RESULTS.md, session 25), while
PyTorch's expandable segments map 20 MiB handles. Whether larger pages would cut that cost depends
on whether the driver charges per call or per byte, which this measures: it creates --total of
pages of each size, maps them one by one into one reserved range, sets access once, unmaps them
one by one, maps them again and unmaps the whole range in one call (to see whether the driver
allows that), and releases them. The driver is reached through ctypes (libcuda.so.1), in the
primary context PyTorch makes current.

On W3 under TeraIO (sessions 41-42, an H200) mapping cost 120-220 µs per 16 MiB page, against
4 µs per cuMemMap and 27-36 µs per page of cuMemSetAccess measured here. Conditions of a training
step that may explain it can be set: --busy keeps the GPU running matmuls on a stream of its own
while the calls are timed, and --resident maps that many bytes of pages elsewhere first, as the
allocator holds the rest of the device mapped (session 42: neither changes the cost). --copying
CHUNK keeps both copy engines busy as TeraIO's copier does: a thread a direction copies CHUNK
bytes at a time between pinned host memory and the device, two chunks queued on a stream of its
own, and looks whether the oldest is done every 5 µs (--copy-wait poll, as the copier's
dispatchers) or blocks on it (--copy-wait block, no thread in the driver meanwhile). Each row
also times a driver call that does nothing (cuDriverGetVersion), so that a cost that the
threads' contention for Python's lock adds shows apart from the driver's.

Session 43 found the calls 10-25 times dearer while copies run both ways (set access about 1 ms
a 16 MiB page with 8 MiB chunks, 39 µs idle). --copy-pause tests the remedy TeraIO's allocator
could take: before each timed stretch of driver calls the copying threads stop queueing chunks
and wait for those queued, and the stretch's time includes that wait; set access page by page
then pauses the copies around each page (the most pauses a mapping could cost). --copy-ways in
or out copies one way only: whether holding one direction would do.

    python3 bench/vmm_costs.py [--total 8GiB] [--pages 2MiB,32MiB] [--busy] [--resident 64GiB]
                               [--copying 8MiB [--copy-wait poll|block] [--copy-ways both|in|out]
                                [--copy-pause]]
                               [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import math
import threading
import time

import torch

MIB = 1 << 20
GIB = 1 << 30
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CUDA_ERROR_NOT_READY = 600
PR_SET_TIMERSLACK = 29


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def parse_size(text):
    units = {"KiB": 1 << 10, "MiB": MIB, "GiB": GIB}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * factor)
    return int(text)


class Driver:
    def __init__(self, device):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.device = device

    def call(self, name, *args):
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(text))
            raise RuntimeError(f"{name}: {text.value.decode() if text.value else rc}")

    def try_call(self, name, *args):
        return getattr(self.lib, name)(*args)


def noop_call_us(driver, calls=2000):
    """Mean µs of a driver call that does no work: what the host's threads add to every call."""
    version = ctypes.c_int()
    start = time.perf_counter()
    for _ in range(calls):
        driver.call("cuDriverGetVersion", ctypes.byref(version))
    return (time.perf_counter() - start) / calls * 1e6


def wait_for_event(driver, event, wait):
    """Returns once the device has run past `event`: "block" blocks on it (Python's lock released
    meanwhile), "poll" asks the driver every 5 µs, as TeraIO's copy lanes ask."""
    if wait == "block":
        event.synchronize()
        return
    while (rc := driver.try_call("cuEventQuery", ctypes.c_void_p(event.cuda_event))) == CUDA_ERROR_NOT_READY:
        time.sleep(5e-6)
    if rc != 0:
        raise RuntimeError(f"cuEventQuery: CUDA error {rc}")


class Copying:
    """While open, copies of `chunk` bytes run between pinned host memory and the device, in each of
    `ways` ("to_device", "to_host"; both unless given) from a thread of its own on a stream of its
    own with `depth` chunks queued, as TeraIO's copy lanes run them (copy_lane_cuda.cpp: a window
    of 2, a look every 5 µs with a 1 µs timer slack). wait="poll" looks whether the oldest chunk is
    done (cuEventQuery) every 5 µs; wait="block" blocks on it (events made with blocking sync:
    without it the driver spins). Each thread records a ring of `depth` events made once, as the
    copier takes its events from a pool: making and destroying one a chunk would add driver calls
    the copier does not make. After closing, `gb_per_s` holds each direction's rate while open;
    read it before trusting a row (at small chunks the threads' Python may not keep the engines
    busy). While quiet() is open the threads queue nothing, and it opens once the chunks they had
    queued are done."""

    WAITS = ("poll", "block")
    WAYS = ("to_device", "to_host")

    def __init__(self, driver, chunk, wait="poll", buffer=256 * MIB, depth=2, ways=WAYS):
        if wait not in self.WAITS:
            raise ValueError(f"copy wait must be one of {self.WAITS}, got {wait!r}")
        if not ways or any(way not in self.WAYS for way in ways):
            raise ValueError(f"copy ways must be some of {self.WAYS}, got {ways!r}")
        if chunk <= 0 or chunk > buffer:
            raise ValueError(f"a copy chunk must be 1 byte to {buffer} bytes, got {chunk}")
        self.driver, self.chunk, self.wait, self.depth = driver, chunk, wait, depth
        self.count = buffer // chunk
        self.buffers = {way: (torch.empty(buffer, dtype=torch.uint8, pin_memory=True),
                              torch.empty(buffer, dtype=torch.uint8, device="cuda"))
                        for way in ways}
        self.stop = threading.Event()
        self.hush = threading.Event()  # set: queue nothing more
        self.hushed = {way: threading.Event() for way in self.buffers}  # set: nothing of it queued
        self.moved = {}
        self.errors = []
        self.gb_per_s = {}

    def _feed(self, way, device):
        try:
            torch.cuda.set_device(device)
            if self.wait == "poll":
                with contextlib.suppress(AttributeError, OSError):  # Linux's; elsewhere the looks are rarer
                    ctypes.CDLL(None).prctl(PR_SET_TIMERSLACK, 1000, 0, 0, 0)  # this thread's, as the copier's
            host, dev = self.buffers[way]
            source, target = (host, dev) if way == "to_device" else (dev, host)
            stream, queued, copies = torch.cuda.Stream(), collections.deque(), 0
            # Recorded again only once waited for: the oldest of `depth` queued is waited for below.
            ring = [torch.cuda.Event(blocking=self.wait == "block") for _ in range(self.depth)]
            while not self.stop.is_set():
                if self.hush.is_set():
                    while queued:
                        wait_for_event(self.driver, queued.popleft(), self.wait)
                    self.hushed[way].set()
                    while self.hush.is_set() and not self.stop.is_set():
                        time.sleep(5e-6)
                    self.hushed[way].clear()
                    continue
                at = (copies % self.count) * self.chunk
                with torch.cuda.stream(stream):
                    target[at:at + self.chunk].copy_(source[at:at + self.chunk], non_blocking=True)
                event = ring[copies % self.depth]
                event.record(stream)
                queued.append(event)
                copies += 1
                if len(queued) >= self.depth:
                    wait_for_event(self.driver, queued.popleft(), self.wait)
            stream.synchronize()
            self.moved[way] = copies * self.chunk
        except Exception as e:  # reported by __exit__, on the measuring thread
            self.errors.append(f"{way}: {e}")

    def __enter__(self):
        self.threads = [threading.Thread(target=self._feed, args=(way, torch.cuda.current_device()), daemon=True)
                        for way in self.buffers]
        self.started = time.perf_counter()
        for thread in self.threads:
            thread.start()
        time.sleep(0.2)  # both ways moving before anything is timed
        return self

    @contextlib.contextmanager
    def quiet(self):
        """The copy engines idle for the duration: no thread queues a chunk, and it opens once
        those queued are done."""
        self.hush.set()
        try:
            for hushed in self.hushed.values():
                while not hushed.wait(0.001):
                    if self.errors or self.stop.is_set():
                        raise RuntimeError("the copying threads stopped before they were quiet")
            yield
        finally:
            self.hush.clear()

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join()
        seconds = time.perf_counter() - self.started
        if self.errors:
            raise RuntimeError("copies beside the timed calls failed: " + "; ".join(self.errors))
        self.gb_per_s = {way: moved / seconds / 1e9 for way, moved in self.moved.items()}
        return False


def timed(function, around=contextlib.nullcontext):
    """Seconds `function` took, `around`'s opening and closing included."""
    start = time.perf_counter()
    with around():
        function()
    return time.perf_counter() - start


class Pages:
    """`count` pages of `page` bytes on the driver's device and one address range for them: each
    driver step the measurements time, and resident() uses, as a method."""

    def __init__(self, driver, page, count):
        self.driver, self.page, self.count = driver, page, count
        self.prop = AllocationProp(type=CU_MEM_ALLOCATION_TYPE_PINNED,
                                   location=Location(CU_MEM_LOCATION_TYPE_DEVICE, driver.device))
        self.access = AccessDesc(location=Location(CU_MEM_LOCATION_TYPE_DEVICE, driver.device),
                                 flags=CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
        self.handles = [ctypes.c_ulonglong() for _ in range(count)]
        self.base = ctypes.c_ulonglong()

    def address(self, i):
        return ctypes.c_ulonglong(self.base.value + i * self.page)

    def create(self):
        for handle in self.handles:
            self.driver.call("cuMemCreate", ctypes.byref(handle), ctypes.c_size_t(self.page), ctypes.byref(self.prop),
                             ctypes.c_ulonglong(0))

    def reserve(self):
        self.driver.call("cuMemAddressReserve", ctypes.byref(self.base), ctypes.c_size_t(self.count * self.page),
                         ctypes.c_size_t(self.page), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0))

    def map_all(self):
        for i, handle in enumerate(self.handles):
            self.driver.call("cuMemMap", self.address(i), ctypes.c_size_t(self.page), ctypes.c_size_t(0), handle,
                             ctypes.c_ulonglong(0))

    def set_access(self):
        self.driver.call("cuMemSetAccess", self.base, ctypes.c_size_t(self.count * self.page),
                         ctypes.byref(self.access), ctypes.c_size_t(1))

    def set_access_each(self, around=contextlib.nullcontext):
        for i in range(self.count):
            with around():
                self.driver.call("cuMemSetAccess", self.address(i), ctypes.c_size_t(self.page),
                                 ctypes.byref(self.access), ctypes.c_size_t(1))

    def unmap_each(self):
        for i in range(self.count):
            self.driver.call("cuMemUnmap", self.address(i), ctypes.c_size_t(self.page))

    def unmap_whole(self):
        """One cuMemUnmap for the whole range: the driver's status (0 if it allowed that)."""
        return self.driver.try_call("cuMemUnmap", self.base, ctypes.c_size_t(self.count * self.page))

    def release(self):
        for handle in self.handles:
            self.driver.call("cuMemRelease", handle)

    def unreserve(self):
        self.driver.call("cuMemAddressFree", self.base, ctypes.c_size_t(self.count * self.page))


@contextlib.contextmanager
def resident(driver, page, total):
    """`total` bytes of `page`-sized pages created, mapped into one range and made accessible for
    the duration, as the allocator holds the device mapped while it maps more; nothing if 0."""
    pages = Pages(driver, page, total // page)
    if pages.count == 0:
        yield 0
        return
    pages.create()
    pages.reserve()
    pages.map_all()
    pages.set_access()
    try:
        yield pages.count
    finally:
        pages.unmap_each()
        pages.release()
        pages.unreserve()


def keep_busy(seconds):
    """Queues about `seconds` of matmuls on a stream of their own and returns it: the calls timed
    next then run while kernels do, as in a training step. Fewer launches than CUDA's queue
    holds, so that queuing them does not block the host."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        a = torch.randn(8192, 8192, device="cuda")
        a @ a  # the first launch loads the kernel
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(4):
            a @ a
        stream.synchronize()
        one = (time.perf_counter() - start) / 4
        for _ in range(min(800, math.ceil(seconds / one))):
            a @ a
    return stream


def measure(driver, page, total, busy_s=0.0, around=contextlib.nullcontext):
    """One row. `around` opens before each timed stretch of driver calls (and before each page's
    call in set access page by page) and closes after it; its time counts in the stretch's."""
    pages = Pages(driver, page, total // page)
    count = pages.count
    row = {"page_bytes": page, "pages": count, "total_bytes": count * page}
    busy = keep_busy(busy_s) if busy_s > 0 else None
    row["noop_call_us"] = noop_call_us(driver)
    row["create_s"] = timed(pages.create, around)
    pages.reserve()
    row["map_s"] = timed(pages.map_all, around)
    row["set_access_s"] = timed(pages.set_access, around)
    # Not torch.cuda.synchronize(): that would wait for the busy stream too.
    torch.cuda.current_stream().synchronize()
    row["unmap_each_s"] = timed(pages.unmap_each, around)
    pages.map_all()
    pages.set_access()
    start = time.perf_counter()
    rc = pages.unmap_whole()
    row["unmap_whole_s"] = time.perf_counter() - start
    row["unmap_whole_allowed"] = rc == 0
    if rc != 0:
        pages.unmap_each()
    # Access set page by page: whether the driver charges per call or per page mapped. Timed on
    # the pages' third mapping, the whole range's on their first.
    pages.map_all()
    row["set_access_each_s"] = timed(lambda: pages.set_access_each(around))
    pages.unmap_each()
    row["release_s"] = timed(pages.release, around)
    pages.unreserve()
    # Kernels still queued after the last call ran through all of them; if they ended before,
    # this was not a busy measurement.
    row["busy"] = busy is not None
    if busy is not None:
        if busy.query():
            row["busy"] = "ran out"
        busy.synchronize()
    for key in ("create", "map", "set_access", "set_access_each", "unmap_each", "release"):
        row[f"{key}_us_per_page"] = row[f"{key}_s"] / count * 1e6
        row[f"{key}_s_per_gib"] = row[f"{key}_s"] / (count * page / GIB)
    return row


def describe_copying(copying, paused=False):
    """The copies beside a row's calls in words: chunk, wait, whether paused and each way's rate;
    "no" without."""
    if not isinstance(copying, Copying):
        return "no"
    rates = "/".join(f"{copying.gb_per_s.get(way, 0):.1f}" for way in Copying.WAYS)
    pause = ", paused for the calls" if paused else ""
    ways = "" if len(copying.buffers) == len(Copying.WAYS) else (" into the device only" if "to_device" in
                                                                   copying.buffers else " out of the device only")
    return f"{copying.chunk / MIB:g} MiB chunks{ways}, {copying.wait}{pause}, {rates} GB/s in/out"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total", default="8GiB", help="bytes of pages per size (default %(default)s)")
    p.add_argument("--pages", default="2MiB,32MiB", help="page sizes, comma-separated (default %(default)s)")
    p.add_argument("--busy", action="store_true",
                   help="time the calls while matmuls run on a stream of their own (about 5 s of them a page size)")
    p.add_argument("--resident", default="0",
                   help="bytes of pages (of each size measured) to create and map elsewhere first (default none)")
    p.add_argument("--copying", default="0",
                   help="time the calls while copies of this many bytes run both ways, host and device "
                        "(as TeraIO's copier: 8MiB; default none)")
    p.add_argument("--copy-wait", choices=Copying.WAITS, default="poll",
                   help="how the copying threads wait for their chunks: poll every 5 µs, as TeraIO's "
                        "dispatchers do, or block (default %(default)s)")
    p.add_argument("--copy-ways", choices=("both", "in", "out"), default="both",
                   help="with --copying: copies both ways, into the device only or out of it only (whether the "
                        "allocator need hold one direction only; default %(default)s)")
    p.add_argument("--copy-pause", action="store_true",
                   help="with --copying: the copies stop and drain before each timed stretch of calls "
                        "(its time included), as TeraIO's allocator could pause its copier to map")
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args()
    total, resident_bytes, chunk = parse_size(args.total), parse_size(args.resident), parse_size(args.copying)
    pages = [parse_size(size) for size in args.pages.split(",")]
    if args.copy_pause and not chunk:
        p.error("--copy-pause pauses the copies of --copying: give --copying too")
    ways = {"both": Copying.WAYS, "in": ("to_device",), "out": ("to_host",)}[args.copy_ways]
    if not torch.cuda.is_available():
        raise SystemExit("vmm_costs.py needs a CUDA device")
    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    driver = Driver(torch.cuda.current_device())
    rows = []
    for page in pages:
        with resident(driver, page, resident_bytes) as held:
            copying = Copying(driver, chunk, args.copy_wait, ways=ways) if chunk else contextlib.nullcontext()
            around = copying.quiet if args.copy_pause else contextlib.nullcontext
            with copying:
                rows.append(measure(driver, page, total, busy_s=5.0 if args.busy else 0.0, around=around))
            rows[-1].update(resident_pages=held, copying=describe_copying(copying, args.copy_pause))
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| page | pages | GPU busy | pages mapped elsewhere | copies both ways | a no-op driver call (µs) | "
          "create (µs/page) | map (µs/page) | map (s/GiB) | "
          "set access, whole range (s) | set access, whole range (µs/page) | set access page by page (µs/page) | "
          "unmap one by one (µs/page) | unmap (s/GiB) | one unmap for the range | release (µs/page) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        whole = f"{r['unmap_whole_s'] * 1e3:.1f} ms" if r["unmap_whole_allowed"] else "refused"
        busy = {True: "yes", False: "no"}.get(r["busy"], r["busy"])
        print(f"| {r['page_bytes'] // MIB} MiB | {r['pages']} | {busy} | {r['resident_pages']} | {r['copying']} | "
              f"{r['noop_call_us']:.2f} | {r['create_us_per_page']:.1f} | "
              f"{r['map_us_per_page']:.1f} | {r['map_s_per_gib']:.4f} | {r['set_access_s']:.4f} | "
              f"{r['set_access_us_per_page']:.1f} | {r['set_access_each_us_per_page']:.1f} | "
              f"{r['unmap_each_us_per_page']:.1f} | {r['unmap_each_s_per_gib']:.4f} | {whole} | "
              f"{r['release_us_per_page']:.1f} |")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
