"""How much work beside the engine slows its batched cycle: Python in another thread of the same process, or
another process on the machine's cores.

The served engine runs its cycles in one thread (the scheduler's worker) while its event loop encodes and sends
every stream's frames in another; on a tiny CPU pair the cycle is mostly Python, so the two share the
interpreter lock (``--neighbour thread``). And the clients of ``bench-serve`` run on the same machine: with
every core in torch's team of OpenMP threads, a process busy on one of them stalls the whole team
(``--neighbour process --threads 2``). This measures an in-process batch-8 DDTree(16) cycle alone and beside a
neighbour busy for ``busy`` ms every ``every`` ms (docs/figures.md, "The served engine under load"):

    .venv/bin/python tools/gil_probe.py [--busy 0.3,1] [--every 5] [--repeats 3] [--neighbour thread|process]
                                        [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import threading
import time

# the other process: busy for argv[1] s, asleep for argv[2] s, until killed
BUSY = ("import sys, time\nbusy, idle = float(sys.argv[1]), float(sys.argv[2])\nwhile True:\n"
        "    t = time.perf_counter()\n    while time.perf_counter() - t < busy:\n        pass\n    time.sleep(idle)\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", default="0.3,1", help="comma-separated ms the other thread holds the interpreter")
    ap.add_argument("--every", type=float, default=5.0, help="ms it sleeps between (default 5)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--neighbour", choices=["thread", "process"], default="thread",
                    help="a thread of this process (it holds the interpreter lock) or another process (default thread)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads of the engine (default 1)")
    args = ap.parse_args(argv)
    busy = [float(x) for x in args.busy.split(",")]
    if any(b <= 0 for b in busy) or args.every <= 0 or args.repeats < 1 or args.threads < 1:
        ap.error("--busy values and --every must be > 0, --repeats and --threads >= 1")

    import workbench as wb
    from workbench.shipped import eval_prompts

    engine = wb.load(threads=args.threads)
    prompts = [p["prompt"] for p in eval_prompts("long")][:8]

    def cycle_ms() -> float:
        b = engine.batch_session(prompts, policy=wb.DDTree(16), max_new_tokens=64)
        t, n = time.perf_counter(), 0
        while not b.finished:
            b.step()
            n += 1
        return (time.perf_counter() - t) / n * 1e3

    def median(runs) -> str:
        return f"{statistics.median(runs):.1f} ms per cycle [{min(runs):.1f}-{max(runs):.1f}]"

    cycle_ms()  # warm-up
    print("alone:", median([cycle_ms() for _ in range(args.repeats)]))
    for b in busy:
        stop = threading.Event()

        def hold(ms=b):
            while not stop.is_set():
                t = time.perf_counter()
                while time.perf_counter() - t < ms / 1e3:
                    pass
                time.sleep(args.every / 1e3)

        if args.neighbour == "thread":
            th = threading.Thread(target=hold, daemon=True)
            th.start()
        else:
            th = subprocess.Popen([sys.executable, "-c", BUSY, str(b / 1e3), str(args.every / 1e3)])
        print(f"beside a {args.neighbour} busy {b} ms every {args.every} ms:",
              median([cycle_ms() for _ in range(args.repeats)]))
        if args.neighbour == "thread":
            stop.set()
            th.join()
        else:
            th.kill()
            th.wait()
    print("alone:", median([cycle_ms() for _ in range(args.repeats)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
