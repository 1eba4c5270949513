"""Every recorded setting asserted by value: seed, policy, temperature, top_p, top_k, record_topk and the prompt
format, in the trace's header and per cycle (where they can change), through ``save``/``load``, the wire format
(objects and a live server) and the HTML report's settings table.

Values, not words: a header that dropped the seed, or a cycle that recorded the session's first temperature
after it changed, fails here.
"""
from __future__ import annotations

import html.parser
import json

import pytest
import torch

import workbench as wb
from workbench.serve import wire

CHAT = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py: tiny models on one thread


@pytest.fixture(scope="module")
def eng(tmp_path_factory):
    """A tiny pair whose tokenizer has a chat template (so all three prompt formats can be recorded)."""
    from transformers import AutoTokenizer

    from tiny_models import make_pair

    t, d = make_pair(tmp_path_factory.mktemp("settings"), vocab=40, hidden=32, layers=3, layer_ids=(0, 2),
                     block_size=6, seed=5, eos=False)
    tok = AutoTokenizer.from_pretrained(t)
    tok.chat_template = CHAT
    tok.save_pretrained(t)
    return wb.load(target=t, draft=d)


START = dict(policy=wb.DDTree(5, width=2), temperature=0.7, top_p=0.85, top_k=9, seed=123, record_topk=3)
LATER = dict(policy=wb.DFlash(), temperature=0.3, top_p=0.95, top_k=0)
PROMPTS = {"text": dict(prompt="t1 t2 t3"), "ids": dict(prompt_ids=[3, 1, 4, 1, 5]),
           "chat": dict(messages=[{"role": "user", "content": "t9 t8"}])}


def changed_session(eng, fmt: str):
    """Two cycles with START's settings, then LATER's for two more."""
    s = eng.session(**PROMPTS[fmt], max_new_tokens=40, **START)
    s.step(), s.step()
    for k, v in LATER.items():
        setattr(s, k, v)
    s.step(), s.step()
    return s


@pytest.fixture(scope="module")
def sessions(eng):
    return {fmt: changed_session(eng, fmt) for fmt in PROMPTS}


def assert_header(meta: dict, fmt: str, prompt_ids: list[int], changed: bool = True) -> None:
    assert meta["seed"] == 123
    assert meta["prompt_format"] == fmt
    assert meta["prompt_ids"] == prompt_ids
    if changed:  # a setting that changed becomes the list of the values it took, in order
        assert meta["policy"] == ["DDTree(5, width=2)", "DFlash"]
        assert meta["temperature"] == [0.7, 0.3]
        assert meta["top_p"] == [0.85, 0.95]
        assert meta["top_k"] == [9, 0]
    else:
        assert (meta["policy"], meta["temperature"], meta["top_p"], meta["top_k"]) == ("DDTree(5, width=2)", 0.7,
                                                                                     0.85, 9)


def assert_cycles(cycles, block_size: int) -> None:
    assert len(cycles) == 4
    for i, c in enumerate(cycles):
        want = START if i < 2 else LATER
        assert c.policy == str(want["policy"])
        assert (c.temperature, c.top_p, c.top_k) == (want["temperature"], want["top_p"], want["top_k"])
        assert c.setting == wb.records.cycle.setting_label(str(want["policy"]), want["temperature"], want["top_p"],
                                                           want["top_k"])
        assert tuple(c.draft_topk_tokens.shape) == (block_size - 1, 3)  # record_topk = 3 tokens per slot
        assert tuple(c.draft_topk_logprobs.shape) == (block_size - 1, 3)


def expected_ids(eng, fmt: str) -> list[int]:
    if fmt == "ids":
        return PROMPTS["ids"]["prompt_ids"]
    if fmt == "text":
        return eng.tokenizer("t1 t2 t3", add_special_tokens=False)["input_ids"]
    text = eng.tokenizer.apply_chat_template(PROMPTS["chat"]["messages"], tokenize=False, add_generation_prompt=True)
    return eng.tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("fmt", list(PROMPTS))
def test_settings_in_the_header_and_every_cycle(eng, sessions, fmt):
    s = sessions[fmt]
    ids = expected_ids(eng, fmt)
    assert s.prompt_ids == ids
    assert_header(s.trace.meta, fmt, ids)
    assert_cycles(s.cycles, eng.models.block_size)
    assert s.trace.policy == "DDTree(5, width=2) T=0.7 top_p=0.85 top_k=9 + DFlash T=0.3 top_p=0.95"
    by = s.trace.summary().by_policy
    assert list(by) == ["DDTree(5, width=2) T=0.7 top_p=0.85 top_k=9", "DFlash T=0.3 top_p=0.95"]
    assert [f.cycles for f in by.values()] == [2, 2]
    if fmt == "chat":
        assert s.trace.meta["messages"] == PROMPTS["chat"]["messages"]


def test_a_session_that_never_changes_keeps_single_values(eng):
    s = eng.session("t4 t4", max_new_tokens=20, **START)
    s.step(), s.step()
    assert_header(s.trace.meta, "text", s.prompt_ids, changed=False)
    assert [c.policy for c in s.cycles] == ["DDTree(5, width=2)"] * 2
    assert all((c.temperature, c.top_p, c.top_k) == (0.7, 0.85, 9) for c in s.cycles)


def test_default_settings_are_recorded_by_value(eng):
    s = eng.session("t4 t4", max_new_tokens=8, policy=wb.DDTree(4))
    c = s.step()
    m = s.trace.meta
    assert (m["seed"], m["temperature"], m["top_p"], m["top_k"], m["policy"]) == (0, 0.0, 1.0, 0, "DDTree(4)")
    assert (c.temperature, c.top_p, c.top_k) == (0.0, 1.0, 0) and c.draft_topk_tokens.shape[1] == 8


