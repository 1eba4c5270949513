"""bench-serve's own checks, before any server starts, and its table's policy by name."""
from __future__ import annotations

import time

import pytest

from workbench.__main__ import main


def test_more_new_tokens_than_its_servers_allow_is_refused_before_they_start(capsys):
    t = time.perf_counter()
    assert main(["bench-serve", "--max-new-tokens", "5000", "--clients", "1"]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - t < 5  # no server was started (each loads the pair)
    assert "--max-new-tokens 5000: bench-serve's servers allow 1024 new tokens per session" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_one_new_token_is_refused_before_any_server_starts(capsys):
    assert main(["bench-serve", "--max-new-tokens", "1", "--clients", "1"]) == 2
    err = capsys.readouterr().err
    assert "--max-new-tokens 1: a session's first token comes from its prefill" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("modes,why", [("run,warp", "'warp' is none of them"), ("run,run", "at most once")])
def test_an_unknown_or_repeated_mode_is_refused_in_one_line(capsys, modes, why):
    assert main(["bench-serve", "--modes", modes, "--clients", "1"]) == 2
    err = capsys.readouterr().err
    assert f"--modes {modes!r}: give each of inproc, run, step, serial, unbatched at most once" in err and why in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_table_names_the_policy():
    from workbench.bench.serve_load import table
    from workbench.engine.policies import parse_policy
    from workbench.serve import wire

    row = {"tok_s": 10.0, "p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0}
    res = {"policy": wire.policy_to_wire(parse_policy("ddtree:16")), "max_new_tokens": 48, "repeats": 1,
           "modes": ["inproc", "run"], "rows": [{"clients": 1, "inproc": row, "run": row}]}
    head = table(res).splitlines()[0]
    assert head.startswith(f"served engine under load: {parse_policy('ddtree:16')}, 48 new tokens") and "{" not in head


def test_by_default_each_side_leaves_one_core_to_the_clients_and_says_how_many_threads_it_ran():
    from workbench.bench.serve_command import spare_core_threads
    from workbench.bench.serve_load import table
    from workbench.engine.policies import parse_policy
    from workbench.serve import wire

    assert [spare_core_threads(n) for n in (1, 2, 4, 9, 64)] == [1, 1, 3, 8, 8]  # >8 cores: the engine's own default
    row = {"tok_s": 10.0, "p50_ms": 1.0, "p90_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0}
    res = {"policy": wire.policy_to_wire(parse_policy("ddtree:16")), "max_new_tokens": 48, "repeats": 1,
           "modes": ["inproc"], "rows": [{"clients": 1, "inproc": row}], "threads": 3}
    assert "1 repeat(s), 3 CPU thread(s) each side, modes interleaved" in table(res).splitlines()[0]


def test_the_measuring_process_keeps_what_it_loaded_out_of_the_collector(monkeypatch, capsys):
    """The clients and the in-process engine share bench-serve's process: what it loaded is frozen while it
    measures (a full collection of ~0.4 M objects stops every client for 0.13 s), and thawed after."""
    import gc

    import workbench.bench.serve_command as cmd
    import workbench.bench.serve_load as load

    seen = {}

    def fake_bench(model_args, load_local, *a, **kw):
        seen["before_load"] = gc.get_freeze_count()
        monkeypatch.setattr(cmd, "load_engine", lambda args: object())
        load_local()
        seen["after_load"] = gc.get_freeze_count()
        return {"rows": [], "policy": {"name": "ar"}, "max_new_tokens": 8, "repeats": 1, "modes": ["inproc"]}

    monkeypatch.setattr(load, "measure_served_load", fake_bench)
    gc.unfreeze()
    assert main(["bench-serve", "--clients", "1", "--modes", "inproc", "--max-new-tokens", "8"]) == 0
    assert seen["before_load"] > 0 and seen["after_load"] >= seen["before_load"]
    assert gc.get_freeze_count() == 0
