"""bench/llm_table.py: how the table's notes word the plan's settings."""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import llm_table  # noqa: E402


def test_a_share_of_the_budget_reads_as_one_in_n_where_it_is_one():
    assert llm_table.share_text(1 / 65536) == "1/65536"
    assert llm_table.share_text(0.001) == "1/1000"
    assert llm_table.share_text(0.3) == "0.3"
    assert llm_table.share_text(0.5) == "1/2"
