"""Comparison with a running server: outputs from its OpenAI-compatible API, acceptance from its own
speculative counters. For models that do not fit the workbench's own engine (tensor parallel on 8 GPUs
is the server's job), this is the path.

    r = compare_served("http://127.0.0.1:8000", api_key=..., prompts=[...], max_new_tokens=64)
    print(r)        # per request: text equal to the workbench's AR, drafts, accepted, committed tau

One request at a time, so that a counter's change over a request is that request's; one warm-up request
first, not counted. vLLM (``vllm serve``) exposes ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``,
``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos`` on ``/metrics`` (Prometheus counters get
a ``_total`` suffix there). It counts a draft when it is verified: a request's last proposal is never
verified and is not counted, and drafts are always ``num_speculative_tokens`` long, so the report compares
committed tokens per verify (output tokens after the first, over verified drafts), not accepted draft tokens
per drafted token. Its accepted counter also counts drafts its last verify accepted past max_new_tokens,
which the workbench's records (of vLLM in process too) leave out: the report's "accepted" column is vLLM's
own count, committed tau the figure that compares. SGLang's server (``launch_server``) needs CUDA and cannot
run here: its counters are read from each response's ``meta_info`` (``spec_verify_ct``: verifies;
``completion_tokens``), as its 0.5.23 source writes them; that adapter is tested on a GPU host only (not run
here).
"""
from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from workbench.adapters.spec_metrics import (  # noqa: F401  (the served client reads the same counters)
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
        cards = [m for m in (models.get("data") or []) if isinstance(m, dict)]
        names = [m.get("id") for m in cards]
        if not names:
            raise ServedError(f"{self.url}/v1/models lists no model: is {self.url} an OpenAI-compatible server?")
        if model is not None and model not in names:
            raise ServedError(f"model={model!r} is not served by {self.url} (it serves {names})")
        self.model = model or names[0]
        card = cards[names.index(self.model)]
        self.root = str(card.get("root") or self.model)  # the path the server loaded (vLLM's ModelCard.root)
        limit = card.get("max_model_len")  # prompt and new tokens together
        self.max_model_len = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None

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
    reference_committed: int = 0  # the workbench's DFlash on the same pair and prompt: tokens after the first
    reference_cycles: int = 0  # ... and its verifies

    @property
    def tau(self) -> float:
        """Committed tokens per verify: the tokens after the first (the prefill's), over verified drafts."""
        return (self.completion_tokens - 1) / self.drafts if self.drafts else 0.0

    @property
    def reference_tau(self) -> float:
        """The same figure for the workbench's own DFlash: what a server that loses no acceptance gives."""
        return self.reference_committed / self.reference_cycles if self.reference_cycles else 0.0


@dataclass
class ServedReport:
    url: str
    model: str
    requests: list = field(default_factory=list)
    pair: str = ""  # the server's model against the reference's target, in words

    @property
    def drafts(self) -> int:
        return sum(r.drafts for r in self.requests)

    @property
    def tau(self) -> float:
        return sum(r.completion_tokens - 1 for r in self.requests) / self.drafts if self.drafts else 0.0

    @property
    def reference_tau(self) -> float:
        cycles = sum(r.reference_cycles for r in self.requests)
        return sum(r.reference_committed for r in self.requests) / cycles if cycles else 0.0

    def per_position(self, depths: int = 4) -> list[float]:
        n = self.drafts
        return [sum(r.per_pos[d] for r in self.requests if d < len(r.per_pos)) / n if n else 0.0
                for d in range(depths)]

    def __str__(self) -> str:
        from workbench.records.texttable import text_table

        rows = [[str(x) for x in (i, "yes" if r.text_equal else "NO", r.completion_tokens, r.drafts, r.accepted,
                                  f"{r.tau:.2f}", f"{r.reference_tau:.2f}")] for i, r in enumerate(self.requests)]
        pp = " / ".join(f"{p:.2f}" for p in self.per_position())
        return "\n".join([f"Served comparison: {self.model} at {self.url}, {len(self.requests)} requests",
                          *([f"pair: {self.pair}"] if self.pair else []),
                          text_table(["request", "text = workbench AR", "tokens", "drafts", "accepted", "tau",
                                      "workbench DFlash tau"], rows),
                          f"all: {self.drafts} drafts, committed tau {self.tau:.2f} (the workbench's DFlash on the "
                          f"same pair and prompts: {self.reference_tau:.2f}), accepted at slot 1..4 {pp}"])


def served_pair(server: Served, target_dir) -> str:
    """The server's model (its /v1/models root) against the reference's target, in words for the report;
    ServedError when they are plainly two models (every row would then compare two pairs)."""
    from pathlib import Path

    from workbench.engine.loading import canonical_ref

    theirs, mine = canonical_ref(server.root), canonical_ref(target_dir)
    if theirs == mine:
        return f"the server runs {mine}, the reference's target (a server does not name its drafter)"
    if theirs.startswith("workbench/") or Path(server.root).is_dir():
        raise ServedError(f"{server.url} runs {theirs!r} (its /v1/models root) and the reference would run {mine!r}: "
                          "two pairs, whose tokens and acceptance differ anyway; give the server's pair (target=/draft=, "
                          "or --target/--draft)")
    return (f"the server names its model {server.root!r}, not a directory here: the reference ran {mine}; check "
            "that they are the same pair")


def compare_served(url: str, prompts=None, *, api_key: str | None = None, model: str | None = None,
                   target=None, draft=None, max_new_tokens: int = 64, warmup: bool = True,
                   kind: str = "vllm") -> ServedReport:
    """Each prompt through the server, one at a time, against the workbench's own greedy AR output of the
    same pair (``target``/``draft``: the pair the server runs; default: the embedded pair) and its DFlash's
    committed tau (the reference column: what a server that loses no acceptance gives). Refused before the
    local reference loads: bad prompts or limit, a server that runs another model, and a prompt that with
    ``max_new_tokens`` would pass the server's ``max_model_len``."""
    from workbench.shipped import default_prompts
    from workbench.engine import validate
    from workbench.engine.core import load
    from workbench.engine.loading import pair_dirs
    from workbench.engine.policies import AR, DFlash

    texts = validate.prompt_list(prompts) or default_prompts()
    validate.positive_int(max_new_tokens, "max_new_tokens")
    server = Served(url, api_key=api_key, model=model, kind=kind)
    if kind == "vllm":
        server.counters()  # a server without speculative counters is refused before any work
    tdir, ddir = pair_dirs(target, draft)
    pair = served_pair(server, tdir)
    limit = server.max_model_len
    if limit is not None and max_new_tokens >= limit:
        raise ServedError(f"max_new_tokens={max_new_tokens}: {server.url} serves {server.model} with max_model_len="
                          f"{limit} (prompt and new tokens together); give fewer than {limit} new tokens")
    engine = load(tdir, ddir, dtype="float32")
    ids = [list(engine.encode(text).ids) for text in texts]
    over = [i for i, p in enumerate(ids) if limit is not None and len(p) + max_new_tokens > limit]
    if over:
        n = len(ids[over[0]])
        raise ServedError(f"prompt {over[0]} has {n} tokens, and {n} + max_new_tokens={max_new_tokens} passes "
                          f"{server.url}'s max_model_len={limit} ({len(over)} of {len(ids)} prompts do); give at "
                          f"most {limit - max(len(ids[i]) for i in over)} new tokens, or shorter prompts")
    report = ServedReport(server.url, server.model, pair=pair)
    if warmup and ids:
        server.complete(ids[0], 4)
    for p in ids:
        s = engine.session(prompt_ids=p, policy=AR(), temperature=0.0, max_new_tokens=max_new_tokens)
        s.run()
        ref = engine.session(prompt_ids=p, policy=DFlash(), temperature=0.0, max_new_tokens=max_new_tokens)
        ref.run()
        mine = dict(reference_committed=len(ref.generated) - 1, reference_cycles=len(ref.cycles))
        if kind == "sglang":  # per-request counts in the reply itself; no per-position counts
            out = server.generate_sglang(p, max_new_tokens)
            report.requests.append(ServedRequest(out["text"] == s.text, out["completion_tokens"], out["drafts"],
                                                 out["accepted"], [], **mine))
            continue
        before = server.settled_counters()
        out = server.complete(p, max_new_tokens)
        d = delta(before, server.settled_counters())
        report.requests.append(ServedRequest(out["text"] == s.text, out["completion_tokens"], int(d["drafts"]),
                                             int(d["accepted"]), [int(x) for x in d["per_pos"]], **mine))
    return report
