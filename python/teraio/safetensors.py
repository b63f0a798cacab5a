"""teraio.safetensors: safetensors checkpoints loaded and saved through TeraIO's storage engine.

The names and meanings are those of ``safetensors.torch``::

    from teraio import safetensors as st
    tensors = st.load_file("model.safetensors", device="cuda:0")
    tensors = st.load("checkpoint_dir_or_index.json", device="cuda:0")   # sharded checkpoints
    with st.safe_open("model.safetensors", framework="pt", device="cuda:0") as f:
        w = f.get_tensor(f.keys()[0])
    st.save_file(tensors, "out.safetensors", metadata={"format": "pt"})

Each file's data region is read in one go (cuFile, O_DIRECT into pinned bounce buffers, or
buffered reads) into ONE torch uint8 tensor allocated on the target device (torch owns the
memory: the CUDA caching allocator on a GPU); tensors are views of it (``separate=True``
gives each tensor its own allocation). The reads are host-synchronised: when a load returns,
every byte has arrived, so the tensors are valid on any stream. ``last_stats()`` says which
read path ran, why, and how fast.
"""
import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import tempfile
import threading
import time

import torch

from . import _native
from ._native import Error

__all__ = ["Error", "LoadStats", "last_stats", "load", "load_file", "safe_open", "save", "save_file"]

_log = logging.getLogger("teraio.safetensors")

# The format's dtype names and the torch dtypes they denote, where this torch has them.
_TORCH_NAMES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "C64": "complex64",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
    "U16": "uint16", "U32": "uint32", "U64": "uint64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
}
_DTYPES = {name: getattr(torch, attr) for name, attr in _TORCH_NAMES.items() if hasattr(torch, attr)}
_FORMAT_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_ITEM_SIZES = {name: torch.empty((), dtype=dtype).element_size() for name, dtype in _DTYPES.items()}
_IO_MODES = ("auto", "cufile", "direct", "buffered")
_DEFAULT_WORKERS = 4  # shards read at once by load()


def _error(kind, message):
    """A teraio.Error raised from Python, with the .kind the native errors carry."""
    error = Error(message)
    error.kind = kind
    return error


@dataclasses.dataclass
class LoadStats:
    """What one load did: the read path (mode: cufile, direct, buffered; backend: io_uring, posix,
    cufile), why it ran, the bytes this process read and the wall time of the whole call."""

    mode: str = ""
    backend: str = ""
    reason: str = ""
    bytes: int = 0
    seconds: float = 0.0
    files: int = 0
    io_seconds: float = 0.0  # time spent in the reads themselves

    @property
    def gigabytes_per_second(self):
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def add(self, native):
        """Adds one read's statistics (a dict from _native.st_read_range)."""
        self.mode = _join(self.mode, native["mode"], "+")
        self.backend = _join(self.backend, native["backend"], "+")
        self.reason = _join(self.reason, native["reason"], " | ")
        self.bytes += native["bytes"]
        self.io_seconds += native["seconds"]
        self.files += 1


def _join(joined, value, separator):
    """joined + separator + value, unless value is empty or already there."""
    if not value or value in joined.split(separator):
        return joined
    return value if not joined else joined + separator + value


_last = threading.local()


def last_stats():
    """The LoadStats of the last load_file, load or get_tensor of this thread (None before)."""
    return getattr(_last, "stats", None)


def _record(stats, started, what):
    stats.seconds = time.perf_counter() - started
    _last.stats = stats
    _log.debug("%s: %s by %s/%s at %.2f GB/s (%s)", what, _native.format_bytes(stats.bytes), stats.mode,
               stats.backend, stats.gigabytes_per_second, stats.reason)


