"""A view given the wrong kind of record says which one it draws, in one line."""
from __future__ import annotations

import pytest

import workbench as wb

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def trace(tiny_engines):
    return tiny_engines["l4-h32"].generate("t1 t2", policy=wb.DDTree(4), max_new_tokens=6)


@pytest.mark.parametrize("view", ["tree_figure", "draft_heatmap", "mask_figure"])
def test_a_cycle_view_given_a_trace(trace, view):
    with pytest.raises(TypeError, match=rf"{view} draws one cycle: give a wb.Cycle .*pass trace\[i\].*got Trace"):
        getattr(wb.views, view)(trace)
    assert getattr(wb.views, view)(trace[0]).data  # the cycle itself draws


def test_the_stepper_given_a_trace(trace):
    with pytest.raises(TypeError, match=r"Stepper steps a live session, got Trace: pass engine.session\(...\), "
                                        r"or engine.replay\(trace\)"):
        wb.Stepper(trace)


def test_speedup_figure_given_a_cost_table():
    from workbench.shapes import cost

    table = cost("qwen3-8b", gpu="H200")
    with pytest.raises(TypeError, match=r"speedup_figure draws Speedup predictions, got CostTable: pass "
                                        r"table.speedup\(acceptance\)"):
        wb.views.speedup_figure(table)
    assert wb.views.speedup_figure(table.speedup({8: 3.0, 32: 4.0})).data
