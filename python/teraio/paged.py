"""TeraIO's paged device memory as PyTorch's CUDA allocator.

PyTorch's caching allocator serves a request from one free run of addresses as long as the
request. Near the device's limit a request of a gigabyte or two seldom finds one, and the
allocator then unmaps its whole cache, waiting for the device (W3 in bench/RESULTS.md: 70-100
times a step). The paged allocator maps every block from fixed-size physical pages at an
address range of its own (CUDA's virtual memory management), so any free pages serve any
request. A request that finds no free pages takes the pages of blocks freed earlier, without a
host wait. It goes in through `torch.cuda.memory` 's pluggable-allocator slot, on stock PyTorch.

    import teraio.paged
    teraio.paged.install()           # before any CUDA tensor exists in the process
    ...
    teraio.paged.stats()             # dict, or None when not installed

`torch.cuda.set_per_process_memory_fraction` caps the pages it holds; `torch.cuda.empty_cache`
gives every page not in use back. PyTorch's own memory statistics (`torch.cuda.memory_stats`,
`max_memory_allocated`, the memory history) are not available under a pluggable allocator: read
`stats()` instead (`peak_in_use_bytes` for allocated, `peak_held_bytes` for reserved).
"""
import torch

from . import _native


def install(device=0, page_bytes=None):
    """Makes the paged allocator PyTorch's CUDA allocator for `device` (one device per process).

    `page_bytes` (an int or a string such as "16MiB"; default 8 MiB) is the physical page: larger
    pages cost the same per driver call, so a block maps and unmaps in fewer calls, but every
    block is rounded up to whole pages and every small-size class takes a page of its own. It
    must be a power of two and a multiple of the device's granularity (2 MiB on an H100). On W3
    (bench/RESULTS.md, sessions 25-26) the allocator ran 19% behind PyTorch's with 2 MiB pages and
    8% ahead with 8 MiB pages (and growth in place).

    Raises teraio.Error once PyTorch's CUDA allocator has served a tensor, and where TeraIO's
    binding or PyTorch has no CUDA."""
    index = torch.device("cuda", device).index if isinstance(device, int) else torch.device(device).index
    page = 0 if page_bytes is None else _native.parse_bytes(page_bytes)
    _native.use_paged_allocator(0 if index is None else index, page)


def installed():
    return _native.paged_allocator_stats() is not None


def stats():
    """The allocator's counters (bytes in use and held, with peaks; blocks reused, mapped and
    taken; pages mapped and unmapped; device-side waits; out-of-memory refusals), or None."""
    return _native.paged_allocator_stats()


def start_recording():
    """Keeps every request the allocator serves from now on, for `teraio paged-replay`: how many
    pages another policy, page size or cap would map for the same requests, counted on the CPU.
    The allocator's state comes first (live blocks as allocations, freed ones as allocations freed
    at once). Raises teraio.Error when the allocator is not installed."""
    _native.paged_start_recording()


def mark_step():
    """Ends a training step in the recording under way, with what the allocator counted in it
    (pages mapped, blocks reused, grown, mapped and taken, device waits), which the replay sets
    beside its own."""
    _native.paged_mark_step()


def save_recording(path):
    """Ends the recording under way and writes it to `path` (a text file, one request a line;
    io/paged_recording.hpp has the format). Returns its number of requests, or None when nothing
    was being recorded. A write that fails raises teraio.Error, and the recording is lost."""
    return _native.paged_save_recording(str(path))


def memory_in_use(device=0):
    """Bytes of device memory allocated to tensors now: from the paged allocator when it is
    installed, else from PyTorch's caching allocator."""
    current = stats()
    if current is not None:
        return current["in_use_bytes"]
    return torch.cuda.memory_allocated(device)


def memory_held(device=0):
    """Bytes of device memory the allocator holds (PyTorch's "reserved")."""
    current = stats()
    if current is not None:
        return current["held_bytes"]
    return torch.cuda.memory_reserved(device)
