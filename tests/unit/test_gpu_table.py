"""timeline/gpu_table.py: narrow integer columns that read back as the values given."""
import numpy as np
import pytest

from clockalign.timeline.gpu_table import Concat, Table, fit


@pytest.mark.parametrize("lo,hi,want", [(0, 255, "u1"), (0, 256, "u2"), (-1, 127, "i1"),
                                        (-129, 0, "i2"), (0, 1 << 32, "i8"),
                                        (0, (1 << 63) + 5, "u8"), (-(1 << 40), 0, "i8")])
def test_fit_is_the_narrowest_type_and_never_uint64_where_int64_holds(lo, hi, want):
    assert fit(lo, hi) == np.dtype(want)


def test_concat_joins_parts_in_the_narrowest_type_over_all_of_them():
    c = Concat()
    c.add(np.array([1, 2, 3], np.int64))
    c.add(np.array([], np.int64))
    c.add(np.array([70_000, -5], np.int64))
    assert [p.dtype for p in c.parts] == [np.dtype("u1"), np.dtype("i8"), np.dtype("i4")]
    a = c.array()
    assert a.dtype == np.dtype("i4") and a.tolist() == [1, 2, 3, 70_000, -5] and not c.parts


def test_a_patch_widens_only_its_part_where_the_values_need_it():
    c = Concat()
    c.add(np.array([0, 0, 0]))
    c.add(np.array([7]))
    c.patch(0, np.array([1]), np.array([-300]))
    assert c.parts[0].dtype == np.dtype("i2") and c.parts[1].dtype == np.dtype("u1")
    assert c.array().tolist() == [0, -300, 0, 7]


def test_table_reads_derived_fields_for_the_rows_asked_only():
    seen = []

    def end(c):
        seen.append(len(c["t_ns"]))
        return c["t_ns"] + c["dur_ns"]
    t = Table({"t_ns": np.array([10, 20, 30], np.int64), "dur_ns": np.array([1, 2, 3], "u1")},
              {"end_ns": end})
    whole = t["end_ns"]
    assert whole.tolist() == [11, 22, 33] and whole.dtype == np.int64
    assert t.take("end_ns", np.array([2])).tolist() == [33] and seen == [3, 1]
    sub = t[np.array([0, 2])]
    assert len(sub) == 2 and sub["end_ns"].tolist() == [11, 33]
    assert t[1] == {"t_ns": 20, "dur_ns": 2, "end_ns": 22}
    assert "end_ns" in t and "x" not in t and t.names == ("t_ns", "dur_ns", "end_ns")
