"""The served-engine load bench ends every session it opened, even when the server has closed the
client's idle connection in the meantime (a lost delete left a session live, and the next round hit
max_sessions: 429 at 16 clients)."""
from __future__ import annotations

import http.client
import time
from types import SimpleNamespace

import pytest

from shared_checks import http_call

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def server(tmp_path):
    import workbench as wb
    from tiny_models import make_pair
    from workbench.serve import EngineServer, Limits

    t, d = make_pair(tmp_path, vocab=40, hidden=32, layers=2, layer_ids=(0,), block_size=4, seed=1, eos=False)
    srv = EngineServer(wb.load(target=t, draft=d), port=0, limits=Limits(max_sessions=2)).start()
    yield srv
    srv.stop()


def test_a_session_is_deleted_after_the_server_closed_its_idle_connection(server):
    from workbench.bench.serve_load import _call, end_session

    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    handle = SimpleNamespace(host=host.strip("[]"), port=int(port), token=server.token)
    conns = [http.client.HTTPConnection(handle.host, handle.port, timeout=30) for _ in range(2)]
    sids = [_call(c, server.token, "POST", "/sessions", {"prompt": "t1 t2", "max_new_tokens": 4})["id"] for c in conns]
    time.sleep(5.5)  # both connections idle past uvicorn's keep-alive timeout (5 s): the server closes them
    with pytest.raises((http.client.HTTPException, ConnectionError)):  # the condition the bench met
        _call(conns[0], server.token, "DELETE", f"/sessions/{sids[0]}")
    assert {s["id"] for s in http_call(server, "GET", "/sessions")[1]["sessions"]} == set(sids)
    end_session(handle, conns[1], sids[1])
    end_session(handle, conns[0], sids[0])
    assert http_call(server, "GET", "/sessions")[1]["sessions"] == []
    with pytest.raises(RuntimeError, match="404"):  # a delete that really fails is not swallowed
        end_session(handle, conns[0], sids[0])
