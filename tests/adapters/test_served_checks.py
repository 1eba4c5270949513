"""compare_served checks before the local reference runs, and its report carries the reference column.
A fake vLLM server: /v1/models (root, max_model_len), /metrics, /v1/completions."""
from __future__ import annotations

import http.server
import json
import socket
import threading

import pytest

import workbench as wb
import workbench.engine.core as core
from workbench.adapters.served import ServedError, compare_served

METRICS = ('vllm:spec_decode_num_drafts_total{{engine="0"}} {d}\n'
           'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {t}\n'
           'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {a}\n'
           'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="0"}} {a}\n')
PROMPTS = ["def parse(line):", "The quick brown fox"]


@pytest.fixture
def fake_vllm(engine):
    """A server of the embedded pair: its completions are the embedded engine's greedy AR text, and it
    counts one verified draft per token after the first (a server that accepts nothing)."""
    state = {"root": "/srv/x/workbench/assets/target", "max_model_len": 1024, "calls": 0, "drafts": 0}

    class H(http.server.BaseHTTPRequestHandler):
        def reply(self, body: bytes, ctype="application/json"):
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/v1/models":
                card = {"id": "m", "root": state["root"], "max_model_len": state["max_model_len"]}
                self.reply(json.dumps({"data": [card]}).encode())
            else:
                d = state["drafts"]
                self.reply(METRICS.format(d=d, t=15 * d, a=0).encode(), "text/plain")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["calls"] += 1
            s = engine.session(prompt_ids=body["prompt"], policy=wb.AR(), max_new_tokens=body["max_tokens"])
            s.run()
            state["drafts"] += len(s.generated) - 1
            self.reply(json.dumps({"choices": [{"text": s.text}],
                                   "usage": {"completion_tokens": len(s.generated)}}).encode())

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", state
    srv.shutdown()


def test_bad_prompts_and_limits_are_refused_before_any_connection():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: a connection would fail differently
    for kw, why in ((dict(prompts="def f():"), r"prompts='def f\(\):' is one text; give a list of texts"),
                    (dict(prompts=[]), r"prompts=\[\] holds no prompt"),
                    (dict(prompts=["ok", 3]), r"prompts\[1\]=3 is not text"),
                    (dict(max_new_tokens=0), "max_new_tokens=0 must be a positive integer"),
                    (dict(max_new_tokens=8.5), "max_new_tokens=8.5 must be a positive integer")):
        with pytest.raises(ValueError, match=why):
            compare_served(url, **kw)


def test_another_pair_or_too_many_tokens_are_refused_before_the_reference_loads(fake_vllm, monkeypatch):
    url, state = fake_vllm

    def no_load(*a, **k):
        raise AssertionError("the local reference loaded before the check")

    monkeypatch.setattr(core, "load", no_load)
    with pytest.raises(ServedError, match=r"runs 'workbench/assets/target' \(its /v1/models root\) and the reference "
                                          r"would run 'workbench/assets/hybrid/target': two pairs"):
        compare_served(url, PROMPTS, target="hybrid")
    with pytest.raises(ServedError, match=r"max_new_tokens=2000: .* max_model_len=1024 .* give fewer than 1024"):
        compare_served(url, PROMPTS, max_new_tokens=2000)
    assert state["calls"] == 0


def test_a_prompt_past_max_model_len_is_refused_before_any_request(fake_vllm):
    url, state = fake_vllm
    state["max_model_len"] = 12
    with pytest.raises(ServedError, match=r"prompt 0 has \d+ tokens, and \d+ \+ max_new_tokens=8 passes .*"
                                          r"max_model_len=12"):
        compare_served(url, ["def parse(line):\n    fields = line.split(',')\n    return fields"], max_new_tokens=8)
    assert state["calls"] == 0


def test_the_report_has_the_reference_column_and_names_the_pair(fake_vllm, engine):
    url, state = fake_vllm
    report = compare_served(url, PROMPTS, max_new_tokens=12)
    text = str(report)
    assert "pair: the server runs workbench/assets/target, the reference's target" in text
    assert "workbench DFlash tau" in text
    for p, r in zip(PROMPTS, report.requests):
        t = engine.generate(p, policy=wb.DFlash(), max_new_tokens=12)
        assert r.text_equal and r.tau == 1.0  # the fake accepts nothing
        assert r.reference_tau == pytest.approx((t.new_tokens - 1) / len(t.cycles)) and r.reference_tau > 1
    assert f"the workbench's DFlash on the same pair and prompts: {report.reference_tau:.2f}" in text


def test_the_default_prompts_are_texts():
    """wb.compare and compare_served hand their defaults to a tokenizer: texts, not the split's records."""
    from workbench.shipped import default_prompts

    got = default_prompts()
    assert len(got) == 8 and all(isinstance(p, str) and p for p in got)
