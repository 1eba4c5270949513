"""The command line, run in-process through main([...]): run, bench, report, kernels, and bad input."""
from __future__ import annotations

import importlib.util
import json

import pytest

import workbench.bench.kernel_bench as kernel_mod
import workbench.bench.policy_bench as bench_mod
from workbench.__main__ import main
from workbench.records.cycle import STAGES

PAIR = "l4-h32"
ALL_POLICIES = "ar,dflash,ddtree:1,ddtree:8,ddtree:32"


@pytest.fixture(scope="module")
def pair_args(tiny_pairs):
    t, d = tiny_pairs[PAIR]
    return ["--target", str(t), "--draft", str(d), "--threads", "1"]


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    p.write_text('{"id": "a", "prompt": "t1 t5 t9 t3"}\n{"id": "b", "prompt": "t40 t2 t17 t8 t8 t30"}\n')
    return p


def call(capsys, argv):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def assert_usage_error(capsys, argv, *needles):
    rc, out, err = call(capsys, argv)
    assert rc == 2, (rc, out, err)
    assert out == ""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# ------------------------------------------------------------------------------------------------ run
def test_run_prints_text_and_summary(capsys, pair_args):
    rc, out, err = call(capsys, ["run", "--prompt", "t1 t2 t3", "--policy", "ddtree:8", "--max-new-tokens", "12",
                                 *pair_args])
    assert rc == 0, err
    lines = out.strip().splitlines()
    assert lines[-1].startswith("-- DDTree(8): tau ")
    assert "12 new tokens" in lines[-1]


def test_run_json_fields_and_trace(capsys, pair_args, tmp_path):
    import workbench as wb

    trace = tmp_path / "t.jsonl"
    rc, out, err = call(capsys, ["run", "--prompt", "t1 t2 t3", "--policy", "dflash", "--max-new-tokens", "10",
                                 "--json", "--trace", str(trace), *pair_args])
    assert rc == 0, err
    obj = json.loads(out)  # exactly one object on stdout
    for k in ("policy", "text", "new_tokens", "cycles", "tau", "accept_lengths", "tokens_per_s", "stage_seconds"):
        assert k in obj, k
    assert obj["policy"] == "DFlash"
    assert obj["new_tokens"] == 10
    assert obj["cycles"] == len(obj["accept_lengths"])
    assert obj["tau"] == pytest.approx(sum(obj["accept_lengths"]) / obj["cycles"])
    assert set(obj["stage_seconds"]) == set(STAGES)
    t = wb.Trace.load(trace)
    assert t.accept_lengths == obj["accept_lengths"] and t.policy == "DFlash"


def test_run_sampling_options_reach_the_session(capsys, pair_args):
    argv = ["run", "--prompt", "t1 t2", "--policy", "ar", "--max-new-tokens", "8", "--temperature", "1.0",
            "--top-p", "0.9", "--top-k", "5", "--json", *pair_args]
    a = json.loads(call(capsys, [*argv, "--seed", "1"])[1])
    b = json.loads(call(capsys, [*argv, "--seed", "1"])[1])
    assert a["tokens"] == b["tokens"]
    assert (a["temperature"], a["top_p"], a["top_k"]) == (1.0, 0.9, 5)


def test_run_on_embedded_default(capsys):
    rc, out, err = call(capsys, ["run", "--prompt", "def parse(line):\n", "--policy", "ddtree:16",
                                 "--max-new-tokens", "16", "--json"])
    assert rc == 0, err
    obj = json.loads(out)
    assert obj["new_tokens"] == 16 and obj["tau"] >= 1.0


def test_run_on_the_embedded_hybrid_pair_by_name(capsys, tmp_path):
    """--target hybrid alone names the embedded hybrid pair; a lone --target DIR is still refused."""
    trace = tmp_path / "h.jsonl"
    rc, out, err = call(capsys, ["run", "--target", "hybrid", "--prompt", "def parse(line):\n", "--policy", "ddtree:8",
                                 "--max-new-tokens", "12", "--json", "--trace", str(trace)])
    assert rc == 0, err
    assert json.loads(out)["new_tokens"] == 12
    meta = json.loads(trace.read_text().splitlines()[0])
    assert "assets/hybrid/target" in json.dumps(meta)
    assert_usage_error(capsys, ["run", "--target", "/nonexistent/t", "--prompt", "x"], "--target and --draft go together")


