"""How much Python work in another thread of the same process slows the engine's batched cycle.

The served engine runs its cycles in one thread (the scheduler's worker) while its event loop encodes and sends
every stream's frames in another; on a tiny CPU pair the cycle is mostly Python, so the two share the
interpreter lock. This measures an in-process batch-8 DDTree(16) cycle alone and beside a thread that holds the
interpreter for ``busy`` ms every ``every`` ms (docs/figures.md, "The served engine under load"):

    .venv/bin/python tools/gil_probe.py [--busy 0.3,1] [--every 5] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import threading
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--busy", default="0.3,1", help="comma-separated ms the other thread holds the interpreter")
    ap.add_argument("--every", type=float, default=5.0, help="ms it sleeps between (default 5)")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    busy = [float(x) for x in args.busy.split(",")]
    if any(b <= 0 for b in busy) or args.every <= 0 or args.repeats < 1:
        ap.error("--busy values and --every must be > 0, --repeats >= 1")

    import workbench as wb
    from workbench.shipped import eval_prompts

    engine = wb.load(threads=1)
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

        th = threading.Thread(target=hold, daemon=True)
        th.start()
        print(f"beside a thread busy {b} ms every {args.every} ms:", median([cycle_ms() for _ in range(args.repeats)]))
        stop.set()
        th.join()
    print("alone:", median([cycle_ms() for _ in range(args.repeats)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
