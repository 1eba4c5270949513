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
    assert f"--modes {modes!r}: give each of inproc, run, step, serial, whole, unbatched at most once" in err \
        and why in err
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


def test_more_clients_than_a_served_engine_holds_are_refused_before_any_server_starts(capsys):
    t = time.perf_counter()
    assert main(["bench-serve", "--clients", "1,100000"]) == 2
    err = capsys.readouterr().err
    assert time.perf_counter() - t < 5
    assert "--clients '1,100000': at most 16 clients, a session each" in err and "from 1 to 16" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_negative_overhead_and_a_single_repeat_are_flagged():
    from workbench.bench.serve_load import table
    from workbench.engine.policies import parse_policy
    from workbench.serve import wire

    def res(repeats, added):
        row = {"tok_s": 10.0, "p50_ms": 20.0, "p90_ms": 2.0, "p99_ms": 3.0, "max_ms": 4.0, "mean_step_ms": 20.0,
               "parts_ms": dict.fromkeys(("wait", "cycle", "record", "encode", "http", "wire", "decode"), 1.0)}
        return {"policy": wire.policy_to_wire(parse_policy("ddtree:16")), "max_new_tokens": 48, "repeats": repeats,
                "modes": ["inproc", "run"], "rows": [{"clients": 1, "inproc": row,
                                                      "run": {**row, "p50_added_ms": added}}]}

    one = table(res(1, [-17.0])).splitlines()
    assert one[-2].endswith("1 client(s) run: -17.00 ms")
    assert one[-1].strip().startswith("below 0 is noise between rounds, not a saving") and "--repeats 3" in one[-1]
    assert "one repeat: no range" in table(res(1, [0.4]))
    three = table(res(3, [0.4, -0.2, 1.1])).splitlines()
    assert three[-1].endswith("1 client(s) run: +0.40 ms [-0.20 to +1.10]") and "median [range]" in three[-1]


def test_bench_serve_stopped_by_sigterm_stops_its_servers(monkeypatch, capsys):
    """SIGTERM (a timeout wrapper) ends bench-serve through its way out, which stops the servers it started;
    its handler is put back after."""
    import os
    import signal

    import workbench.bench.serve_load as load

    stopped = []

    class FakeServer:
        def __init__(self, *a):
            self.url, self.token = "http://127.0.0.1:9", "t" * 43

        def close(self):
            stopped.append(self)

    def load_local():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # (the signal's handler raises here)
        raise AssertionError("SIGTERM did not stop bench-serve")

    monkeypatch.setattr(load, "Server", FakeServer)
    monkeypatch.setattr("workbench.bench.serve_command.load_engine", lambda args: load_local())
    before = signal.getsignal(signal.SIGTERM)
    assert main(["bench-serve", "--clients", "1", "--modes", "inproc,run", "--max-new-tokens", "8"]) == 130
    assert len(stopped) == 1 and signal.getsignal(signal.SIGTERM) is before


def test_a_served_child_stops_once_its_parent_is_gone_and_no_token_file_is_written():
    """The server bench-serve starts watches its stdin, whose write end only bench-serve holds: closed (bench-serve
    exited or was killed, SIGKILL included), the server stops (SIGTERM). Its token comes on its stdout."""
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from workbench.bench import served_child

    path = Path(served_child.__file__)
    code = (f"import importlib.util as u; s = u.spec_from_file_location('c', {str(path)!r}); m = u.module_from_spec(s); "
            "s.loader.exec_module(m); import sys, time; m.watch_parent(sys.stdin.fileno()); print('up', flush=True); "
            "time.sleep(30)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "up\n"
    proc.stdin.close()  # as when the parent dies: the system closes its end
    assert proc.wait(10) == -signal.SIGTERM
    cmd = served_child.child_command(["--target", "T"], True, 8, 2)
    assert "--token-file" not in cmd and cmd[1:3] == ["-m", "workbench.bench.served_child"]
    out = ["workbench serve: Engine(...)\n", "workbench serve: listening on http://127.0.0.1:4242\n",
           "workbench serve: token (generated): abc-DEF_123\n", "never read\n"]
    assert served_child.read_start(iter(out)) == ("http://127.0.0.1:4242", "abc-DEF_123")
    assert served_child.read_start(iter(out[:2])) == ("http://127.0.0.1:4242", None)
