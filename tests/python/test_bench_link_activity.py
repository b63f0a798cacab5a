"""bench/link_activity.py: the median of the copier's per-step link activity and its wording."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import link_activity  # noqa: E402


def step(busy, waiting, idle, gigabytes):
    one = dict(busy_s=busy, waiting_s=waiting, idle_s=idle, chunks=int(gigabytes * 128), bytes=int(gigabytes * 1e9),
               gated_flushes=0, gated_bytes=0, held_s=0, host_waited_s=0, awaited=0, awaited_bytes=0, holds=0,
               held_for_driver_s=0)
    return {"link": {"to_host": one, "to_device": dict(one, busy_s=busy * 2)}}


def test_the_median_is_taken_per_direction_and_field():
    steps = [step(10, 1, 5, 500), step(12, 3, 1, 600), step(11, 2, 9, 550), {"link": None}]
    m = link_activity.median(steps)
    assert m["to_host"] == dict(busy_s=11, waiting_s=2, idle_s=5, chunks=550 * 128, bytes=int(550e9), gated_flushes=0,
                                gated_bytes=0, held_s=0, host_waited_s=0, awaited=0, awaited_bytes=0, holds=0,
                                held_for_driver_s=0)
    assert m["to_device"]["busy_s"] == 22


def test_no_link_activity_gives_none():
    assert link_activity.median([{"link": None}, {}]) is None


def test_the_wording_gives_the_rate_while_busy():
    text = link_activity.describe(step(10, 1.5, 5, 500)["link"])
    assert text == ("to host busy 10.00 s (50.0 GB/s), waiting 1.50 s, idle 5.00 s; "
                    "to device busy 20.00 s (25.0 GB/s), waiting 1.50 s, idle 5.00 s")
    idle = dict(busy_s=0, waiting_s=0, idle_s=3, chunks=0, bytes=0)
    assert link_activity.describe({"to_host": idle, "to_device": idle}).startswith("to host busy 0.00 s, waiting")


def test_copies_queued_behind_a_compute_marker_are_named():
    link = step(10, 1.5, 5, 500)["link"]
    link["to_device"].update(gated_flushes=120, gated_bytes=12 * 2**30)
    assert link_activity.describe(link).endswith(
        "to device busy 20.00 s (25.0 GB/s), waiting 1.50 s, idle 5.00 s, 120 copies waited for ahead of their compute marker "
        "(12.0 GiB)")


def test_the_time_the_lane_held_back_for_them_is_named():
    link = step(10, 1.5, 5, 500)["link"]
    link["to_device"].update(gated_flushes=120, gated_bytes=12 * 2**30, held_s=0.75)
    assert link_activity.describe(link).endswith(
        "120 copies waited for ahead of their compute marker (12.0 GiB), lane held 0.75 s for copies waited for")


def test_records_from_before_the_hold_count_as_no_hold():
    old = step(10, 1, 5, 500)
    for direction in old["link"].values():
        del direction["held_s"]
    assert link_activity.median([old])["to_device"]["held_s"] == 0


def test_the_time_the_host_waited_for_markers_is_named():
    link = step(10, 1.5, 5, 500)["link"]
    link["to_device"].update(host_waited_s=1.25)
    assert link_activity.describe(link).endswith(
        "idle 5.00 s, the host waited 1.25 s for markers of copies waited for")


def test_the_holds_for_the_allocators_driver_calls_are_named_and_older_records_have_none():
    link = step(10, 1.5, 5, 500)["link"]
    link["to_device"].update(holds=310, held_for_driver_s=0.62)
    assert link_activity.describe(link).endswith(
        "idle 5.00 s, held 310 times (0.62 s) for the allocator's driver calls")
    old = step(10, 1, 5, 500)
    for direction in old["link"].values():
        del direction["holds"], direction["held_for_driver_s"]
    assert link_activity.median([old])["to_host"]["holds"] == 0


def test_copies_the_gpu_awaits_on_flags_are_named():
    link = step(10, 1.5, 5, 500)["link"]
    link["to_device"].update(awaited=3000, awaited_bytes=300 * 2**30)
    assert link_activity.describe(link).endswith(
        "to device busy 20.00 s (25.0 GB/s), waiting 1.50 s, idle 5.00 s, 3000 copies awaited by the GPU on flags ahead "
        "of their compute marker (300.0 GiB)")
