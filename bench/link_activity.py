"""What each PCIe direction did during a step, as TeraIO's CUDA copier saw it (the step record's
`link`, either deadline order): time with chunks on the stream (busy), with copies waiting for the
compute stream (waiting), and with nothing to copy (idle), and how many copies were waited for
before the compute stream reached them (gated: they wait for it on a side stream; awaited: the
GPU waits on a flag the lane sets behind them, copy order "deadline-device-waits-in"), and how long
the lane held its own chunks back meanwhile so that those had the link (held, part of busy;
copy order "deadline-alone" only), and how often and how long the paged allocator held the copies
back for its driver calls (Session(hold_copies_to_map=True)). A plan whose copies end late on a link
that was busy all along asks more than the link gives; one whose link sat idle or waiting asks at
the wrong moments. Host clock, good to a polling interval per change of state."""
from __future__ import annotations

import statistics

DIRECTIONS = (("to_host", "to host"), ("to_device", "to device"))
FIELDS = ("busy_s", "waiting_s", "idle_s", "chunks", "bytes", "gated_flushes", "gated_bytes", "held_s",
          "host_waited_s", "awaited", "awaited_bytes", "holds", "held_for_driver_s")


def median(steps):
    """The median of each direction's fields over `steps` (records with a `link`), or None."""
    links = [s["link"] for s in steps if s.get("link")]
    if not links:
        return None
    return {direction: {field: statistics.median(link[direction].get(field, 0) for link in links) for field in FIELDS}
            for direction, _ in DIRECTIONS}


def describe(link):
    """'to host busy 12.1 s (49.8 GB/s), waiting 2.0 s, idle 9.9 s; to device ...'."""
    parts = []
    for direction, words in DIRECTIONS:
        a = link[direction]
        rate = f" ({a['bytes'] / a['busy_s'] / 1e9:.1f} GB/s)" if a["busy_s"] > 0 else ""
        gated = (f", {a['gated_flushes']:.0f} copies waited for ahead of their compute marker ({a['gated_bytes'] / 2**30:.1f} GiB)"
                 if a.get("gated_flushes") else "")
        if a.get("held_s"):
            gated += f", lane held {a['held_s']:.2f} s for copies waited for"
        if a.get("host_waited_s"):
            gated += f", the host waited {a['host_waited_s']:.2f} s for markers of copies waited for"
        if a.get("awaited"):
            gated += (f", {a['awaited']:.0f} copies awaited by the GPU on flags ahead of their compute marker "
                      f"({a['awaited_bytes'] / 2**30:.1f} GiB)")
        if a.get("holds"):
            gated += f", held {a['holds']:.0f} times ({a['held_for_driver_s']:.2f} s) for the allocator's driver calls"
        parts.append(f"{words} busy {a['busy_s']:.2f} s{rate}, waiting {a['waiting_s']:.2f} s, idle {a['idle_s']:.2f} s"
                     f"{gated}")
    return "; ".join(parts)
