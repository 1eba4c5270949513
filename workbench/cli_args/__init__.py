"""What every command module shares: the command line's value parsers and ``UsageError`` (``values``), and the
options of every command that runs an engine, with the engine they load (``engine_options``).

``workbench/cli.py`` builds the parser and dispatches; it imports every command, so it sits on the top floor.
This room sits just above the engine, under every room that holds a command (``conform``, ``serve``, ``bench``,
``payoff``, ``calibrate``, and ``workbench.report_command`` above the views), so a command's module imports it
instead of reaching up to ``workbench.cli``.
"""