def _device(device):
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("cuda", device)
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise _error("invalid argument", f"not a device: {device!r} ({e})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise _error("unsupported", f"device {device} requested but torch {torch.__version__} sees no CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
    elif device.type != "cpu":
        raise _error("invalid argument", f"device {device}: only cpu and cuda are supported")
    return device


def _read_options(io_mode, chunk_bytes, chunks_in_flight, threads=None):
    if io_mode not in _IO_MODES:
        raise _error("invalid argument", f"unknown io_mode {io_mode!r} (one of {', '.join(_IO_MODES)})")
    options = {"io_mode": io_mode, "chunk_bytes": chunk_bytes, "chunks_in_flight": chunks_in_flight}
    if threads is not None:
        options["threads"] = threads
    return options


def _check_dtype(dtype):
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise _error("invalid argument", f"dtype must be a floating-point torch.dtype or None, not {dtype!r}")


class _File:
    """A validated header: name -> (dtype name, shape, begin, end) within the data region."""

    def __init__(self, path):
        self.native = _native.st_read_header(os.fspath(path))
        self.path = self.native.path
        self.data_bytes = self.native.data_bytes
        self.entries = {name: (dtype, shape, begin, end) for name, dtype, shape, begin, end in self.native.tensors}

    def read(self, begin, end, device, options):
        """Bytes [begin, end) of the data region as a new uint8 tensor on device, and the read's
        statistics."""
        buffer = torch.empty(end - begin, dtype=torch.uint8, device=device)
        return buffer, _native.st_read_range(self.native, begin, end, buffer, **options)

    def tensor(self, name, raw):
        """Tensor `name` from its raw bytes (a uint8 tensor), as a view of them where alignment allows."""
        dtype_name, shape, _, _ = self.entries[name]
        dtype = _DTYPES.get(dtype_name)
        if dtype is None:
            raise _error("unsupported", f"{self.path}: tensor \"{name}\" has dtype {dtype_name}, for which torch "
                                        f"{torch.__version__} has no type")
        if raw.storage_offset() % _ITEM_SIZES[dtype_name]:
            # The reference writer aligns every tensor to its element size; other writers may not.
            raw = raw.clone()
        return raw.view(dtype).view(shape)


def _read_whole_files(files, device, options, stats, max_workers):
    """The data regions of the files, read up to max_workers files at a time: the native reads
    release the GIL, so several files (shards) are read in parallel."""
    workers = min(len(files), max_workers or _DEFAULT_WORKERS)
    if workers <= 1:
        results = [file.read(0, file.data_bytes, device, options) for file in files]
    else:
        # torch's current stream is per thread: the workers allocate and read on the caller's.
        stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

        def read(file):
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                return file.read(0, file.data_bytes, device, options)

        with concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="teraio-st") as pool:
            results = list(pool.map(read, files))
    for _, native in results:
        stats.add(native)
    return [buffer for buffer, _ in results]


def _finish(tensor, dtype, separate):
    if dtype is not None and tensor.is_floating_point() and tensor.dtype != dtype:
        return tensor.to(dtype)
    return tensor.clone() if separate else tensor


def _instantiate(file, buffer, names, dtype, separate, out):
    for name, (_, _, begin, end) in file.entries.items():
        if names is None or name in names:
            out[name] = _finish(file.tensor(name, buffer[begin:end]), dtype, separate)


def load_file(filename, device="cpu", *, io_mode="auto", dtype=None, separate=False, chunk_bytes=None,
              chunks_in_flight=None, threads=None):
    """Loads one safetensors file as {name: tensor} on device ("cpu", "cuda", "cuda:1", a
    torch.device or a CUDA index).

    io_mode: "auto" (cuFile where GPUDirect Storage really works, else buffered when the page
    cache holds most of the file, else O_DIRECT), "cufile", "direct" or "buffered".
    dtype: floating-point tensors are converted to it on the device; integer, bool and complex
    tensors keep their dtype. separate: every tensor in its own allocation (so they can be
    freed one by one) instead of views of one buffer per file. chunk_bytes, chunks_in_flight:
    the read pipeline's chunk size and O_DIRECT depth (defaults: 16 MiB, 4); threads: the
    threads reading a cached file (default: min(16, CPUs)).
    """
    started = time.perf_counter()
    device = _device(device)
    options = _read_options(io_mode, chunk_bytes, chunks_in_flight, threads)
    _check_dtype(dtype)
    stats = LoadStats()
    file = _File(filename)
    tensors = {}
    _instantiate(file, _read_whole_files([file], device, options, stats, 1)[0], None, dtype, separate, tensors)
    _record(stats, started, file.path)
    return tensors


