"""Conformance against a running server: outputs from its OpenAI-compatible API, acceptance from its own
speculative counters. For models that do not fit the workbench's own engine (tensor parallel on 8 GPUs
is the server's job), this is the path.

    r = compare_served("http://127.0.0.1:8000", api_key=..., prompts=[...], max_new_tokens=64)
    print(r)        # per request: text equal to the workbench's AR, drafts, accepted, committed tau

One request at a time, so that a counter's change over a request is that request's; one warm-up request
first, not counted. vLLM (``vllm serve``) exposes ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos`` on ``/metrics`` (Prometheus counters
get a ``_total`` suffix there). It counts a draft when it is verified: a request's last proposal is never
verified and is not counted, and drafts are always ``num_speculative_tokens`` long, so the report compares
committed tokens per verify (output tokens after the first, over verified drafts), not accepted draft
tokens per drafted token. SGLang's server (``launch_server``) needs CUDA and cannot run here: its
counters are read from each response's ``meta_info`` (``spec_verify_ct``: verifies; ``completion_tokens``),
as its 0.5.23 source writes them; that adapter is tested on a GPU host only (not run here).
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from workbench.engines.spec_metrics import (  # noqa: F401  (the served client reads the same counters)
    PER_POS, VLLM_COUNTERS, ServedError, counters, delta, parse_prometheus, spec_counters_from_metrics,
)

MAX_REPLY = 16 << 20  # bytes read from any reply: a server's answer is bounded like every resource here


# ---------------------------------------------------------------------------------------------- the client
class Served:
    """A running OpenAI-compatible server: completions, and its speculative counters (``kind="vllm"``:
    ``/metrics``; ``kind="sglang"``: each ``/generate`` reply's ``meta_info``, not run here: no GPU)."""

    def __init__(self, url: str, api_key: str | None = None, model: str | None = None, timeout: float = 120.0,
                 kind: str = "vllm"):
        if kind not in ("vllm", "sglang"):
            raise ServedError(f"kind={kind!r}: 'vllm' (vllm serve) or 'sglang' (SGLang's launch_server)")
        self.kind = kind
        if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url):
            raise ServedError(f"url={url!r} is not an http(s) URL; give e.g. http://127.0.0.1:8000")
        self.url, self.api_key, self.timeout = url.rstrip("/"), api_key, float(timeout)
        models = self._json("GET", "/v1/models")  # SGLang's launch_server serves the OpenAI routes too
        names = [m.get("id") for m in (models.get("data") or []) if isinstance(m, dict)]
        if not names:
            raise ServedError(f"{self.url}/v1/models lists no model: is {self.url} an OpenAI-compatible server?")
        if model is not None and model not in names:
            raise ServedError(f"model={model!r} is not served by {self.url} (it serves {names})")
        self.model = model or names[0]

    def _request(self, method: str, path: str, body: dict | None = None) -> bytes:
        req = urllib.request.Request(self.url + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                data = r.read(MAX_REPLY + 1)
        except urllib.error.HTTPError as e:
            raise ServedError(f"{method} {self.url}{path} answered HTTP {e.code} {e.reason}"
                              + (": check the API key" if e.code in (401, 403) else "")) from None
        except (urllib.error.URLError, OSError) as e:
            raise ServedError(f"{self.url} is not reachable ({getattr(e, 'reason', e)}): is the server running "
                              "on that address?") from None
        if len(data) > MAX_REPLY:
            raise ServedError(f"{method} {self.url}{path} replied with more than {MAX_REPLY >> 20} MiB; refused")
        return data

    def _json(self, method: str, path: str, body: dict | None = None) -> dict:
        data = self._request(method, path, body)
        try:
            out = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ServedError(f"{self.url}{path} did not answer JSON (first bytes {data[:60]!r}): is {self.url} "
                              "an OpenAI-compatible server?") from None
        if not isinstance(out, dict):
            raise ServedError(f"{self.url}{path} answered a JSON {type(out).__name__}, not an object")
        return out

    def counters(self) -> dict:
        return counters(parse_prometheus(self._request("GET", "/metrics").decode("utf-8", "replace")))

    def settled_counters(self, wait: float = 0.25, limit: float = 15.0) -> dict:
        """Counters once two reads ``wait`` apart agree: a server publishes a finished request's stats a
        moment after its reply (vLLM's output processor), so an early read would give them to the next one."""
        deadline = time.monotonic() + limit
        last = self.counters()
        while time.monotonic() < deadline:
            time.sleep(wait)
            now = self.counters()
            if now == last:
                return now
            last = now
        raise ServedError(f"{self.url}/metrics kept changing for {limit:.0f} s: another client is using the "
                          "server; the report needs it to itself (one request at a time)")

    def generate_sglang(self, prompt_ids: list[int], max_tokens: int) -> dict:
        """SGLang's native ``/generate``: text and its per-request speculative counts from ``meta_info``
        (sglang 0.5.23 ``tokenizer_manager``: ``spec_verify_ct``, ``spec_num_correct_drafts``)."""
        out = self._json("POST", "/generate", {"input_ids": list(prompt_ids),
                                                "sampling_params": {"max_new_tokens": int(max_tokens), "temperature": 0.0}})
        meta = out.get("meta_info") or {}
        if "spec_verify_ct" not in meta:
            raise ServedError(f"{self.url}/generate answered without meta_info.spec_verify_ct: is speculative "
                              "decoding on (--speculative-algorithm)?")
        return {"text": out.get("text", ""), "completion_tokens": int(meta.get("completion_tokens", 0)),
                "drafts": int(meta["spec_verify_ct"]), "accepted": int(meta.get("spec_num_correct_drafts", 0))}

    def complete(self, prompt_ids: list[int], max_tokens: int) -> dict:
        """Greedy completion of token ids -> {"text", "completion_tokens"}."""
        out = self._json("POST", "/v1/completions", {
            "model": self.model, "prompt": list(prompt_ids), "max_tokens": int(max_tokens), "temperature": 0.0,
        })
        try:
            choice = out["choices"][0]
            return {"text": choice["text"], "completion_tokens": int(out["usage"]["completion_tokens"])}
        except (KeyError, IndexError, TypeError, ValueError):
            raise ServedError(f"{self.url}/v1/completions answered without choices[0].text and usage: "
                              f"{json.dumps(out)[:200]}") from None


@dataclass
class ServedRequest:
    text_equal: bool
    completion_tokens: int
    drafts: int  # verified drafts (the server's counter)
    accepted: int  # accepted draft tokens
    per_pos: list

    @property
    def tau(self) -> float:
        """Committed tokens per verify: the tokens after the first (the prefill's), over verified drafts."""
        return (self.completion_tokens - 1) / self.drafts if self.drafts else 0.0


@dataclass
class ServedReport:
    url: str
    model: str
    requests: list = field(default_factory=list)

    @property
    def drafts(self) -> int:
        return sum(r.drafts for r in self.requests)

    @property
    def tau(self) -> float:
        return sum(r.completion_tokens - 1 for r in self.requests) / self.drafts if self.drafts else 0.0

    def per_position(self, depths: int = 4) -> list[float]:
        n = self.drafts
        return [sum(r.per_pos[d] for r in self.requests if d < len(r.per_pos)) / n if n else 0.0
                for d in range(depths)]

    def __str__(self) -> str:
        from workbench.records.texttable import text_table

        rows = [[str(x) for x in (i, "yes" if r.text_equal else "NO", r.completion_tokens, r.drafts, r.accepted,
                                  f"{r.tau:.2f}")] for i, r in enumerate(self.requests)]
        pp = " / ".join(f"{p:.2f}" for p in self.per_position())
        return "\n".join([f"Served conformance: {self.model} at {self.url}, {len(self.requests)} requests",
                          text_table(["request", "text = workbench AR", "tokens", "drafts", "accepted", "tau"], rows),
                          f"all: {self.drafts} drafts, committed tau {self.tau:.2f}, accepted at slot 1..4 {pp}"])


def compare_served(url: str, prompts=None, *, api_key: str | None = None, model: str | None = None,
                   target=None, draft=None, max_new_tokens: int = 64, warmup: bool = True,
                   kind: str = "vllm") -> ServedReport:
    """Each prompt through the server, one at a time, against the workbench's own greedy AR output of the
    same pair (``target``/``draft``: the pair the server runs; default: the embedded pair)."""
    from workbench.bench.prompts import default_prompts
    from workbench.engine.core import load
    from workbench.engine.policies import AR

    server = Served(url, api_key=api_key, model=model, kind=kind)
    if kind == "vllm":
        server.counters()  # a server without speculative counters is refused before any work
    engine = load(target, draft, dtype="float32")
    texts = list(prompts) if prompts is not None else default_prompts()
    report = ServedReport(server.url, server.model)
    if warmup and texts:
        server.complete(engine.encode(texts[0]).ids, 4)
    for text in texts:
        ids = list(engine.encode(text).ids)
        s = engine.session(prompt_ids=ids, policy=AR(), temperature=0.0, max_new_tokens=max_new_tokens)
        s.run()
        if kind == "sglang":  # per-request counts in the reply itself; no per-position counts
            out = server.generate_sglang(ids, max_new_tokens)
            report.requests.append(ServedRequest(out["text"] == s.text, out["completion_tokens"], out["drafts"],
                                                 out["accepted"], []))
            continue
        before = server.settled_counters()
        out = server.complete(ids, max_new_tokens)
        d = delta(before, server.settled_counters())
        report.requests.append(ServedRequest(out["text"] == s.text, out["completion_tokens"], int(d["drafts"]),
                                             int(d["accepted"]), [int(x) for x in d["per_pos"]]))
    return report
