"""The served-engine load bench: its rounds (in process and served, at once and one after another) count what
they should, and its clients survive a connection the server closed while idle (a lost delete once left a
session live, and the next round hit max_sessions: 429 at 16 clients)."""
from __future__ import annotations

import time

import pytest

import workbench as wb

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from tiny_models import make_pair

    return make_pair(tmp_path_factory.mktemp("load"), vocab=40, hidden=32, layers=2, layer_ids=(0,), block_size=4,
                     seed=1, eos=False)


@pytest.fixture(scope="module")
def server(pair):
    from workbench.serve import EngineServer, Limits

    srv = EngineServer(wb.load(target=pair[0], draft=pair[1]), port=0, limits=Limits(max_sessions=4)).start()
    yield srv
    srv.stop()


class Handle:
    """What the bench's rounds use of its server subprocess, over a server in this process."""

    def __init__(self, srv):
        self.url, self.token, self.srv = srv.url, srv.token, srv

    def batching(self) -> dict:
        return dict(wb.connect(self.url, token=self.token).health()["batching"])


def test_sessions_are_deleted_after_the_server_closed_their_idle_connections(server, monkeypatch):
    from workbench.serve import connection

    remote = wb.connect(server.url, token=server.token)
    a, b = (remote.session("t1 t2", max_new_tokens=4) for _ in range(2))
    time.sleep(5.5)  # the client's kept-alive connection idle past uvicorn's keep-alive timeout (5 s): closed
    a.close(fetch=False)  # too old to reuse: a fresh connection
    monkeypatch.setattr(connection, "REUSE_SECONDS", 3600.0)  # now a closed one is tried, found closed, replaced
    remote.sessions()
    time.sleep(5.5)
    b.close(fetch=False)
    assert remote.sessions() == []


def test_one_thread_keeps_one_connection(server):
    seen = []
    admit = server.guard.admit
    server.guard.admit = lambda p: (seen.append(p), admit(p))
    try:
        s = wb.connect(server.url, token=server.token).session("t1 t2", policy=wb.DDTree(3), max_new_tokens=12)
        for _ in range(3):
            s.step()
        s.run()
        s.close()
    finally:
        server.guard.admit = admit
    assert len(seen) == 1, f"{len(seen)} connections for one thread's requests"


def test_the_rounds_count_tokens_steps_and_where_the_time_went(server, pair):
    from workbench.bench.serve_load import add_ratios, inproc_round, served_round, summarise, table
    from workbench.serve import wire

    prompts, policy = ["t1 t2 t3", "t4 t5", "t6"], wb.DDTree(3)
    local = wb.load(target=pair[0], draft=pair[1])
    got = {"inproc": [inproc_round(local, prompts, 3, policy, 10)]}
    for how in ("run", "step", "serial", "whole"):
        got[how] = [served_round(Handle(server), prompts, 3, wire.policy_to_wire(policy), 10, how)]
    for how, (r,) in got.items():
        assert r["tokens"] == 30, how  # no end of text in this pair: every session makes its 10 tokens
        assert r["seconds"] > 0 and all(r["latencies"]), how
        assert (r["open_seconds"] is None) == (how not in ("inproc", "whole")), how  # the opening, where timed
    whole = got["whole"][0]
    assert 0 < whole["open_seconds"] < whole["seconds"]  # from the first opening to the last closing
    cycles = {how: sum(len(c) for c in got[how][0]["latencies"]) for how in ("run", "step", "serial", "whole")}
    assert cycles["run"] == cycles["step"] == cycles["serial"] == cycles["whole"]  # a step per cycle per session
    for how in ("run", "step", "serial", "whole"):
        r = got[how][0]
        assert len(r["parts"]) == cycles[how] and r["gather"]["rows_stepped"] == cycles[how], how
        assert all(p["cycle"] > 0 and p["decode"] > 0 for p in r["parts"]), how
    assert got["serial"][0]["gather"]["rows_stepped"] == got["serial"][0]["gather"]["cycles"]  # one at a time
    assert wb.connect(server.url, token=server.token).sessions() == []  # every round closes its sessions
    res = {"policy": wire.policy_to_wire(policy), "max_new_tokens": 10, "repeats": 1,
           "modes": ["inproc", "run", "step", "serial", "whole"],
           "rows": [{"clients": 3, **{m: summarise(got[m]) for m in got},
                     "at_once_vs_serial": [2.0]}]}
    add_ratios(res["rows"][0], got)
    res["rows"][0]["run"]["tok_s_vs_inproc"] = res["rows"][0]["run"]["p50_vs_inproc"] = [0.9, 1.1]
    text = table(res)
    assert "3 clients at once (run) over one after another (serial): 2.00x" in text
    assert "0.90x [0.90-1.10]" in text and "where a served step goes" in text
    x = res["rows"][0]
    assert x["whole"]["tok_s_vs_inproc"] == [pytest.approx(30 / whole["seconds"] / x["inproc"]["tok_s_whole"])]
    assert "3 client(s) opening, running and closing at once (whole) over the in-process batch from its making on" \
        in text
    assert all(k in text for k in ("wait", "cycle", "record", "encode", "http", "wire", "decode"))
    steps = text.split("where a served step goes")[1].splitlines()
    assert [line.split()[1] for line in steps[2:6]] == ["inproc", "run", "step", "serial"]  # in process beside
    assert steps[2].split()[-4:] == ["-"] * 4  # in process: nothing is encoded, sent or decoded


def test_the_batching_ceiling_is_the_in_process_batch_over_one_request():
    from workbench.bench.serve_load import add_batch_gain, table
    from workbench.serve import wire

    def row(n, rate):
        return {"clients": n, "inproc": {"tok_s": rate, "p50_ms": 1.0, "p90_ms": 1.0, "p99_ms": 1.0, "max_ms": 1.0}}

    rows = [row(1, 600.0), row(8, 1000.0), row(4, 900.0)]
    add_batch_gain(rows)
    assert "inproc_batch_gain" not in rows[0] and rows[1]["inproc_batch_gain"] == pytest.approx(1000 / 600)
    assert rows[2]["inproc_batch_gain"] == pytest.approx(1.5)
    text = table({"policy": wire.policy_to_wire(wb.DDTree(3)), "max_new_tokens": 10, "repeats": 1, "modes": ["inproc"],
                  "rows": rows})
    assert "in process, a batch of 8 over one request (medians): 1.67x" in text
    alone = [row(8, 1000.0)]  # no one-client row: no ceiling is claimed
    add_batch_gain(alone)
    assert "inproc_batch_gain" not in alone[0]


def test_a_round_in_which_no_session_makes_a_cycle_is_refused(server, pair):
    """One new token is the prefill's: no cycle, nothing to time. The round says so in one line instead of a
    tok/s of the first tokens over no time (and a crash when the latencies are summarised)."""
    from workbench.bench.serve_load import inproc_round, served_round
    from workbench.serve import wire

    prompts, policy = ["t1 t2 t3", "t4 t5"], wb.DDTree(3)
    local = wb.load(target=pair[0], draft=pair[1])
    with pytest.raises(ValueError, match=r"no session made a cycle: each ended at its prefill \(reached max_new_tokens"):
        inproc_round(local, prompts, 2, policy, 1)
    with pytest.raises(ValueError, match="no session made a cycle"):
        served_round(Handle(server), prompts, 2, wire.policy_to_wire(policy), 1, "run")
    assert wb.connect(server.url, token=server.token).sessions() == []  # its sessions were closed all the same
