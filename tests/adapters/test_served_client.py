"""The served-engine client refuses what is not a speculative server in one line (no vLLM needed)."""
from __future__ import annotations

import http.server
import socket
import threading

import pytest

from workbench.adapters.served import ServedError, Served, counters, delta, parse_prometheus

METRICS = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="t"} 12.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 180.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="t"} 21.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="2"} 5.0
vllm:num_requests_running{engine="0",model_name="t"} 0.0
"""


def test_prometheus_counters_by_hand():
    c = counters(parse_prometheus(METRICS))
    assert c == {"drafts": 12.0, "draft_tokens": 180.0, "accepted": 21.0, "per_pos": [9.0, 7.0, 5.0]}
    later = counters(parse_prometheus(METRICS.replace(" 12.0", " 15.0").replace(" 21.0", " 25.0")
                                      .replace('position="2"} 5.0', 'position="2"} 6.0')))
    assert delta(c, later) == {"drafts": 3.0, "draft_tokens": 0.0, "accepted": 4.0, "per_pos": [0.0, 0.0, 1.0]}


def _serve(routes: dict) -> tuple[str, callable]:
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body, ctype = routes.get(self.path, (b"not found", "text/plain"))
            self.send_response(200 if self.path in routes else 404)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{srv.server_address[1]}", srv.shutdown


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


def test_a_url_that_is_not_a_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(ServedError) as e:
        Served(f"http://127.0.0.1:{port}", timeout=5)
    assert "is not reachable" in _one_line(e)
    with pytest.raises(ServedError) as e:
        Served("localhost:8000")
    assert "not an http(s) URL" in _one_line(e)
    url, stop = _serve({"/v1/models": (b"<html>hello</html>", "text/html")})
    try:
        with pytest.raises(ServedError) as e:
            Served(url, timeout=5)
        assert "did not answer JSON" in _one_line(e) and "OpenAI-compatible" in str(e.value)
    finally:
        stop()


def test_a_server_without_speculative_counters():
    url, stop = _serve({"/v1/models": (b'{"data": [{"id": "m"}]}', "application/json"),
                        "/metrics": (b'vllm:num_requests_running{engine="0"} 0.0\n', "text/plain")})
    try:
        s = Served(url, timeout=5)
        assert s.model == "m"
        with pytest.raises(ServedError) as e:
            s.counters()
        assert "no speculative counters" in _one_line(e) and "--speculative-config" in str(e.value)
        with pytest.raises(ServedError) as e:
            Served(url, model="other", timeout=5)
        assert "model='other' is not served" in _one_line(e)
    finally:
        stop()
