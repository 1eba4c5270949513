"""``Session.close()`` (declared by ``BaseSession``): a session ended early reads as finished, its driver lets go
of the model state it held for it, and the rest of its batch runs on as if it had never been there."""
from __future__ import annotations

import pytest

import workbench as wb
from workbench.engine.runner import SessionFinished

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_closed_solo_session_is_aborted_holds_no_cache_and_keeps_its_records(tiny_engines):
    e = tiny_engines["l4-h32"]
    s = e.session("t1 t2 t3", policy=wb.DDTree(8), max_new_tokens=12)
    s.step()
    assert s.cache_bytes() > 0 and s.kv_cache()
    s.close()
    assert s.finished and s.finish_reason == "aborted" and s.trace.finish_reason == "aborted"
    assert s.cache_bytes() == 0 and s.kv_cache() == [] and s.kv_shapes() == []
    assert len(s.trace.cycles) == 1 and s.text == e.tokenizer.decode(s.generated)  # the records stay readable
    with pytest.raises(SessionFinished):
        s.step()
    s.close()  # closing again changes nothing
    assert s.finish_reason == "aborted"


def test_closing_a_finished_session_keeps_why_it_finished(tiny_engines):
    s = tiny_engines["l4-h32"].session("t1 t2", policy=wb.DFlash(), max_new_tokens=4)
    s.run()
    reason = s.finish_reason
    s.close()
    assert s.finish_reason == reason != "aborted" and s.cache_bytes() == 0


def test_a_closed_request_leaves_its_batch_and_the_others_run_as_alone(tiny_engines):
    e = tiny_engines["l4-h32"]
    prompts = ["t1 t2 t3", "t4 t5", "t6 t7 t8 t9"]
    b = e.batch_session(prompts, policy=wb.DDTree(8), max_new_tokens=10)
    b.step()
    gone = b.sessions[1]
    gone.close()
    assert gone.finish_reason == "aborted" and b.live == [0, 2] and gone.cache_bytes() == 0
    stepped = len(gone.trace.cycles)
    b.run()
    assert len(gone.trace.cycles) == stepped  # never stepped again
    for i in (0, 2):
        alone = e.session(prompts[i], policy=wb.DDTree(8), max_new_tokens=10)
        alone.run()
        assert b.sessions[i].generated == alone.generated