@pytest.mark.parametrize("fmt", list(PROMPTS))
def test_settings_survive_save_and_load(eng, sessions, fmt, tmp_path):
    s = sessions[fmt]
    p = s.trace.save(tmp_path / f"{fmt}.trace.jsonl")
    head = json.loads(p.read_text().splitlines()[0])
    assert_header(head["meta"], fmt, s.prompt_ids)  # the file itself, not only what load makes of it
    back = wb.Trace.load(p)
    assert_header(back.meta, fmt, s.prompt_ids)
    assert_cycles(back.cycles, eng.models.block_size)
    assert back.policy == s.trace.policy


@pytest.mark.parametrize("fmt", list(PROMPTS))
def test_settings_survive_the_wire_objects(eng, sessions, fmt):
    s = sessions[fmt]
    head = wire.loads(wire.dumps(wire.trace_head_to_wire(s.trace)))
    cycles = [wire.cycle_from_wire(wire.loads(wire.dumps(wire.cycle_to_wire(c)))) for c in s.cycles]
    t = wire.trace_from_wire(head, cycles)
    assert_header(t.meta, fmt, s.prompt_ids)
    assert_cycles(t.cycles, eng.models.block_size)


class Cells(html.parser.HTMLParser):
    """The report's tables as lists of rows of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables, self._cell = [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self.tables and self.tables[-1]:
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def settings_rows(page: str) -> dict:
    """{column label: [cell per run]} of the settings table."""
    from workbench.views.report import settings_table  # noqa: F401 - the table this parses

    p = Cells()
    p.feed(page)
    table = next(t for t in p.tables if t and t[0] and t[0][0] == "run" and "seed" in t[0])
    head, rows = table[0], table[1:]
    return {label: [r[i] for r in rows] for i, label in enumerate(head)}


def test_settings_in_the_report(eng, sessions, tmp_path):
    from workbench.views.report import report_html, settings_table

    plain = eng.session("t4 t4", max_new_tokens=10, **START)
    plain.step()
    runs = {"changed": sessions["text"].trace, "plain": plain.trace}
    cols = settings_rows(settings_table(runs))
    assert cols["run"] == ["changed", "plain"]
    assert cols["seed"] == ["123", "123"]
    assert cols["temperature"] == ["0.7 → 0.3", "0.7"]
    assert cols["top-p"] == ["0.85 → 0.95", "0.85"]
    assert cols["top-k"] == ["9 → 0", "9"]
    # The whole page, from saved files: the run names carry the policy, the settings table the values.
    paths = [sessions["text"].trace.save(tmp_path / "a.trace.jsonl"), plain.trace.save(tmp_path / "b.trace.jsonl")]
    page = report_html(paths, tokenizer=eng.tokenizer)
    cols = settings_rows(page)
    assert cols["seed"] == ["123", "123"] and cols["temperature"] == ["0.7 → 0.3", "0.7"]
    assert cols["run"] == [f"{sessions['text'].trace.policy} (a.trace.jsonl)",
                           "DDTree(5, width=2) T=0.7 top_p=0.85 top_k=9 (b.trace.jsonl)"]


# ------------------------------------------------------------------------------------------ a live server
@pytest.fixture(scope="module")
def server(eng):
    from workbench.serve import EngineServer, Limits

    srv = EngineServer(eng, port=0, limits=Limits(max_sessions=4, max_new_tokens=64, max_budget=48)).start()
    yield srv
    srv.stop()


def test_settings_through_a_served_session(eng, server):
    remote = wb.connect(server.url, token=server.token)
    kw = dict(START)
    rs = remote.session("t1 t2 t3", max_new_tokens=40, **kw)
    local = eng.session("t1 t2 t3", max_new_tokens=40, **kw)
    assert (rs.seed, rs.record_topk, rs.policy, rs.temperature) == (123, 3, wb.DDTree(5, width=2), 0.7)
    assert (rs.sampling.top_p, rs.sampling.top_k) == (0.85, 9)
    for s in (rs, local):
        s.step(), s.step()
        s.policy = LATER["policy"]
        s.temperature = LATER["temperature"]
    for s in (rs, local):
        s.step()
    meta = rs.trace.meta
    assert meta["seed"] == 123 and meta["prompt_format"] == "text" and meta["prompt_ids"] == local.prompt_ids
    assert meta["policy"] == ["DDTree(5, width=2)", "DFlash"] and meta["temperature"] == [0.7, 0.3]
    assert meta["top_p"] == 0.85 and meta["top_k"] == 9  # never changed: one value
    assert [(c.policy, c.temperature, c.top_p, c.top_k) for c in rs.cycles] == [
        ("DDTree(5, width=2)", 0.7, 0.85, 9)] * 2 + [("DFlash", 0.3, 0.85, 9)]
    assert all(c.draft_topk_tokens.shape[1] == 3 for c in rs.cycles)
    assert [c.target_choice.tolist() for c in rs.cycles] == [c.target_choice.tolist() for c in local.cycles]
    # The reply's own fields, by hand.
    again = remote.session_by_id(rs.id)
    assert (again.seed, again.record_topk, again.temperature) == (123, 3, 0.3)
    assert (again.sampling.top_p, again.sampling.top_k) == (0.85, 9)
    assert again.policy == wb.DFlash()
    rs.close()