# ------------------------------------------------------------------------------------------------ bench
def test_bench_lossless_all_policies_json_and_rows(capsys, pair_args, prompts_file, tmp_path):
    rows_file = tmp_path / "rows.jsonl"
    rc, out, err = call(capsys, ["bench", "--policies", ALL_POLICIES, "--prompts", str(prompts_file),
                                 "--max-new-tokens", "24", "--repeats", "2", "--check-lossless", "--json",
                                 "--out", str(rows_file), *pair_args])
    assert rc == 0, err
    summary = json.loads(out)
    st = summary.pop("settings")  # the run's settings and versions come first
    assert (st["prompts"], st["max_new_tokens"], st["repeats"], st["device"], st["dtype"], st["threads"]) == (
        2, 24, 2, "cpu", "float32", 1)
    assert st["seeds"] == [0] and st["versions"]["torch"] and st["versions"]["workbench"]
    assert list(summary) == ["AR", "DFlash", "DDTree(1)", "DDTree(8)", "DDTree(32)"]
    for s in summary.values():  # units in the key names
        assert s["wall_time_s"] == s["wall_time"]
        assert s["stage_percentiles_ms"]["cycle"]["p50_ms"] == pytest.approx(1e3 * s["stage_percentiles"]["cycle"]["p50"])
    for label, s in summary.items():
        for k in ("tau", "tokens_per_s", "speedup_vs_ar", "accept_rate", "lossless", "stage_seconds",
                  "ceiling_speedup"):
            assert k in s, (label, k)
        assert s["lossless"] is True
        assert s["tau"] >= 1.0 and s["tokens_per_s"] > 0
    assert summary["AR"]["tau"] == 1.0 and summary["AR"]["speedup_vs_ar"] == 1.0
    assert summary["AR"]["accept_rate"] is None
    for label in ("DFlash", "DDTree(8)"):
        assert 0.0 <= summary[label]["accept_rate"] <= 1.0

    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    assert len(rows) == 2 * 5  # one per (prompt, policy), medians over the repeats
    for r in rows:
        for k in ("question_id", "new_tokens", "wall_time", "accept_lengths", "decoding_steps",
                  "policy", "tau", "tokens_per_s", "stage_seconds", "text"):
            assert k in r, k
        assert r["decoding_steps"] == len(r["accept_lengths"])
        assert len(r["wall_times"]) == 2
    assert {r["question_id"] for r in rows} == {"a", "b"}
    # greedy: every policy wrote the same text as AR on each prompt
    for q in ("a", "b"):
        assert len({r["text"] for r in rows if r["question_id"] == q}) == 1


def test_bench_interleaves_policies_prompt_by_prompt(monkeypatch, pair_args, prompts_file, capsys):
    calls = []
    real = bench_mod.run_one

    def spy(engine, policy, prompt, max_new_tokens, *a, **kw):
        calls.append((prompt, str(policy), max_new_tokens))
        return real(engine, policy, prompt, max_new_tokens, *a, **kw)

    monkeypatch.setattr(bench_mod, "run_one", spy)
    rc, out, err = call(capsys, ["bench", "--policies", "ar,ddtree:4", "--prompts", str(prompts_file),
                                 "--max-new-tokens", "20", "--repeats", "2", *pair_args])
    assert rc == 0, err
    timed = [c for c in calls if c[2] == 20]
    warm = calls[: len(calls) - len(timed)]
    assert [c[1] for c in warm] == ["AR", "DDTree(4)"]  # a warm-up per policy first
    assert [c[1] for c in timed] == ["AR", "DDTree(4)"] * 4  # A B A B ... for each prompt and repeat
    assert [c[0] for c in timed][:4] == ["t1 t5 t9 t3"] * 4
    assert "AR" in out and "DDTree(4)" in out and "tau" in out  # the table


