"""The aligned plain-text table of the demo and the privacy report (keras_fedpriv/text_table.py)."""

import pytest

from keras_fedpriv.text_table import text_table

pytestmark = [pytest.mark.jax]


def test_columns_are_padded_to_the_widest_entry_under_a_rule():
    table = text_table(["name", "eps"], [["label", "1"], ["embedding", "12.5"]], align="<>")
    assert table.splitlines() == [
        "name        eps",
        "---------  ----",
        "label         1",
        "embedding  12.5",
    ]


def test_default_is_left_aligned_with_no_trailing_spaces():
    table = text_table(["a", "long header"], [["xyz", "1"]])
    lines = table.splitlines()
    assert lines[0] == "a    long header" and lines[2] == "xyz  1"
    assert all(line == line.rstrip() for line in lines)


def test_no_rows_gives_the_header_and_the_rule():
    assert text_table(["x", "yy"], []) == "x  yy\n-  --"
