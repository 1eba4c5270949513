"""The command line: ``python -m workbench COMMAND``. This module only builds the parser from the command
modules and dispatches; each command lives in its room as a module with ``add_parser(sub)`` and
``run(args, out, err) -> int`` (``COMMANDS``).

Results go to stdout, progress and errors to stderr. Bad input (an unknown policy, a malformed prompts file,
CUDA or SGLang kernels that are not there, ...) is one line on stderr and exit code 2, written here once for
every command (``main``); a failed check (the lossless check, a broken contract) is exit code 1.
"""
from __future__ import annotations

import argparse
import os
import sys

from workbench.cli_args.values import UsageError

EXIT_USAGE = 2  # bad input


def command_modules() -> dict:
    """name -> the module holding the command's ``add_parser`` and ``run``, in the order ``--help`` lists them.
    Each module keeps its heavy imports inside ``run``: building the parser loads no model stack."""
    from workbench import report_command, run_command
    from workbench.bench import bench_command, kernels_command, serve_command as bench_serve_command
    from workbench.bench import acceptance_command, sweep_command
    from workbench.calibrate import command as calibrate_command
    from workbench.conform import command as conform_command
    from workbench.payoff import command as pays_off_command
    from workbench.serve import command as serve_command

    return {"run": run_command, "bench": bench_command, "report": report_command, "kernels": kernels_command,
            "serve": serve_command, "bench-serve": bench_serve_command, "pays-off": pays_off_command,
            "sweep": sweep_command, "conform": conform_command, "acceptance": acceptance_command,
            "calibrate": calibrate_command}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (no usage block) and exit code 2."""

    def error(self, message):  # noqa: D401
        raise UsageError(f"{message} (see: {self.prog} --help)")


def build_parser(commands: dict | None = None) -> argparse.ArgumentParser:
    from workbench.version import __version__

    commands = command_modules() if commands is None else commands
    parser = OneLineParser(prog="workbench", description="DFlash / DDTree speculative decoding workbench")
    parser.add_argument("--version", action="version", version=f"workbench {__version__}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="{" + ",".join(commands) + "}", parser_class=OneLineParser)
    sub.required = True
    for module in commands.values():
        module.add_parser(sub)
    return parser


def main(argv=None) -> int:
    """Entry point; returns the exit code (0 ok, 1 a check failed, 2 bad input)."""
    out, err = sys.stdout, sys.stderr
    args = None
    try:
        commands = command_modules()
        args = build_parser(commands).parse_args(argv)
        return commands[args.command].run(args, out, err)
    except SystemExit as e:  # --help
        return e.code if isinstance(e.code, int) else 0
    except KeyboardInterrupt:
        print("workbench: interrupted", file=err)
        return 130
    except ImportError as e:  # an optional extra (or dflash) not installed: the pip command, in one line
        from workbench.extras import missing_package

        if os.environ.get("WORKBENCH_DEBUG") or (e.name or "").split(".")[0] in ("workbench", "ddtree_kernels"):
            raise  # our own module missing is a bug: its traceback
        command = f"`workbench {args.command}`" if args is not None else "`workbench`"
        print(f"workbench: error: {missing_package(e, command)}", file=err)
        return EXIT_USAGE
    except (UsageError, ValueError, RuntimeError, OSError) as e:
        if os.environ.get("WORKBENCH_DEBUG"):  # the full traceback, for bug reports
            raise
        msg = " ".join(str(e).split()) or type(e).__name__
        print(f"workbench: error: {msg}", file=err)
        return EXIT_USAGE
