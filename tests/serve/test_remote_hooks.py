"""Hook points run in the server's process: every hook argument of a served session (``s.hooks``,
``s.step(hooks=)``, ``s.run_with_hooks``, ``remote.session(hooks=)``) is refused in one line, as a served engine
refuses a batch, and the session steps on unchanged."""
from __future__ import annotations

import pytest

import workbench as wb
from workbench.interface.base import EngineLacks

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def remote(tiny_engines):
    from workbench.serve import EngineServer, Limits

    srv = EngineServer(tiny_engines["l4-h32"], port=0, limits=Limits(max_sessions=4, max_new_tokens=32)).start()
    yield wb.connect(srv.url, token=srv.token)
    srv.stop()


def test_hook_arguments_on_a_served_session_are_refused_in_one_line(remote):
    s = remote.session("t1 t2 t3", policy=wb.DDTree(4), max_new_tokens=12)
    hook = ("cycle.hook_tree", lambda t, h: None)
    for attempt in (lambda: s.hooks(hook), lambda: s.step(hooks=[hook]), lambda: s.run_with_hooks(hooks=[hook]),
                    lambda: remote.session("t1 t2", hooks=[hook])):
        with pytest.raises(EngineLacks, match="served session takes no hooks") as e:
            attempt()
        assert "\n" not in str(e.value) and "wb.load" in str(e.value)
    assert not s.cycles
    s.step()  # the session steps on
    assert len(s.cycles) == 1
    s.close()
