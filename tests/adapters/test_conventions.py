"""The engine-convention table: the feature each engine's capture rule hands the drafter, computed on a
real forward, equals ours for inner layers and differs (vLLM) or is missing (SGLang) at the last layer."""
from __future__ import annotations

import pytest

import workbench as wb
from workbench.adapters.conventions import conventions_report, conventions_table, rule_in_source

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("ids, last", [((0, 1), False), ((0, 2), True)])
def test_capture_rules_agree_on_inner_layers_and_part_at_the_last(tmp_path, ids, last):
    from tiny_models import make_pair

    t, d = make_pair(tmp_path, vocab=40, hidden=32, layers=3, layer_ids=ids, block_size=6, seed=2)
    with pytest.warns(UserWarning) if last else _nothing():
        e = wb.load(target=t, draft=d)
    rep = conventions_report(e.models, e.encode("t1 t2 t3 t4 t5").ids)
    rows = {r["layer"]: r for r in rep["rows"]}
    assert sorted(rows) == list(ids)
    for k, r in rows.items():
        inner = k < 2
        assert r["vllm"]["same"] is inner and r["vllm"]["captured"]
        assert r["sglang"]["captured"] is inner and r["sglang"]["same"] is inner
        if not inner:  # the final norm: a real difference, not rounding
            assert r["vllm"]["rel_diff"] > 1e-2
    text = conventions_table(rep)
    assert ("DIFFERS" in text and "not captured" in text) is last and text.count("same") >= 2 * len(ids) - 2 * last


def test_the_rules_are_read_from_the_installed_engines():
    assert rule_in_source("vllm") == "found" and rule_in_source("sglang") == "found"


class _nothing:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("error", UserWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


@pytest.mark.parametrize("pair", ["", "hybrid"])
def test_the_shipped_drafters_read_no_last_layer_and_every_engine_hands_them_our_features(pair):
    import json

    from workbench.engine.loading import ASSETS

    rep = json.loads((ASSETS / pair / "training_report.json").read_text())
    n = rep["recipe"]["layers"]
    ids = rep["recipe"]["target_layer_ids"]
    cfg = json.loads((ASSETS / pair / "draft" / "config.json").read_text())
    assert cfg["dflash_config"]["target_layer_ids"] == ids and n - 1 not in ids
    rows = rep["engine_conventions"]["rows"]  # written by the training's report (workbench.train)
    assert [r["layer"] for r in rows] == ids
    assert all(r[e]["captured"] and r[e]["same"] for r in rows for e in ("vllm", "sglang"))
    # The replaced drafters' figures, kept for comparison, newest first (dense: layers 1-4 on half the
    # distillation data, then 1, 3, 5; hybrid: 1, 3, 5).
    history = rep["previous_drafters"]
    assert history[-1]["target_layer_ids"] == [1, 3, 5] and all(set(d["splits"]) == {"long", "short"} for d in history)