def test_bench_check_lossless_fails_on_a_broken_policy(monkeypatch, pair_args, prompts_file, capsys):
    real = bench_mod.run_one

    def broken(engine, policy, prompt, *a, **kw):
        r = real(engine, policy, prompt, *a, **kw)
        if str(policy) == "DDTree(8)" and prompt.startswith("t40"):
            r.tokens[5] = (r.tokens[5] + 1) % 60
        return r

    monkeypatch.setattr(bench_mod, "run_one", broken)
    argv = ["bench", "--policies", "dflash,ddtree:8", "--prompts", str(prompts_file), "--max-new-tokens", "16",
            "--json", *pair_args]
    rc, out, err = call(capsys, [*argv, "--check-lossless"])
    assert rc == 1
    assert "'b'" in err and "DDTree(8)" in err and "token 5" in err
    summary = json.loads(out)
    assert summary["DDTree(8)"]["lossless"] is False and summary["DFlash"]["lossless"] is True
    assert "AR" in summary  # the reference was added
    # without the flag the same run reports but does not fail
    rc, out, err = call(capsys, argv)
    assert rc == 0


def test_bench_keeps_prompts_with_the_same_id_apart(capsys, pair_args, tmp_path):
    p = tmp_path / "dup.jsonl"
    p.write_text('{"id": "x", "prompt": "t1 t2"}\n{"id": "x", "prompt": "t7 t7 t9"}\n')
    rows = tmp_path / "rows.jsonl"
    rc, out, err = call(capsys, ["bench", "--policies", "ar", "--prompts", str(p), "--max-new-tokens", "4",
                                 "--no-warmup", "--out", str(rows), "--json", *pair_args])
    assert rc == 0, err
    assert len(rows.read_text().splitlines()) == 2
    assert json.loads(out)["AR"]["new_tokens"] == 8


def test_first_difference():
    assert bench_mod.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert bench_mod.first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert bench_mod.first_difference([1, 2, 3], [1, 2]) == 2


def test_bench_on_embedded_default_eval_prompts(capsys):
    rc, out, err = call(capsys, ["bench", "--policies", "ar,ddtree:16", "--limit", "1", "--max-new-tokens", "12",
                                 "--repeats", "1", "--check-lossless", "--json", "--no-warmup"])
    assert rc == 0, err
    s = json.loads(out)
    assert s["DDTree(16)"]["lossless"] is True and s["DDTree(16)"]["tau"] > 1.0


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("argv, needle", [
    (["run", "--prompt", "t1", "--policy", "beam"], "unknown policy 'beam'"),
    (["run", "--prompt", "t1", "--policy", "ddtree:0"], "positive integer"),
    (["run", "--prompt", "t1", "--policy", "ddtree:-4"], "positive integer"),
    (["run", "--prompt", "t1", "--policy", "ddtree:abc"], "positive integer"),
    (["run", "--prompt", "t1", "--policy", "ddtree:2.5"], "positive integer"),
    (["bench", "--policies", "ar,foo"], "unknown policy 'foo'"),
    (["bench", "--policies", "ar,ddtree:0"], "positive integer"),
    (["bench", "--policies", ","], "names no policy"),
    # an empty list or entry is refused as pays-off refuses it (one parser, validate.policy_list)
    (["bench", "--policies", ""], "--policies '' names no policy; give e.g. 'dflash,ddtree:8'"),
    (["bench", "--policies", "dflash,,ddtree:8"], "--policies 'dflash,,ddtree:8': entry 2 is empty; remove the "
                                                  "extra comma"),
    (["bench", "--policies", "ddtree:8,DDTree(8)"], "--policies 'ddtree:8,DDTree(8)': DDTree(8) is listed twice"),
    (["run", "--prompt", "t1", "--max-new-tokens", "0"], "positive integer"),
    (["bench", "--repeats", "x"], "positive integer"),
    (["run"], "--prompt"),
    (["frobnicate"], "invalid choice"),
    (["kernels", "--budgets", "16,zero"], "positive integer"),
])
def test_bad_arguments_one_line_exit_2(capsys, argv, needle):
    assert_usage_error(capsys, argv, needle)


def test_prompts_file_missing(capsys, tmp_path):
    assert_usage_error(capsys, ["bench", "--prompts", str(tmp_path / "nope.jsonl")], "nope.jsonl", "does not exist")


