"""Records and surfaces you can trust: mixed-policy traces, damaged trace files, session
setters, compact reprs, policy labels that parse back, prompts files, the bench ceiling, the stepper."""
from __future__ import annotations

import inspect
import json

import pytest
import torch

import workbench as wb
from workbench.records.cycle import TraceFileError
from workbench.engine.core import DEFAULT_MAX_NEW_TOKENS
from workbench.engine.policies import parse_policy


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny pair without end-of-text, so every session runs to its token limit."""
    from tiny_models import make_pair

    return make_pair(tmp_path_factory.mktemp("noeos"), vocab=64, hidden=32, layers=4, layer_ids=(1, 2),
                     block_size=8, seed=5, eos=False)


@pytest.fixture(scope="module")
def eng(pair):
    t, d = pair
    return wb.load(target=t, draft=d)


def mixed_session(eng, n=40):
    """A mixed run: DFlash for a cycle, DDTree(64) for a cycle, then DDTree(64) sampling at 0.9."""
    s = eng.session("t1 t2 t3", policy=wb.DFlash(), max_new_tokens=n)
    s.step()
    s.policy = wb.DDTree(64)
    s.step()
    s.temperature = 0.9
    s.top_p = 0.95
    s.run()
    return s


# ------------------------------------------------------------------------------ mixed settings
def test_mixed_policy_trace_reports_per_policy_figures(eng, tmp_path):
    s = mixed_session(eng)
    t = s.trace
    assert [c.setting for c in t[:3]] == ["DFlash", "DDTree(64)", "DDTree(64) T=0.9 top_p=0.95"]
    assert (t[2].temperature, t[2].top_p, t[2].top_k) == (0.9, 0.95, 0)
    # the header lists every policy and temperature the session ran with
    assert t.meta["policy"] == ["DFlash", "DDTree(64)"]
    assert t.meta["temperature"] == [0.0, 0.9] and t.meta["top_p"] == [1.0, 0.95] and t.meta["top_k"] == 0
    summ = t.summary()
    assert summ.policy == "DFlash + DDTree(64) + DDTree(64) T=0.9 top_p=0.95" == t.policy
    assert list(summ.by_policy) == ["DFlash", "DDTree(64)", "DDTree(64) T=0.9 top_p=0.95"]
    assert sum(f.cycles for f in summ.by_policy.values()) == summ.cycles
    for label, f in summ.by_policy.items():
        own = [c for c in t if c.setting == label]
        assert f.cycles == len(own) and f.committed == sum(c.committed for c in own)
        assert f.tau == pytest.approx(sum(c.accept_length for c in own) / len(own))
    assert "DDTree(64) T=0.9 top_p=0.95: tau" in str(summ)  # the text shows the split
    # the split survives a save / load, and the report shows it
    back = wb.Trace.load(t.save(tmp_path / "mixed.jsonl"))
    assert back.policy == t.policy and back.meta["temperature"] == [0.0, 0.9]
    assert list(back.summary().by_policy) == list(summ.by_policy)
    page = wb.views.report_html(back)
    assert "DDTree(64) T=0.9 top_p=0.95" in page and "0.0 → 0.9" in page


def test_single_policy_trace_keeps_plain_labels(eng):
    t = eng.generate("t1 t2", wb.DDTree(8), max_new_tokens=12)
    assert t.policy == "DDTree(8)" and t.meta["policy"] == "DDTree(8)" and t.meta["temperature"] == 0.0
    assert list(t.summary().by_policy) == ["DDTree(8)"] and not t.summary().mixed


def test_summary_tokens_per_s_divides_the_numbers_it_shows(eng):
    t = eng.generate("t1 t2", wb.DDTree(8), max_new_tokens=20)
    s = t.summary()
    assert s.new_tokens == 20 and sum(c.committed for c in t) == 19
    assert s.seconds == pytest.approx(t.prefill_seconds + sum(c.seconds for c in t))
    assert s.tokens_per_s == pytest.approx(s.new_tokens / s.seconds)
    assert s.decode_tokens_per_s == pytest.approx(19 / sum(c.seconds for c in t))
    assert f"{s.new_tokens} new tokens" in str(s) and f"{s.tokens_per_s:.1f} tok/s" in str(s)


# ------------------------------------------------------------------------------ damaged trace files
def _lines(eng, tmp_path):
    t = eng.generate("t1 t2 t3", wb.DDTree(8), max_new_tokens=16)
    p = t.save(tmp_path / "good.jsonl")
    return p.read_text().splitlines()


def _drop_key(line, key):
    d = json.loads(line)
    del d[key]
    return json.dumps(d)


def _bad_dtype(line):
    d = json.loads(line)
    d["tokens"]["dtype"] = "int13"
    return json.dumps(d)


def _bad_shape(line):
    d = json.loads(line)
    d["visibility"]["shape"] = [3, 1000]
    return json.dumps(d)


DAMAGE = {
    # name: (edit the lines, the line number the error must name, a word it must say)
    "cycle line missing a key": (lambda ls: ls[:2] + [_drop_key(ls[2], "parents")] + ls[3:], 3, "'parents'"),
    "bad dtype string": (lambda ls: ls[:2] + [_bad_dtype(ls[2])] + ls[3:], 3, "int13"),
    "tensor of the wrong shape": (lambda ls: ls[:1] + [_bad_shape(ls[1])] + ls[2:], 2, "visibility"),
    "cut-off middle line": (lambda ls: ls[:2] + [ls[2][: len(ls[2]) // 2]] + ls[3:], 3, "not valid JSON"),
    "cycle line not an object": (lambda ls: ls[:2] + ["[1, 2]"] + ls[3:], 3, "JSON object"),
    "header missing a key": (lambda ls: [_drop_key(ls[0], "new_tokens")] + ls[1:], 1, "new_tokens"),
    "end line missing": (lambda ls: ls[:-1], None, "truncated"),
    "future version": (lambda ls: [ls[0].replace('"version": 2', '"version": 9')] + ls[1:], 1, "version 9"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_every_damaged_trace_is_a_trace_file_error_naming_file_and_line(eng, tmp_path, case, capsys):
    edit, line, word = DAMAGE[case]
    lines = _lines(eng, tmp_path)
    bad = tmp_path / "bad.jsonl"
    new = edit(lines)
    bad.write_text("\n".join(new) + "\n")
    line = line or len(new)
    with pytest.raises(TraceFileError) as e:
        wb.Trace.load(bad)
    msg = str(e.value)
    assert f"bad.jsonl:{line}:" in msg and word in msg, msg
    # the CLI: exit 2, one line, naming file and line
    from workbench.cli import main

    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"bad.jsonl:{line}:" in err[0] and "Traceback" not in err[0]
    assert not (tmp_path / "r.html").exists()


def test_random_bytes_are_refused_with_file_and_line(eng, tmp_path, capsys):
    from workbench.cli import main

    bad = tmp_path / "noise.jsonl"
    bad.write_bytes(bytes(range(128, 256)) * 4)
    with pytest.raises(TraceFileError, match=r"noise.jsonl:1: not UTF-8"):
        wb.Trace.load(bad)
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "noise.jsonl:1:" in err[0]
    # a good header, then noise on line 3
    lines = _lines(eng, tmp_path)
    bad.write_bytes(("\n".join(lines[:2]) + "\n").encode() + bytes(range(128, 256)) + b"\n")
    with pytest.raises(TraceFileError, match=r"noise.jsonl:3: not UTF-8"):
        wb.Trace.load(bad)
    assert main(["report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    assert "noise.jsonl:3:" in capsys.readouterr().err


def test_version_1_traces_still_load(eng, tmp_path):
    """Version 1 stored top_p / top_k only in the header; they fill in every cycle."""
    t = eng.generate("t1 t2 t3", wb.DDTree(8), max_new_tokens=12, temperature=0.7, top_p=0.8, top_k=9)
    lines = t.save(tmp_path / "v2.jsonl").read_text().splitlines()
    head = json.loads(lines[0])
    head["version"] = 1
    cycles = [json.loads(x) for x in lines[1:-1]]
    for c in cycles:
        del c["top_p"], c["top_k"]
    v1 = tmp_path / "v1.jsonl"
    v1.write_text("\n".join([json.dumps(head), *map(json.dumps, cycles), lines[-1]]) + "\n")
    back = wb.Trace.load(v1)
    assert [(c.top_p, c.top_k) for c in back] == [(0.8, 9)] * len(t)
    assert back.accept_lengths == t.accept_lengths and back.policy == "DDTree(8) T=0.7 top_p=0.8 top_k=9"


# ------------------------------------------------------------------------------ session setters
def test_top_k_setter_takes_effect(eng):
    """top_k = 1 makes every sample the argmax: each token after the prefill's is the target's argmax."""
    s = eng.session("t3 t9 t27", policy=wb.DDTree(8), temperature=5.0, seed=1, max_new_tokens=24)
    s.top_k = 1
    s.run()
    assert s.top_k == 1 and all(c.top_k == 1 for c in s.cycles) and len(s.tokens) > 8
    ids = torch.tensor([s.prompt_ids + s.tokens[:-1]])
    with torch.inference_mode():
        logits = eng.models.target(input_ids=ids).logits[0]
    argmax = logits[len(s.prompt_ids) - 1:].argmax(-1).tolist()  # the prediction of each generated token
    assert s.tokens[1:] == argmax[1:]


def test_top_p_setter_takes_effect(eng):
    """A tiny top_p keeps only the most likely token: the same argmax property."""
    s = eng.session("t3 t9 t27", policy=wb.DFlash(), temperature=5.0, seed=2, max_new_tokens=20)
    s.top_p = 1e-6
    s.run()
    assert all(c.top_p == 1e-6 for c in s.cycles) and len(s.tokens) > 8
    ids = torch.tensor([s.prompt_ids + s.tokens[:-1]])
    with torch.inference_mode():
        argmax = eng.models.target(input_ids=ids).logits[0, len(s.prompt_ids) - 1:].argmax(-1).tolist()
    assert s.tokens[1:] == argmax[1:]


@pytest.mark.parametrize("attr,value,match", [
    ("top_p", 0.0, r"top_p=0.0 must be in \(0, 1\]"),
    ("top_p", 1.5, "top_p=1.5"),
    ("top_k", -1, "top_k=-1"),
    ("top_k", 2.5, "top_k=2.5"),
    ("temperature", -1.0, "temperature=-1.0"),
    ("max_new_tokens", 0, "max_new_tokens=0 must be a positive integer"),
    ("max_new_tokens", 3.0, "max_new_tokens=3.0"),
])
def test_setters_refuse_bad_values(eng, attr, value, match):
    s = eng.session("t1", policy=wb.DFlash(), max_new_tokens=8)
    before = getattr(s, attr)
    with pytest.raises(ValueError, match=match):
        setattr(s, attr, value)
    assert getattr(s, attr) == before


def test_max_new_tokens_setter_and_run_wording(eng):
    s = eng.session("t1 t2", policy=wb.DDTree(8), max_new_tokens=16)
    s.run()
    assert len(s.tokens) == 16 and s.finish_reason == "reached max_new_tokens=16"
    with pytest.raises(ValueError, match="below the 16 new tokens this session already has"):
        s.run(max_new_tokens=4)
    assert s.max_new_tokens == 16 and s.finish_reason == "reached max_new_tokens=16"
    s.max_new_tokens = 20  # a larger limit lets it go on
    assert not s.finished
    s.run()
    assert len(s.tokens) == 20 and s.finish_reason == "reached max_new_tokens=20"
    fresh = eng.session("t1 t2", policy=wb.DDTree(8), max_new_tokens=16)
    fresh.run(max_new_tokens=4)
    assert len(fresh.tokens) == 4 and fresh.finish_reason == "reached max_new_tokens=4"
    assert fresh.trace.finish_reason == "reached max_new_tokens=4"
    one = eng.session("t1 t2", policy=wb.AR(), max_new_tokens=16)
    one.max_new_tokens = 1  # the prefill's token is all it may keep: it ends now
    assert one.finished and one.finish_reason == "reached max_new_tokens=1"


def test_seed_out_of_range_is_refused(eng):
    with pytest.raises(ValueError, match=r"seed=-1 must be an integer from 0 to 2\*\*64-1"):
        eng.session("t1", seed=-1)
    with pytest.raises(ValueError, match="seed="):
        eng.session("t1", seed=2**64)


def test_one_default_for_max_new_tokens():
    from workbench.cli import build_parser
    from workbench.engine.core import Engine

    assert inspect.signature(Engine.session).parameters["max_new_tokens"].default == DEFAULT_MAX_NEW_TOKENS
    assert inspect.signature(Engine.generate).parameters["max_new_tokens"].default == DEFAULT_MAX_NEW_TOKENS
    parser = build_parser()
    assert parser.parse_args(["run", "--prompt", "x"]).max_new_tokens == DEFAULT_MAX_NEW_TOKENS
    assert parser.parse_args(["bench"]).max_new_tokens == DEFAULT_MAX_NEW_TOKENS


# ------------------------------------------------------------------------------ compact displays
def test_trace_and_cycle_reprs_are_compact(eng):
    s = mixed_session(eng, n=120)
    t = s.trace
    assert len(t) > 20
    for obj in (t, t[1], t[-1]):
        text, page = repr(obj), obj._repr_html_()
        assert len(text) < 2000 and len(page) < 2000, (type(obj).__name__, len(text), len(page))
    assert repr(t).startswith(f"Trace({t.policy}, {len(t)} cycles, {t.new_tokens} new tokens, tau {t.tau:.2f}")
    c = t[1]
    assert repr(c).startswith(f"Cycle(1, DDTree(64), start={c.start}, {c.n_nodes} drafted nodes")
    assert "<table>" in t._repr_html_() and "<table>" in c._repr_html_()
    assert str(t.summary()) and len(t.summary()._repr_html_()) < 4000


# ------------------------------------------------------------------------------ policies
@pytest.mark.parametrize("policy", [wb.AR(), wb.DFlash(), wb.DDTree(1), wb.DDTree(32), wb.DDTree(16, width=1),
                                    wb.DDTree(4096, width=7), wb.EagleTree(4, 5, 16)])
def test_parse_policy_accepts_every_label_it_prints(policy):
    assert parse_policy(str(policy)) == policy
    assert parse_policy(repr(policy)) == policy  # DDTree(budget=16, width=1) too


def test_bench_policies_accept_printed_labels():
    from workbench.engine.validate import policy_list

    labels = "AR,DFlash,DDTree(16, width=1),DDTree(32),ddtree:8"
    assert policy_list(labels) == [wb.AR(), wb.DFlash(), wb.DDTree(16, width=1), wb.DDTree(32), wb.DDTree(8)]
    with pytest.raises(ValueError, match="width=0"):
        parse_policy("DDTree(4, width=0)")
    with pytest.raises(ValueError, match="positive integers"):
        parse_policy("DDTree(x)")


# ------------------------------------------------------------------------------ prompts files
def test_prompts_text_file_with_a_brace_line_stays_text(tmp_path):
    from workbench.shipped import load_prompts

    p = tmp_path / "prompts"
    p.write_text("def f(x):\n{'a': 1}\nclass A:\n")
    assert [x["prompt"] for x in load_prompts(p)] == ["def f(x):", "{'a': 1}", "class A:"]
    q = tmp_path / "code.txt"
    q.write_text('{"prompt": "looks like json"}\nprint(1)\n')
    assert load_prompts(q)[0]["prompt"] == '{"prompt": "looks like json"}'  # .txt is text
    r = tmp_path / "set"
    r.write_text('{"id": "a", "prompt": "t1"}\n{"id": "b", "prompt": "t2"}\n')
    assert [x["id"] for x in load_prompts(r)] == ["a", "b"]  # a first line that is a JSON object


def test_a_txt_file_of_json_lines_is_refused_by_the_one_loader_every_reader_uses(tmp_path, capsys):
    """Read as text, each JSON line would be a prompt: load_prompts refuses it, so the bench says
    so too, before any model loads, not only pays-off."""
    from workbench.cli import main
    from workbench.shipped import PromptFileError, load_prompts

    f = tmp_path / "set.txt"
    f.write_text('{"id": "a", "prompt": "t1"}\n\n{"id": "b", "prompt": "t2"}\n')
    line = (f"prompts file '{f}' holds JSON lines, but a .txt file is read as one prompt per line (each line's "
            f"JSON would be a prompt): rename it '{tmp_path / 'set.jsonl'}'")
    with pytest.raises(PromptFileError) as e:
        load_prompts(f)
    assert str(e.value) == line
    assert main(["bench", "--prompts", str(f)]) == 2
    assert capsys.readouterr().err.strip() == f"workbench: error: {line}"


def test_prompts_directory_is_refused_clearly(tmp_path, capsys):
    from workbench.cli import main

    assert main(["bench", "--prompts", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a directory" in err[0] and str(tmp_path) in err[0]


# ------------------------------------------------------------------------------ the bench ceiling
def test_measured_speedup_never_exceeds_the_ceiling(eng):
    from workbench.bench.policy_bench import FORWARD_STAGES, compare_policies, summary_table

    prompts = [{"id": "a", "prompt": "t1 t5 t9"}, {"id": "b", "prompt": "t40 t2 t17"}]
    res = compare_policies(eng, ["ar", "dflash", "ddtree:4", "ddtree:32"], prompts, max_new_tokens=24, repeats=2,
                           warmup=False)
    for label, s in res.summary.items():
        share = sum(s["stage_seconds"][k] for k in FORWARD_STAGES) / sum(s["stage_seconds"].values())
        assert s["ceiling_ratio"] == pytest.approx(share), label  # the share of cycle time in the forwards
        assert s["decode_speedup_vs_ar"] <= s["ceiling_speedup"] * (1 + 1e-12), label
        lo, hi = s["tokens_per_s_range"]
        assert 0 < lo <= hi
    assert res.summary["AR"]["ceiling_speedup"] >= 1.0  # AR's cycle is more than its forward
    assert "fwd share" in summary_table(res.summary) and "<= 100%" in summary_table(res.summary)
    one = compare_policies(eng, ["ar"], prompts[:1], max_new_tokens=8, warmup=False)
    assert one.summary["AR"]["tokens_per_s_range"] is None
    assert "one repeat shows no spread" in summary_table(one.summary)


# ------------------------------------------------------------------------------ the stepper
def test_stepper_reflects_the_session_policy(eng):
    s = eng.session("t1 t2", policy=wb.DDTree(16, width=1), max_new_tokens=60)
    st = wb.Stepper(s)
    assert (st.policy_kind.value, st.budget.value) == ("ddtree", 16)
    c = st.step()
    assert c.policy == "DDTree(16, width=1)" and str(s.policy) == "DDTree(16, width=1)"
    st.run(2)
    assert all(x.policy == "DDTree(16, width=1)" for x in s.cycles)
    # set in code: the next step uses it and the controls show it
    s.policy = wb.DFlash()
    s.temperature = 0.7
    c = st.step()
    assert c.policy == "DFlash" and c.temperature == 0.7
    assert st.policy_kind.value == "dflash" and st.temperature.value == 0.7 and st.budget.disabled
    # a user's change applies, keeping a width set in code
    s.policy = wb.DDTree(16, width=1)
    st.step()
    st.budget.value = 5
    assert str(s.policy) == "DDTree(5, width=1)"
    assert st.step().policy == "DDTree(5, width=1)"
    st.reset()
    assert str(st.session.policy) == "DDTree(5, width=1)" and st.session.temperature == 0.7


# ------------------------------------------------------------------------------ the CLI
def _one_line_exit_2(capsys, argv, *needles):
    from workbench.cli import main

    rc = main(argv)
    cap = capsys.readouterr()
    lines = cap.err.strip().splitlines()
    assert rc == 2 and cap.out == "" and len(lines) == 1, (rc, cap.out, cap.err)
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_cli_version(capsys):
    from workbench.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"workbench {wb.__version__}"


def test_cli_every_option_has_help():
    import argparse

    from workbench.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {'/'.join(a.option_strings) or a.dest}"
               for name, p in sub.choices.items() for a in p._actions
               if not isinstance(a, argparse._HelpAction) and not a.help]
    assert missing == []


@pytest.fixture
def no_model_load(monkeypatch):
    """Any model load fails the test: bad input must be refused before the weights load."""
    from workbench.interface import registry  # every engine loads through registry.load (wb.load too)

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was refused")

    monkeypatch.setattr(registry, "load", boom)


def test_cli_outputs_checked_before_any_model_loads(capsys, tmp_path, no_model_load):
    _one_line_exit_2(capsys, ["run", "--prompt", "t1", "--trace", str(tmp_path)], "--trace", str(tmp_path),
                     "is a directory")
    _one_line_exit_2(capsys, ["bench", "--out", str(tmp_path)], "--out", "is a directory")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _one_line_exit_2(capsys, ["run", "--prompt", "t1", "--trace", str(blocker / "t.jsonl")], "--trace",
                     "is not a directory")


@pytest.mark.parametrize("argv,needles", [
    (["run", "--prompt", "t1", "--seed", str(2**64)], ("--seed", "2**64-1")),
    (["run", "--prompt", "t1", "--seed", "-1"], ("--seed", "seed=-1")),
    (["run", "--prompt", "t1", "--device", "tpu"], ("--device", "'tpu'", "cpu, cuda")),
    (["run", "--prompt", "t1", "--device", "meta"], ("--device", "'meta'")),
    (["kernels", "--device", "meta"], ("--device", "'meta'")),
    (["kernels", "--budgets", "16,5000"], ("5000", "4096")),
])
def test_cli_bad_values_refused_up_front(capsys, argv, needles, no_model_load):
    _one_line_exit_2(capsys, argv, *needles)


def test_cli_report_out_directory_and_target(capsys, eng, pair, tmp_path):
    t = eng.generate("t1 t2 t3", wb.DDTree(8), max_new_tokens=10)
    t.meta["target"] = "/another/machine/models/tiny"  # the trace moved: its model path is gone
    p = t.save(tmp_path / "moved.jsonl")
    _one_line_exit_2(capsys, ["report", str(p), "--out", str(tmp_path)], "--out", "is a directory")
    _one_line_exit_2(capsys, ["report", str(p), "--target", str(tmp_path / "nope")], "--target", "not a directory")
    from workbench.cli import main

    out = tmp_path / "ids.html"
    assert main(["report", str(p), "--out", str(out)]) == 0
    assert "tokenizer not found" in out.read_text()
    assert main(["report", str(p), "--out", str(out), "--target", str(pair[0])]) == 0
    page = out.read_text()
    assert "tokenizer not found" not in page
    for word in ("temperature", "top-p", "top-k", "seed", "device", "dtype", "kernel backend", "float32", "cpu"):
        assert word in page, word


def test_shapes_budget_zero_is_one_line_exit_2(capsys):
    from workbench.shapes.__main__ import _main

    with pytest.raises(SystemExit) as e:
        _main(["--plan", "workbench/configs/qwen3-8b.json", "--budget", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--budget 0" in err[0]


def test_kernels_progress_moves_within_a_budget(capsys):
    from workbench.bench.kernel_bench import time_kernels

    time_kernels([16], repeats=1, progress=True, backends=("torch",))
    err = capsys.readouterr().err
    # Each step's label is shown with the count so far (the final 3/3 may be cleared before it is drawn).
    assert "1/3" in err and "2/3" in err and "accept walk" in err and "KV compaction" in err


# ------------------------------------------------------------------------------ the report
def test_embedded_pair_is_stored_relative_to_the_package(engine, tmp_path):
    from workbench.views.report import tokenizer_for

    t = engine.generate("import os\n", wb.AR(), max_new_tokens=3)
    assert t.meta["target"] == "workbench/assets/target" and t.meta["draft"] == "workbench/assets/draft"
    assert tokenizer_for(t) is not None
    t.meta["target"] = "/home/someone/old-checkout/workbench/assets/target"  # a trace from another machine
    assert tokenizer_for(t) is not None
    t.meta["target"] = "/nowhere/model"
    assert tokenizer_for(t) is None


def test_figure_keys_do_not_cover_the_axes(eng):
    from workbench.views.figures import token_stream, tree_figure

    t = eng.generate("t1 t2 t3", wb.DDTree(16), max_new_tokens=30)
    fig = tree_figure(t[0], eng.tokenizer)
    assert fig.layout.legend.y >= 1 and fig.layout.legend.yanchor == "bottom"  # above the plot, not on the ticks
    stream = token_stream(t, eng.tokenizer)
    keys = [a.text for a in stream.layout.annotations]
    assert any("odd cycles" in k and "#fd8d3c" in k and "even cycles" in k for k in keys), keys


# ------------------------------------------------------------------------------ docs and notebooks
ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_docs_name_no_paths_of_another_machine_and_state_the_sampling_rule():
    for name in ("docs/API.md", "README.md"):
        text = (ROOT / name).read_text()
        assert "/work/" not in text and "/home/" not in text, name
        assert "target-only tree sampling" in text or "tree_speculative_sampling_target_only" in text, name
    readme = (ROOT / "README.md").read_text()
    assert "sample at every node" in readme.replace("**", "") and "follows the child" in readme.replace("**", "")


def test_notebook_build_stores_no_widget_state_and_refuses_big_files(tmp_path):
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("nb_build", ROOT / "notebooks" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"x": "y" * 100}}}
    mod.drop_widget_state(nb)
    assert "widgets" not in nb.metadata
    small = mod.build("small", [nbformat.v4.new_code_cell("1 + 1")], execute=False, out_dir=tmp_path)
    assert small.stat().st_size < mod.MAX_NOTEBOOK_BYTES
    with pytest.raises(SystemExit, match="limit 1 MB"):
        mod.build("big", [nbformat.v4.new_markdown_cell("x" * 2_000_000)], execute=False, out_dir=tmp_path)
    assert not (tmp_path / "big.ipynb").exists()
    # the notebook sources say what their outputs now show
    src = "".join(p.read_text() for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py")))
    assert "About the speed above" in src and "(0.0, 0.3, 0.6, 1.0)" in src and "tau falls as the temperature" in src


# ------------------------------------------------------------------------------ a trace replays itself
def test_a_reseed_is_recorded_with_its_cycle_and_the_trace_replays_itself(eng, tmp_path):
    s = eng.session("t1 t2 t3", policy=wb.DDTree(8), temperature=0.9, seed=0, max_new_tokens=30)
    s.step(), s.step()
    s.seed = 7
    s.step()
    s.top_k, s.policy = 5, wb.DFlash()
    s.step()
    s.seed = 7  # the same seed again restarts the sampler: recorded too
    s.run(max_new_tokens=24)
    meta = s.trace.meta
    assert meta["seed"] == [0, 7] and meta["max_new_tokens"] == 30
    assert s.trace.changes() == [{"cycle": 2, "name": "seed", "value": 7}, {"cycle": 3, "name": "top_k", "value": 5},
                                 {"cycle": 3, "name": "policy", "value": "DFlash"},
                                 {"cycle": 4, "name": "seed", "value": 7},
                                 {"cycle": 4, "name": "max_new_tokens", "value": 24}]
    # from the file alone (a saved trace is all a later reader has), the same tokens cycle for cycle
    saved = wb.Trace.load(s.trace.save(tmp_path / "run.trace.jsonl"))
    again = eng.replay(saved)
    assert again.generated == s.generated and [c.setting for c in again.cycles] == [c.setting for c in s.cycles]
    assert [c.accepted_tokens.tolist() for c in again.cycles] == [c.accepted_tokens.tolist() for c in s.cycles]
    # without the re-seeds the same script draws other tokens: their record is what makes the replay exact
    saved.meta["changes"] = [c for c in saved.meta["changes"] if c["name"] != "seed"]
    assert eng.replay(saved).generated != s.generated
