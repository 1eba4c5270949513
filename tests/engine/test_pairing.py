"""Pairing follows the checkpoint: a target given without draft= gets the drafter laid out beside it
(``<dir>/target`` -> ``<dir>/draft``, as the embedded pairs are) or is refused."""
from __future__ import annotations

import shutil

import pytest

import workbench as wb
from workbench.engine.loading import ASSETS, pair_dirs


def test_a_target_without_a_drafter_gets_its_own():
    for t, d in ((ASSETS / "hybrid" / "target", ASSETS / "hybrid" / "draft"), (ASSETS / "target", ASSETS / "draft")):
        assert pair_dirs(t, None) == (t, d)
        assert pair_dirs(str(t), None) == (t, d)
    assert pair_dirs(None, None) == (ASSETS / "target", ASSETS / "draft")
    assert pair_dirs("hybrid", None) == (ASSETS / "hybrid" / "target", ASSETS / "hybrid" / "draft")


def test_a_target_with_no_drafter_beside_it_is_refused(tmp_path):
    lone = tmp_path / "my-model"
    lone.mkdir()
    shutil.copy(ASSETS / "target" / "config.json", lone / "config.json")
    with pytest.raises(wb.ModelPairError, match=r"target '.*my-model' has no drafter beside it .*pass draft="):
        wb.load(target=lone)
    (tmp_path / "target").mkdir()  # a target/ folder with no draft/ beside it: the same
    shutil.copy(ASSETS / "target" / "config.json", tmp_path / "target" / "config.json")
    with pytest.raises(wb.ModelPairError, match="has no drafter beside it"):
        wb.load(target=tmp_path / "target")