def test_prompts_file_malformed_names_the_line(capsys, tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": "a", "prompt": "t1 t2"}\n\n{"id": "b", "prompt": \n')
    assert_usage_error(capsys, ["bench", "--prompts", str(p)], "bad.jsonl:3:")
    p.write_text('{"id": "a", "prompt": "t1 t2"}\n{"id": "b"}\n')
    assert_usage_error(capsys, ["bench", "--prompts", str(p)], "bad.jsonl:2:")


def test_prompt_too_long_fails_before_the_run(capsys, tmp_path, pair_args):
    p = tmp_path / "long.txt"
    p.write_text("t1 t2\n" + " ".join(["t3"] * 300) + "\n")
    assert_usage_error(capsys, ["bench", "--prompts", str(p), *pair_args], "line-2", "300 tokens")


def test_cuda_without_cuda(capsys, monkeypatch, pair_args):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert_usage_error(capsys, ["run", "--prompt", "t1", "--device", "cuda", *pair_args], "CUDA is not available")
    assert_usage_error(capsys, ["kernels", "--device", "cuda"], "CUDA is not available")


def test_sglang_backend_without_the_kernels(capsys, monkeypatch, pair_args):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    assert_usage_error(capsys, ["run", "--prompt", "t1", "--kernel-backend", "sglang", *pair_args],
                       "sglang", "install")
    assert_usage_error(capsys, ["run", "--prompt", "t1", "--kernel-backend", "cuda-magic", *pair_args],
                       "not one of")


def test_model_dirs_bad(capsys, tmp_path, pair_args):
    assert_usage_error(capsys, ["run", "--prompt", "t1", "--target", str(tmp_path)], "--target and --draft")
    assert_usage_error(capsys, ["run", "--prompt", "t1", "--target", str(tmp_path / "x"), "--draft",
                                str(tmp_path / "y")], "not a directory")


def test_report_bad_input(capsys, tmp_path):
    assert_usage_error(capsys, ["report", str(tmp_path / "missing.jsonl")], "does not exist")
    p = tmp_path / "junk.jsonl"
    p.write_text('{"policy": "AR", "accept_lengths": [1], "stage_seconds": {}}\nnot json\n')
    assert_usage_error(capsys, ["report", str(p), "--out", str(tmp_path / "r.html")], "junk.jsonl:2:")


# ------------------------------------------------------------------------------------------------ kernels
def test_kernels_json(capsys):
    rc, out, err = call(capsys, ["kernels", "--budgets", "16,64", "--repeats", "1", "--json"])
    assert rc == 0, err
    res = json.loads(out)
    assert [r["budget"] for r in res["tree_build"]] == [16, 64]
    for r in res["tree_build"]:
        assert r["vectorized_s"] > 0 and r["heap_s"] > 0
    for r in res["accept"]:
        assert r["torch_s"] > 0
        assert r["sglang_s"] is not None or "sglang_error" in r
    for r in res["kv_compact"]:
        assert r["compact_kv_s"] > 0 and r["loop_s"] > 0 and r["accepted"] >= 2
    assert res["logprobs_shape"] == [1, 15, 4096]


def test_kernels_table(capsys):
    rc, out, err = call(capsys, ["kernels", "--budgets", "16", "--repeats", "1"])
    assert rc == 0, err
    assert "tree build" in out and "accept walk" in out and "kv compaction" in out


# ------------------------------------------------------------------------------------------------ report
def test_report_from_trace_and_from_bench(capsys, pair_args, prompts_file, tmp_path):
    trace, rows, html1, html2 = (tmp_path / n for n in ("t.jsonl", "rows.jsonl", "t.html", "b.html"))
    assert call(capsys, ["run", "--prompt", "t1 t2", "--max-new-tokens", "8", "--trace", str(trace),
                         *pair_args])[0] == 0
    rc, out, err = call(capsys, ["report", str(trace), "--out", str(html1)])
    assert rc == 0, err
    assert html1.stat().st_size > 0
    assert call(capsys, ["bench", "--policies", "ar,ddtree:8", "--prompts", str(prompts_file), "--max-new-tokens",
                         "8", "--out", str(rows), "--no-warmup", *pair_args])[0] == 0
    rc, out, err = call(capsys, ["report", str(rows), "--out", str(html2)])
    assert rc == 0, err
    page = html2.read_text()
    assert page.startswith("<!DOCTYPE html>") and "DDTree(8)" in page
    assert "<script src=" not in page  # self-contained: nothing fetched from a CDN


# ------------------------------------------------------------------------------------------------ check before work
@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: what is checked here must be refused before it."""
    from workbench.interface import registry  # every engine loads through registry.load (wb.load too)

    def refuse(*args, **kwargs):
        raise AssertionError("the models were loaded before the bad input was refused")

    monkeypatch.setattr(registry, "load", refuse)


@pytest.mark.parametrize("argv, needles", [
    (["run", "--prompt", "x", "--max-new-tokens", "200", "--trace", "/proc/version"], ["--trace", "/proc/version"]),
    (["run", "--prompt", "x", "--trace", "/dev/null"], ["--trace '/dev/null' exists and is not a regular file"]),
    (["bench", "--count-ops", "--policies", "ar,dflash"],
     ["--count-ops counts DDTree budgets; --policies 'ar,dflash' has none"]),
    (["bench", "--reference", "--policies", "ar"], ["--reference compares DDTree budgets"]),
    (["bench", "--batch-size", "2", "--out", "/tmp/x.jsonl"], ["--batch-size runs the batched bench only; --out"]),
], ids=["trace-in-proc", "trace-dev-null", "count-ops-without-ddtree", "reference-without-ddtree",
        "batch-size-ignores-out"])
def test_outputs_and_option_combinations_are_refused_before_any_model_loads(capsys, no_model_load, argv, needles):
    assert_usage_error(capsys, argv, *needles)


def test_serve_refuses_a_port_in_use_before_loading_the_models(capsys, no_model_load, tmp_path):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        token = tmp_path / "token"
        line = assert_usage_error(capsys, ["serve", "--port", str(port), "--token-file", str(token)],
                                  f"cannot listen on 127.0.0.1:{port}", "pick another --port")
    assert "in use" in line and not token.exists()  # nothing written for a server that never started


@pytest.mark.parametrize("row, needle", [
    ({"policy": "AR", "accept_lengths": "many", "stage_seconds": {}}, "accept_lengths='many' is not a list"),
    ({"policy": "AR", "accept_lengths": [1, 2], "stage_seconds": {"draft": "slow"}}, "stage_seconds="),
    ({"policy": "AR", "accept_lengths": [1], "stage_seconds": {}, "wall_time": None}, "wall_time=None"),
    ({"policy": 3, "accept_lengths": [1], "stage_seconds": {}}, "policy=3 is not a label"),
])
def test_report_on_a_malformed_bench_row_is_one_line(capsys, tmp_path, row, needle):
    p = tmp_path / "bench.jsonl"
    p.write_text(json.dumps({"policy": "AR", "accept_lengths": [1], "stage_seconds": {}}) + "\n" + json.dumps(row) + "\n")
    out = tmp_path / "r.html"
    assert_usage_error(capsys, ["report", str(p), "--out", str(out)], "bench.jsonl:2: damaged bench row", needle)
    assert not out.exists()


def test_kernels_refuses_a_budget_given_twice(capsys):
    assert_usage_error(capsys, ["kernels", "--budgets", "16,16"], "budget 16 is given twice")
    with pytest.raises(ValueError, match="budget 16 is given twice"):
        kernel_mod.time_kernels([16, 32, 16])


def test_kernels_flags_timings_that_contradict_each_other(monkeypatch):
    """On a CPU build_tree is a host heap: a heap 60x faster than it (or a build+compile below the build
    alone) is a busy machine, and the row says so instead of printing 'heap/ours 0.0'."""
    import itertools

    fake = itertools.cycle([6.748e-3, 0.1e-3, 11.975e-3])  # build_tree, heap, build+compile (measured ms)

    def timed(row, name, fn, repeats, dev):
        row[f"{name}_s"] = v = next(fake) if name in ("vectorized", "heap", "build_compile") else 1e-4
        row[f"{name}_range_s"] = [v, v]
        return v

    monkeypatch.setattr(kernel_mod, "_timed", timed)
    res = kernel_mod.time_kernels([32], repeats=1, progress=False)
    row = res["tree_build"][0]
    assert "run the same host heap on a CPU yet differ 67.5x" in row["contradiction"]
    table = kernel_mod.kernel_table(res)
    assert "0.015" in table and "! budget 32:" in table


def test_bench_samples_with_temperature_and_seed(capsys, pair_args, prompts_file, tmp_path):
    argv = ["bench", *pair_args, "--prompts", str(prompts_file), "--policies", "ddtree:8", "--max-new-tokens", "12",
            "--repeats", "1", "--no-warmup", "--json", "--no-progress", "--temperature", "1.5"]
    texts = []
    for seed in ("1", "1", "2"):
        rows = tmp_path / f"rows{len(texts)}.jsonl"
        rc, out, err = call(capsys, argv + ["--seed", seed, "--out", str(rows)])
        assert rc == 0, err
        res = json.loads(out)
        assert res["settings"]["temperature"] == 1.5 and res["settings"]["seeds"] == [int(seed)]
        texts.append([json.loads(line)["text"] for line in rows.read_text().splitlines()])
    assert texts[0] == texts[1] != texts[2]  # the seed decides the samples
    assert_usage_error(capsys, ["bench", "--temperature", "0.5", "--check-lossless"], "--check-lossless compares greedy")


def test_no_summary_figure_contradicts_its_own_range(monkeypatch):
    """A figure such as 'DDTree(4) ... vs AR 0.74x [0.86-1.11 over repeats]' cannot be printed: per-prompt
    medians, summed, fall outside every repeat's own figure when slow passes hit different prompts. With repeats,
    tokens_per_s and speedup_vs_ar are the medians over repeats: inside their ranges, and the very
    figures the order verdict ranks by."""
    import itertools

    from workbench.analysis.spread import order_verdict
    from workbench.bench.policy_bench import Run

    # wall time per (policy, prompt) over the three repeats: each prompt is slow in a different pass
    walls = {"AR": [[1, 1, 1], [1, 1, 1], [1, 1, 1]], "DFlash": [[0.2, 2, 2], [2, 0.2, 2], [2, 2, 0.2]]}
    calls = {k: itertools.count() for k in walls}
    prompts = [{"id": str(i), "prompt": f"t{i}"} for i in range(3)]

    def fake_run(engine, policy, prompt, max_new_tokens, temperature=0.0, seed=0):
        i = next(calls[str(policy)])
        w = walls[str(policy)][int(prompt[1:])][i % 3]  # prompts outer, then repeats (bench interleaves)
        return Run(str(policy), [1] * 10, "", w, 0.0, [1] * 9, 9, 9, {}, None, [{}] * 9)

    class Engine:
        device, kernel_backend = "cpu", "torch"

        class models:
            max_positions, dtype = 1024, "float32"

        @staticmethod
        def tokenizer(text, add_special_tokens=False):
            return {"input_ids": [1]}

    monkeypatch.setattr(bench_mod, "run_one", fake_run)
    res = bench_mod.compare_policies(Engine, ["ar", "dflash"], prompts, max_new_tokens=10, repeats=3, warmup=False, progress=False)
    for label, s in res.summary.items():
        lo, hi = s["tokens_per_s_range"]
        assert lo <= s["tokens_per_s"] <= hi, (label, s["tokens_per_s"], lo, hi)
        lo, hi = s["speedup_vs_ar_range"]
        assert lo <= s["speedup_vs_ar"] <= hi, (label, s["speedup_vs_ar"], lo, hi)
    verdict = order_verdict(res.summary)
    assert verdict.order[0] == max(res.summary, key=lambda k: res.summary[k]["speedup_vs_ar"])
    # the summed per-prompt medians would have been outside: this case tests something
    old = 30 / sum(sorted(w)[1] for w in walls["DFlash"])
    lo, hi = res.summary["DFlash"]["tokens_per_s_range"]
    assert not lo <= old <= hi
