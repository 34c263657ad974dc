"""``hermetic``: parse the command line, run one command from the table, map every error to its exit code
in one place (PRODUCT.md's table)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from hermetic.cli.commands import COMMANDS
from hermetic.cli.parser import UsageError, build_parser
from hermetic.errors import HermeticError, path_error
from hermetic.reporter import Reporter, use_color
from hermetic.root import Root


def _terminate(signum: int, _frame: object) -> None:
    # SIGTERM's default kills Python without running `finally`: raise instead, so builds stop cleanly
    raise KeyboardInterrupt(f"signal {signum}")


def _internal(command: str, reporter: Reporter, e: Exception) -> int:
    """An internal bug: say so plainly, keep the traceback for the report (called inside ``except``)."""
    print(f"internal error: {type(e).__name__}: {e}\n(this is a bug in hermetic; the traceback "
          f"follows for the report)", file=sys.stderr)
    import traceback  # only for bugs: its import costs every command a few ms
    traceback.print_exc()
    reporter.result(command, False, 1, error={"kind": "internal", "what": str(e)})
    return 1


def _where_hint(e: OSError, root: Root | None) -> str | None:
    """What else to say about a path hermetic could not use: the scratch root's and who named it."""
    if root is None or e.filename is None:
        return None
    path = os.path.abspath(os.fsdecode(e.filename))
    top = str(root.path)
    if path == top or path.startswith(top + os.sep) or top.startswith(path + os.sep):
        return f"the scratch root is {top} (from {root.named_by}); --root or HERMETIC_ROOT chooses another"
    return None


def _usage(e: UsageError, argv: list[str]) -> int:
    """A command line the grammar refused: argparse's usage and message on stderr, and with --json one result
    record on stdout (exit 2, as argparse's own)."""
    sys.stderr.write(e.usage)
    print(f"hermetic: error: {e.message}", file=sys.stderr)
    if "--json" in argv:
        command = next((a for a in argv if a in COMMANDS or a == "status"), "")
        Reporter(json_mode=True).result("show" if command == "status" else command, False, 2,
                                        error={"kind": "usage", "what": e.message, "where": "the command line",
                                               "hint": e.usage.strip()})
    return 2


def _debug_children(reporter: Reporter) -> None:
    """-vv: each child's command line, exit status and time, as it ends."""
    from hermetic import procs

    def said(argv: Sequence[str], seconds: float, rc: int | None) -> None:
        import shlex
        reporter.debug("child", f"{shlex.join(argv)}: exit {rc}, {seconds:.2f} s", argv=list(argv), rc=rc,
                       seconds=round(seconds, 3))
    procs.WATCHERS.append(said)


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `hermetic env RECIPE -- CMD ...`: everything after the first `--` belongs to the command
    cmd: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, cmd = argv[:cut], argv[cut + 1:]
    try:
        args = parser.parse_args(argv)
        quiet, verbose = int(getattr(args, "quiet", 0)), int(getattr(args, "verbose", 0))
        if quiet and verbose:
            parser.error("-q/--quiet and -v/--verbose exclude each other")
    except UsageError as e:
        return _usage(e, argv)
    args.cmd = cmd
    json_mode = bool(getattr(args, "json", False))
    args.offline = bool(getattr(args, "offline", False)) or os.environ.get("HERMETIC_OFFLINE", "") == "1"
    progress = not (getattr(args, "no_progress", False) or os.environ.get("HERMETIC_NO_PROGRESS", "") == "1")
    reporter = Reporter(json_mode=json_mode, quiet=quiet, verbose=verbose, progress=progress,
                        color=use_color(getattr(args, "color", "auto"), sys.stderr))
    if reporter.debugging:
        _debug_children(reporter)
    if not args.command:
        parser.print_help(sys.stderr)
        reporter.result("", False, 2, error={"kind": "usage", "what": "no command given", "where": "the command line",
                                             "hint": "hermetic --help lists the commands"})
        return 2
    command = "show" if args.command == "status" else args.command
    root: Root | None = None
    try:
        root = Root.locate(getattr(args, "root", None))
        try:
            return COMMANDS[command](root, args, reporter)
        finally:
            reporter.close()  # the live display stops before any error below is printed
    except HermeticError as e:
        print(reporter.error_text(e.render()), file=sys.stderr)
        reporter.result(command, False, e.exit_code, error=e.as_record())
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        reporter.result(command, False, 130, error={"kind": "interrupted"})
        return 130
    except BrokenPipeError:
        return 1
    except OSError as e:
        err = path_error(e, hint=_where_hint(e, root), place=str(root.path) if root is not None else None)
        if err is None:
            return _internal(command, reporter, e)
        print(reporter.error_text(err.render()), file=sys.stderr)
        reporter.result(command, False, err.exit_code, error=err.as_record())
        return err.exit_code
    except Exception as e:
        return _internal(command, reporter, e)
    finally:
        from hermetic.store import release_temproots
        release_temproots()
