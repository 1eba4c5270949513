"""Replay re-runs only what it can re-run: a trace of another pair or another engine, or a change it
cannot apply, is refused in one line; a saved trace's path works as the trace."""
from __future__ import annotations

import copy

import pytest

import workbench as wb

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def traced(tiny_engines):
    eng = tiny_engines["l4-h32"]
    s = eng.session("t1 t2", policy=wb.DDTree(4), temperature=0.8, seed=1, max_new_tokens=12)
    s.step()
    s.temperature = 0.5
    s.run()
    return eng, s


def test_a_saved_trace_replays_from_its_path(traced, tmp_path):
    eng, s = traced
    path = s.trace.save(tmp_path / "run.trace.jsonl")
    for given in (path, str(path)):
        assert eng.replay(given).generated == s.generated
    with pytest.raises(TypeError, match="replay\\(\\) takes a wb.Trace or a saved trace's path, got dict"):
        eng.replay(s.trace.meta)


def test_another_pair_or_engine_is_refused(traced, tiny_engines):
    eng, s = traced
    other = tiny_engines["l3-h48-b5"]
    with pytest.raises(ValueError, match=r"this trace ran target '.*l4-h32.*/target' with drafter .*; this engine "
                                         r"holds target '.*l3-h48-b5.*/target' .* replay it on wb.load\(target="):
        other.replay(s.trace)
    vllm = copy.deepcopy(s.trace)
    vllm.meta["engine"] = "vllm 0.11.0"
    with pytest.raises(ValueError, match=r"recorded by vllm 0.11.0 .*engine.session\(prompt_ids="):
        eng.replay(vllm)


@pytest.mark.parametrize("change,why", [
    ({"cycle": "1", "name": "temperature", "value": 0.5}, r"has cycle='1': give the cycle .* integer from 0 to"),
    ({"cycle": 1.0, "name": "temperature", "value": 0.5}, r"has cycle=1.0"),
    ({"cycle": 99, "name": "temperature", "value": 0.5}, r"has cycle=99"),
    ({"cycle": 1, "name": "tempreature", "value": 0.5}, r"names the setting 'tempreature', which replay does not know"),
    ({"cycle": 1, "value": 0.5}, r"is not a \{'cycle', 'name', 'value'\} record"),
])
def test_a_change_replay_cannot_apply_is_refused_not_skipped(traced, change, why):
    eng, s = traced
    bad = copy.deepcopy(s.trace)
    bad.meta["changes"] = [change]
    with pytest.raises(ValueError, match=r"trace.meta\['changes'\]\[0\].*" + why):
        eng.replay(bad)


def test_the_same_checks_through_wb_connect(traced, tiny_engines):
    """A served engine names its pair in /info: replay checks it as a local engine's."""
    from workbench.serve import EngineServer

    eng, s = traced
    server = EngineServer(tiny_engines["l3-h48-b5"], port=0, token="t" * 40).start()
    try:
        remote = wb.connect(server.url, token=server.token)
        with pytest.raises(ValueError, match=r"this trace ran target '.*l4-h32.*' .* this engine holds target "
                                             r"'.*l3-h48-b5.*/target'"):
            remote.replay(s.trace)
        mine = remote.session("t1 t2", policy=wb.DDTree(4), max_new_tokens=6)
        mine.run()
        assert remote.replay(mine.trace).generated == mine.generated  # its own pair: replayed
        bad = copy.deepcopy(mine.trace)
        bad.meta["changes"] = [{"cycle": 1, "name": "tempreature", "value": 0.5}]
        with pytest.raises(ValueError, match="'tempreature', which replay does not know"):
            remote.replay(bad)
    finally:
        server.stop()
