"""bench/host_watch.py: teraio.paged's counters of a step in words, the copy holds named only
where the allocator held copies."""
import pathlib
import sys

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import host_watch  # noqa: E402


def counts(**given):
    out = {f"paged_{name}": 0 for name in host_watch.PAGED_COUNTERS}
    out.update({f"paged_{name}": value for name, value in given.items()})
    return out


def test_a_step_without_holds_says_nothing_of_them():
    text = host_watch.describe_paged(counts(pages_mapped=9854, map_s=1.834, access_s=1.807))
    assert "9854 pages" in text and "1.834 s mapping (1.807 s of it setting access)" in text
    assert "held" not in text


def test_the_requests_held_and_the_wait_for_the_link_are_named():
    text = host_watch.describe_paged(counts(copy_holds=312, copy_hold_s=0.104, copy_holds_not_quiet=3))
    assert text.endswith(", copies held for 312 requests (0.104 s waiting for the link, 3 not quiet in time)")