def _distribution(distributed):
    """(rank, world size) among which the shards are shared, (0, 1) when they are not."""
    if distributed is False:
        return 0, 1
    available = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed and not available:
        raise _error("invalid argument", "distributed=True but torch.distributed is not initialised")
    if not available:
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def load(source, device="cpu", *, io_mode="auto", dtype=None, separate=False, distributed=None, max_workers=None,
         chunk_bytes=None, chunks_in_flight=None, threads=None):
    """Loads a checkpoint as one {name: tensor}: a model.safetensors.index.json, a directory
    holding one (or model.safetensors), or a .safetensors file. With an index, the result holds
    exactly the tensors of its weight_map, each from its shard. bytes (safetensors.torch.load's
    argument) load as a file's contents, on the CPU.

    With torch.distributed initialised (or distributed=True), rank r reads the shards i with
    i % world_size == r, and every shard's data region is then broadcast from the rank that read
    it, in shard order, so that every rank ends with the whole dictionary on its device; the
    device must suit the process group's backend (cuda for nccl, cpu for gloo). distributed=False
    makes every rank read every shard. max_workers: shards read at once (default 4). Other
    arguments as load_file.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _load_bytes(source, device, io_mode=io_mode, dtype=dtype, separate=separate)
    started = time.perf_counter()
    device = _device(device)
    options = _read_options(io_mode, chunk_bytes, chunks_in_flight, threads)
    _check_dtype(dtype)
    rank, world = _distribution(distributed)
    index = _native.st_resolve_checkpoint(os.fspath(source))
    files = [_File(os.path.join(index["directory"], shard)) for shard in index["shards"]]
    wanted = [None] * len(files)  # tensor names to take from each shard; None: all of them
    if index["weight_map"]:
        position = {shard: i for i, shard in enumerate(index["shards"])}
        wanted = [set() for _ in files]
        for name, shard in index["weight_map"].items():
            i = position[shard]
            if name not in files[i].entries:
                raise _error("format error", f"checkpoint {index['path']}: tensor \"{name}\" is mapped to {shard} "
                                             "but that shard does not hold it")
            wanted[i].add(name)
    stats = LoadStats()
    mine = [i for i in range(len(files)) if i % world == rank]
    buffers = [None] * len(files)
    for i, buffer in zip(mine, _read_whole_files([files[i] for i in mine], device, options, stats, max_workers)):
        buffers[i] = buffer
    if world > 1:
        for i, file in enumerate(files):
            if buffers[i] is None:
                buffers[i] = torch.empty(file.data_bytes, dtype=torch.uint8, device=device)
            if file.data_bytes > 0:
                torch.distributed.broadcast(buffers[i], src=i % world)
        stats.reason = _join(stats.reason, f"rank {rank} of {world} read {stats.files} of {len(files)} shards", " | ")
    tensors = {}
    for file, buffer, names in zip(files, buffers, wanted):
        _instantiate(file, buffer, names, dtype, separate, tensors)
    _record(stats, started, index["path"])
    return tensors


def _load_bytes(data, device, **kwargs):
    with tempfile.TemporaryDirectory(prefix="teraio-st-") as directory:
        path = os.path.join(directory, "data.safetensors")
        with open(path, "wb") as f:
            f.write(data)
        return load_file(path, device, **kwargs)


class safe_open:
    """Lazy access to one file, as safetensors.safe_open: keys(), metadata(), get_tensor(name).
    Each get_tensor reads only that tensor's bytes, into its own allocation on device."""

    def __init__(self, filename, framework="pt", device="cpu", *, io_mode="auto"):
        if framework not in ("pt", "torch", "pytorch"):
            raise _error("invalid argument",
                         f"framework {framework!r}: teraio.safetensors returns torch tensors (\"pt\")")
        self._device = _device(device)
        self._options = _read_options(io_mode, None, None)
        self._file = _File(filename)
        self.stats = None  # LoadStats of the last get_tensor

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def keys(self):
        return sorted(self._file.entries)

    def metadata(self):
        """The __metadata__ strings, or None when the file has none."""
        return dict(self._file.native.metadata) or None

    def get_tensor(self, name):
        if name not in self._file.entries:
            raise _error("invalid argument", f"{self._file.path}: no tensor \"{name}\"")
        started = time.perf_counter()
        self.stats = LoadStats()
        _, _, begin, end = self._file.entries[name]
        raw, native = self._file.read(begin, end, self._device, self._options)
        self.stats.add(native)
        tensor = self._file.tensor(name, raw)
        _record(self.stats, started, f"{self._file.path}:{name}")
        return tensor


def _entries(tensors, where):
    if not isinstance(tensors, dict):
        raise _error("invalid argument", f"{where}: tensors must be a dict of name -> torch.Tensor")
    entries = []
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise _error("invalid argument", f"{where}: {name!r} must be a str naming a torch.Tensor")
        if tensor.layout != torch.strided:
            raise _error("invalid argument", f"{where}: tensor \"{name}\" is {tensor.layout}, not dense")
        dtype_name = _FORMAT_NAMES.get(tensor.dtype)
        if dtype_name is None:
            raise _error("unsupported", f"{where}: tensor \"{name}\" has dtype {tensor.dtype}, which safetensors "
                                        "cannot store")
        # Contiguous copies of strided views; conjugate and negative bits resolved into the data.
        entries.append((name, dtype_name, tensor.detach().resolve_conj().resolve_neg().contiguous()))
    return entries


def _metadata(metadata, where):
    if metadata is None:
        return {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise _error("invalid argument", f"{where}: metadata must be a dict of str -> str")
    return metadata


def save_file(tensors, filename, metadata=None):
    """Writes {name: tensor} (CPU or CUDA tensors; non-contiguous ones are copied) as a
    safetensors file that the safetensors library loads, with metadata {str: str}. The file
    appears atomically, fsynced. CUDA tensors are read after the work already queued on the
    current stream of their device."""
    path = os.fspath(filename)
    _native.st_save_file(_entries(tensors, path), _metadata(metadata, path), path)


def save(tensors, metadata=None):
    """The bytes of the safetensors file that save_file would write."""
    with tempfile.TemporaryDirectory(prefix="teraio-st-") as directory:
        path = os.path.join(directory, "data.safetensors")
        _native.st_save_file(_entries(tensors, "save"), _metadata(metadata, "save"), path, sync=False)
        with open(path, "rb") as f:
            return f.read()
