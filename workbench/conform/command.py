"""``python -m workbench conform DUMP``: a cycle dump checked contract by contract against the reference
(``workbench.conform.check``). Exit 0 when no contract broke, 1 when one did, 2 with one line on stderr when the
dump cannot be judged, before any model loads where the file alone shows it. It replays with the reference's
own models, so it takes no ``--engine``."""
from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("conform", help="check a cycle dump contract by contract against the reference")
    p.add_argument("dump", help="a cycle dump (docs/dump-format.md)")
    p.add_argument("--target", metavar="DIR", help="target model directory (default: the one the dump names)")
    p.add_argument("--draft", metavar="DIR", help="DFlash drafter directory (default: the one the dump names)")
    p.add_argument("--device", default="cpu", help="where the reference runs: cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--cycles", metavar="A:B", help="check engine steps A to B-1 only (A: or :B leave an end open); "
                   "the records before them are still read for each request's context")
    p.add_argument("--requests", metavar="ID,...", help="check these requests' cycles only (ids as the dump names "
                   "them)")


def run(args, out, err) -> int:
    """``python -m workbench conform DUMP``: exit 0 when no contract broke, 1 when one did, 2 on bad input (one
    line on stderr: a dump the checker cannot judge, another pair's, a check that judged nothing, --device tpu)."""
    import json

    from workbench.conform.check import ConformInputError, conform
    from workbench.conform.dump import DumpFileError
    from workbench.conform.selection import parse_request_list

    try:
        report = conform(args.dump, args.target, args.draft, device=args.device,
                         progress=None if args.quiet else lambda m: print(f"conform: {m}", file=err, flush=True),
                         cycles=args.cycles, requests=parse_request_list(args.requests))
    except DumpFileError as e:
        raise ConformInputError(str(e)) from None
    print(json.dumps(report.to_dict()) if args.json else str(report), file=out)
    return 0 if report.ok else 1
