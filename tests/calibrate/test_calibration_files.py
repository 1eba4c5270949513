"""Calibration and pair-head files as the workbench reads them: a head cut short, a value out of range or of the
wrong type, a file missing or without what a policy needs, a calibration copied without its head, a calibration
made on another pair. Each is one line naming the file (and the field), from the Python API, `run`, `bench`,
`calibrate --head` and a served policy change, before any model loads where the file alone shows it."""
from __future__ import annotations

import json
import math
import shutil

import pytest

import workbench as wb
from workbench.__main__ import main as wb_main
from workbench.calibrate.command import main as calibrate_main
from workbench.engine.policies import CostTree, PairTree, PathTree
from workbench.engine.policies.calibration import SHIPPED, CalibrationError, load
from workbench.engine.policies.pair_head import PairHeadError, load_head
from workbench.serve import EngineServer, Limits

HEAD = SHIPPED["dense"].parent / "pair_head.npz"


def doctored(tmp_path, change, name="cal.json"):
    """The shipped dense calibration, changed by ``change`` and written to ``tmp_path / name``."""
    d = json.loads(SHIPPED["dense"].read_text())
    change(d)
    p = tmp_path / name
    p.write_text(json.dumps(d))
    return p


@pytest.fixture()
def cut_head(tmp_path):
    """(a calibration naming a head beside it, that head cut in half)."""
    head = tmp_path / "pair_head.npz"
    head.write_bytes(HEAD.read_bytes()[: HEAD.stat().st_size // 2])
    return doctored(tmp_path, lambda d: d["pair_head"].update(file="pair_head.npz")), head


def one_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def no_model_load(monkeypatch, module: str) -> None:
    def refuse(*_a, **_k):
        raise AssertionError("a model loaded before the calibration file was read")
    monkeypatch.setattr(f"{module}.load_engine", refuse)


# ------------------------------------------------------------------------------ a pair head cut short
def test_a_cut_head_is_one_line_in_python(cut_head, engine):
    cal, head = cut_head
    with pytest.raises(PairHeadError, match=f"pair head {head} is cut short or damaged .*copy it again"):
        load_head(head)
    with pytest.raises(CalibrationError, match="is cut short or damaged"):
        engine.session("def f(x):", policy=PairTree(8, calibration=str(cal)), max_new_tokens=4)


def test_a_cut_conditioned_head_is_one_line(tmp_path):
    from workbench.engine.policies.cond_head import SHIPPED as COND, CondHeadError, load_head as load_cond

    cut = tmp_path / "cond_head.npz"
    cut.write_bytes(COND["dense"].read_bytes()[:4096])
    with pytest.raises(CondHeadError, match=f"conditioned head {cut} is cut short or damaged .*copy it again"):
        load_cond(str(cut))


def test_a_cut_head_is_one_line_from_run(cut_head, capsys, monkeypatch):
    no_model_load(monkeypatch, "workbench.run_command")
    cal, head = cut_head
    assert wb_main(["run", "--prompt", "x", "--policy", f"pairtree(8, calibration={cal})"]) == 2
    assert "is cut short or damaged (BadZipFile" in one_line(capsys.readouterr().err)


def test_a_cut_head_is_one_line_from_calibrate(cut_head, tmp_path, capsys):
    _, head = cut_head
    assert calibrate_main(["--head", str(head), "--out", str(tmp_path / "c.json"), "--quiet"]) == 2
    assert one_line(capsys.readouterr().err).startswith(f"calibrate: pair head {head} is cut short or damaged")


def test_a_cut_head_reaches_the_served_client_as_its_line(cut_head, engine):
    cal, _ = cut_head
    server = EngineServer(engine, port=0, limits=Limits(max_sessions=2, max_new_tokens=8)).start()
    try:
        s = wb.connect(server.url, token=server.token).session("def f(x):", policy=wb.AR(), max_new_tokens=4)
        with pytest.raises(ValueError) as e:
            s.policy = PairTree(8, calibration=str(cal))
        assert "is cut short or damaged" in str(e.value) and "unexpected server error" not in str(e.value)
        s.close(fetch=False)
    finally:
        server.stop()


# ------------------------------------------------------------------------------ values checked on reading
@pytest.mark.parametrize("change,msg", [
    (lambda d: d["thresholds"]["tree"].update({"1": 5.0}), r"thresholds.tree\['1'\] = 5.0 must be a number in \(0, 1\)"),
    (lambda d: d["thresholds"]["chain"].update({"1": 0}), r"thresholds.chain\['1'\] = 0 must be a number in \(0, 1\)"),
    (lambda d: d["thresholds"]["tree"].update({"one": 0.2}), "thresholds.tree key 'one' is not a batch size"),
    (lambda d: d["pair_head"].update(beta=math.nan), "pair_head.beta = nan must be a finite number >= 0"),
    (lambda d: d["made"].update(cycles="many"), "made.cycles = 'many' is not a whole number"),
    (lambda d: d["acceptance"].update(width="16"), "acceptance.width = '16' is not a whole number"),
])
def test_calibration_values_are_checked_on_reading(tmp_path, change, msg):
    p = doctored(tmp_path, change)
    with pytest.raises(CalibrationError, match=msg) as e:
        load(str(p))
    assert str(e.value).startswith(f"calibration {p}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("policy,msg", [
    ("costtree(16, calibration={missing})", "is not a file nor a shipped one"),
    ("pathtree(16, calibration={notjson})", "is not JSON"),
    ("costtree(16, calibration={nocost})", "holds no cost table"),
])
def test_what_the_file_alone_shows_is_refused_before_any_model_loads(tmp_path, capsys, monkeypatch, policy, msg):
    files = {"missing": tmp_path / "missing.json", "notjson": tmp_path / "x.json",
             "nocost": doctored(tmp_path, lambda d: d.update(cost=None), "nocost.json")}
    files["notjson"].write_text("{cut")
    spelled = policy.format(**files)
    no_model_load(monkeypatch, "workbench.run_command")
    assert wb_main(["run", "--prompt", "x", "--policy", spelled]) == 2
    assert msg in one_line(capsys.readouterr().err)
    no_model_load(monkeypatch, "workbench.bench.bench_command")
    assert wb_main(["bench", "--policies", f"ar,{spelled}", "--quiet"]) == 2
    assert msg in one_line(capsys.readouterr().err)


def test_pays_off_reads_a_named_calibration_before_any_model_loads(tmp_path):
    from workbench.payoff.inputs import PaysOffInputError, check_inputs

    nocost = doctored(tmp_path, lambda d: d.update(cost=None), "nocost.json")
    with pytest.raises(PaysOffInputError, match=f"calibration {nocost} holds no cost table"):
        check_inputs(policies=f"ar,costtree(16, calibration={nocost})")  # the checks that need no model


def test_a_calibration_copied_alone_is_told_to_copy_its_head(tmp_path):
    shutil.copy(SHIPPED["dense"], tmp_path / "calibration.json")
    cal = load(str(tmp_path / "calibration.json"))
    with pytest.raises(CalibrationError, match=f"copy the head the calibration was made with to "
                                               f"{tmp_path / 'pair_head.npz'} \\(the shipped .*pair_head.npz is that head\\)"):
        cal.head()
    with pytest.raises(CalibrationError, match="copy the head"):
        PairTree(8, calibration=str(tmp_path / "calibration.json")).calibration_data()


def test_bench_refuses_a_wrong_pair_calibration_before_any_policy_decodes(engine, capsys, monkeypatch):
    monkeypatch.setattr("workbench.bench.bench_command.load_engine", lambda _args: engine)

    def decode(*_a, **_k):
        raise AssertionError("a policy decoded before every policy was bound to the pair")
    monkeypatch.setattr("workbench.bench.policy_bench.timed_runs", decode)
    assert wb_main(["bench", "--policies", "dflash,pathtree(8, calibration=hybrid)", "--limit", "1",
                    "--quiet"]) == 2
    assert "was made on another pair" in one_line(capsys.readouterr().err)
    assert CostTree(8, calibration="dense") and PathTree(8, calibration="dense")  # the shipped files still read
