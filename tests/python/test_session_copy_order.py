"""Session(copy_order=...): the CUDA copier runs each direction's copies by the plan's
deadlines (the default, as the planner and simulator assume; "deadline-alone" gives a copy
waited for the link to itself, "deadline-chunked" queues the rest of such a copy in chunks too,
"deadline-host-waits" has the host wait for its marker instead of gating it, and
"deadline-host-waits-in" so for copies into the device only, "deadline-device-waits-in" has the
GPU wait for those on a flag instead, the host going on) or as issued, the deadline orders
in pieces of copy_chunk bytes (8 MiB unless given). Whichever runs is named in the session's
backends report; the training itself is bit-exact either way."""
from __future__ import annotations

import pytest

import teraio
from conftest import requires_cuda


def test_an_unknown_copy_order_is_refused():
    with pytest.raises(teraio.Error, match="unknown copy order 'fifo'"):
        teraio.Session(gpu_budget="1GiB", device="cpu", copy_order="fifo")


def test_a_copy_chunk_out_of_bounds_is_refused():
    for chunk in ("1KiB", "1GiB", 1_000_000, 0):
        with pytest.raises(teraio.Error, match="a copy lane's chunk must be a multiple of 4 KiB"):
            teraio.Session(gpu_budget="1GiB", device="cpu", copy_chunk=chunk)
    with teraio.Session(gpu_budget="1GiB", device="cpu", copy_chunk="2MiB"):
        pass  # within bounds; the host copier has no lanes to give it to


@requires_cuda
def test_the_cuda_copier_reports_the_chunk_its_lanes_move():
    with teraio.Session(gpu_budget="1GiB", device="cuda", copy_order="deadline-host-waits-in",
                        copy_chunk="2MiB") as session:
        assert "in deadline-host-waits-in order (2.0 MiB chunks;" in session.report()["backends"]
    with teraio.Session(gpu_budget="1GiB", device="cuda") as session:
        assert "in deadline order (8.0 MiB chunks;" in session.report()["backends"]


def test_the_cpu_copier_says_it_runs_copies_as_issued():
    with teraio.Session(gpu_budget="1GiB", device="cpu") as session:
        assert "copier host in issue order" in session.report()["backends"]


@requires_cuda
@pytest.mark.parametrize("order", ["deadline", "deadline-alone", "deadline-chunked", "deadline-host-waits",
                                   "deadline-host-waits-in", "deadline-device-waits-in", "issue"])
def test_the_cuda_copier_reports_the_order_that_runs(order):
    with teraio.Session(gpu_budget="1GiB", device="cuda", copy_order=order) as session:
        assert f"copier cuda:0 in {order} order" in session.report()["backends"]

