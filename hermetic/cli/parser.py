"""The command line's grammar: one subparser per command, the options every command shares."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from hermetic import __version__

DESCRIPTION = """\
hermetic: hermetic environments for PyTorch CUDA/C++ extension builds and GPU worker measurement.

Everything it writes goes under one scratch root (--root, else $HERMETIC_ROOT, else ./.hermetic), but for
`run`'s lock on its device, a file in the lock folder every user of the machine shares ($HERMETIC_LOCK_DIR,
else a GPU runner's gpu.lock_dir, else the first of /run/lock/hermetic, /var/lock/hermetic and
/tmp/hermetic-locks this user may create), and for what `run --record-digests` is asked to write in the
repository (the runner's reference digests).
Listings and other data go to stdout, progress and logs to stderr; with --json every record (events and
the closing result) is one JSON line on stdout.
Exit codes: 0 success, 1 the work failed, 2 bad input, 3 a precondition was not met, 4 `realize --check`:
work is needed.
Settings (remote cache, lock folder, sandbox, jobs, trusted keys) come from the command line, else the
environment, else the recipe or runner, else hermetic.toml (project, user, system): `hermetic config` says which.
Shell completion: hermetic completion bash|zsh (README, "Shell completion").
"""

# shtab's completers, spelled out so that building the parser never imports shtab (only `completion` does)
FILE = {"bash": "_shtab_compgen_files", "zsh": "_files", "tcsh": "f"}
DIRECTORY = {"bash": "_shtab_compgen_dirs", "zsh": "_files -/", "tcsh": "d"}


class UsageError(Exception):
    """A command line the grammar refuses (argparse's ``error``): ``main`` says it, as a JSON record with
    --json, and exits 2."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.message, self.usage = message, usage


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors ``main`` reports (argparse prints and exits by itself)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage())


def _completes(action: argparse.Action, how: dict[str, str]) -> None:
    """What shtab completes an argument with (a file, a folder)."""
    vars(action)["complete"] = how


# What --offline does, said for each command (every command takes it, as $HERMETIC_OFFLINE=1 reaches them all)
OFFLINE = {
    "": "fetch nothing: no index, no remote cache (default: $HERMETIC_OFFLINE=1); each command's --help says what "
        "it does then",
    "realize": "fetch nothing (no index, no remote cache): a realize that would have to fetch exits 3 naming each "
               "missing wheel by name==version with its lock file and line (default: $HERMETIC_OFFLINE=1)",
    "run": "realize what the runner needs without fetching (no index, no remote cache): exit 3 naming each "
           "missing wheel (default: $HERMETIC_OFFLINE=1)",
    "verify": "with --repair, realize the roots again without fetching: what would have to be fetched exits 3 "
              "(default: $HERMETIC_OFFLINE=1)",
}
NOTHING_TO_FETCH = "accepted, and changes nothing: {command} fetches nothing (default: $HERMETIC_OFFLINE=1)"


def _common(command: str = "") -> Parser:
    """The options every command takes, before or after its name (``hermetic -q show``, ``hermetic show -q``);
    ``command``: whose --offline help to give."""
    p = Parser(add_help=False)
    _completes(p.add_argument("--root", metavar="DIR", default=argparse.SUPPRESS,
                              help="scratch root (default: $HERMETIC_ROOT, else ./.hermetic)"), DIRECTORY)
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="every record (progress events and the closing result) as one JSON line on stdout")
    p.add_argument("-q", "--quiet", action="count", default=argparse.SUPPRESS,
                   help="only warnings, errors and what the command prints (listings, data); -qq: errors only")
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                   help="more detail: a line per object of a build, where each wheel is fetched from; -vv: debug "
                        "(each child's command line and time, each step's time)")
    p.add_argument("--color", choices=("auto", "always", "never"), default=argparse.SUPPRESS,
                   help="colour on stderr: auto (default) where stderr is a terminal and NO_COLOR is not set")
    p.add_argument("--no-color", dest="color", action="store_const", const="never", default=argparse.SUPPRESS,
                   help="same as --color never")
    p.add_argument("--no-progress", action="store_true", default=argparse.SUPPRESS,
                   help="no progress bars, even on a terminal: plain lines (default: $HERMETIC_NO_PROGRESS=1)")
    p.add_argument("--offline", action="store_true", default=argparse.SUPPRESS,
                   help=OFFLINE.get(command) or NOTHING_TO_FETCH.format(command=command))
    return p


def _int_from(low: int, high: int, what: str) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high``, else a usage error saying what it must be."""
    def parse(text: str) -> int:
        value = int(text) if re.fullmatch(r"[0-9]+", text) else low - 1   # ASCII digits: not 1_0, not ٣, +3
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} from {low} to {high}")
        return value
    return parse


_zstd_level = _int_from(1, 22, "a zstd level")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hermetic", description=DESCRIPTION, parents=[_common()],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"hermetic {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("realize", parents=[_common("realize")], help="fetch, materialize and build a recipe")
    _completes(p.add_argument("recipe", type=Path, help="recipe file (TOML), e.g. recipes/p2p.toml"), FILE)
    p.add_argument("--variant", metavar="NAME", help="realize one variant of the recipe")
    p.add_argument("--explain", action="store_true", help="say why each object was compiled or reused")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be fetched (bytes), unpacked, compiled and reused, decided from the keys "
                        "and the store; write nothing under the root")
    p.add_argument("--check", action="store_true",
                   help="exit 0 when the recipe is up to date, else exit 4 printing what a realize would do (with "
                        "--json the plan); fetches nothing and writes nothing under the root (as uv sync --check)")
    _jobs_option(p)
    _sandbox_option(p)
    _remote_options(p)
    _dist_option(p)

    p = sub.add_parser("gc", parents=[_common("gc")], help="delete everything not reachable from a root")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    p.add_argument("--all", action="store_true", help="remove the whole scratch root")
    p.add_argument("--drop-root", action="append", default=[], metavar="NAME",
                   help="forget the root NAME (and its realize receipts) before collecting")

    p = sub.add_parser("verify", parents=[_common("verify")], help="re-hash the store and report corruption")
    p.add_argument("--repair", action="store_true", help="remove what is corrupt and realize again")
    p.add_argument("--rebuild-sample", type=int, default=0, metavar="N",
                   help="also compile N stored objects again and compare them with the stored ones")
    _jobs_option(p)
    _sandbox_option(p)
    _remote_options(p)

    sub.add_parser("show", parents=[_common("show")], help="roots, entries, sizes, last receipts")
    sub.add_parser("status", parents=[_common("status")], help="same as show")

    p = sub.add_parser("export", parents=[_common("export")], help="write the closure of the roots to one archive")
    _completes(p.add_argument("archive", type=Path, help="output file (.tar.zst)"), FILE)
    p.add_argument("--name", action="append", default=[], metavar="ROOT",
                   help="export only these roots (default: all)")
    p.add_argument("--level", type=_zstd_level, default=19, metavar="N",
                   help="zstd level, 1-22 (default 19: the CUDA toolchain in 53 MB, about 2 minutes on 2 "
                        "cores; 10: 67 MB in 7 s)")
    _completes(p.add_argument("--sign", type=Path, metavar="KEY",
                              help="sign the archive with this secret key (`hermetic key generate`): an importer "
                                   "that trusts its public key (HERMETIC_TRUSTED_KEYS) takes every record"), FILE)

    p = sub.add_parser("import", parents=[_common("import")], help="verify and add an exported archive")
    _completes(p.add_argument("archive", type=Path), FILE)
    p.add_argument("--trust-unsigned", action="store_true",
                   help="take the records that cannot be re-derived (objects, modules, unpacked wheels, source "
                        "trees) from an archive no trusted key signed (default: left out, and said); recorded in "
                        "the import's receipt")

    p = sub.add_parser("env", parents=[_common("env")],
                       help="print a realized recipe's environment, or run a command inside it",
                       usage="%(prog)s [-h] [--root DIR] [--json] [-q] [-v] [--offline] RECIPE [-- CMD [ARG ...]]")
    _completes(p.add_argument("recipe", type=Path, metavar="RECIPE", help="a realized recipe file (TOML)"), FILE)
    p.epilog = ("Without CMD: the variables hermetic sets, as shell exports (eval \"$(hermetic env RECIPE)\"). "
                "With -- CMD ARG...: CMD runs inside the environment, its PATH first (everything after -- is "
                "CMD's).")

    p = sub.add_parser("run", parents=[_common("run")],
                       help="realize what a runner needs, then measure the worker under locks and limits (the "
                            "device's lock is a file in the shared lock folder, outside the root)")
    _completes(p.add_argument("runner", type=Path, help="runner file (TOML), e.g. runner/worker.toml"), FILE)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto",
                   help="where to measure (default: the GPU when NVML sees one, else the CPU)")
    p.add_argument("--gpu", type=int, default=0, metavar="N", help="which GPU (NVML index, default 0)")
    p.add_argument("--peer", type=int, metavar="N",
                   help="a pair run: the worker's rank 1 on card N (locked and checked too), measured against the "
                        "solo cells, and the P2P bandwidth; with --device cpu both ranks run on the CPU")
    p.add_argument("--repetitions", type=int, metavar="N", help="override the runner's repetitions")
    p.add_argument("--power-cap", type=float, metavar="W",
                   help="the power cap the GPU must have (overrides gpu.power_cap_w; never changes the card)")
    p.add_argument("--lock-timeout", type=float, metavar="S",
                   help="seconds to wait for the device's lock, held by another user's run (default: the runner's "
                        "gpu.lock_timeout, 3600, or protocol.cpu_lock_timeout, 600)")
    _completes(p.add_argument("--states", type=Path, metavar="FILE",
                              help="request states to use instead of the runner's (real captures stay where they "
                                   "are)"), FILE)
    p.add_argument("--record-digests", action="store_true",
                   help="write this device class's reference digests (manifests/digests/CLASS.txt), pinned to "
                        "this run's receipt; ATEN_CPU_CAPABILITY=avx2 records the AVX2 class on an AVX-512 CPU")
    _jobs_option(p)
    _sandbox_option(p)
    _remote_options(p)

    p = sub.add_parser("key", parents=[_common("key")], help="signing keys for archives and remote cache entries")
    keys = p.add_subparsers(dest="key_command", metavar="ACTION", required=True)
    k = keys.add_parser("generate", parents=[_common("key")],
                        help="write a new ed25519 key pair: PATH (the secret key) and PATH.pub")
    _completes(k.add_argument("path", type=Path, metavar="PATH", help="the secret key's file (PATH.pub: the public "
                                                                     "key, for HERMETIC_TRUSTED_KEYS)"), FILE)
    k.add_argument("--name", help="the key's name (default: PATH's file name)")

    p = sub.add_parser("config", parents=[_common("config")],
                       help="each setting, its value and where it came from (command line, environment, recipe, "
                            "project, user or system hermetic.toml, default)")
    _completes(p.add_argument("recipe", type=Path, nargs="?", metavar="RECIPE",
                              help="a recipe or a runner: its settings (a runner's: a GPU run's lock folder, the "
                                   "sandbox of [gpu], else [cpu]) and its project's hermetic.toml (default: the "
                                   "current folder's project)"), FILE)
    _jobs_option(p)
    _sandbox_option(p)
    _remote_options(p)
    _dist_option(p)
    p = sub.add_parser("recipe", parents=[_common("recipe")], help="write recipes")
    recipes = p.add_subparsers(dest="recipe_command", metavar="ACTION", required=True)
    r = recipes.add_parser("new", parents=[_common("recipe")],
                           help="derive a recipe from a package's setup.py (run in the sandbox; nothing compiles)")
    _completes(r.add_argument("source", type=Path, metavar="SDIST_OR_FOLDER",
                              help="the package's sdist (.tar.gz, .zip) or a folder holding its setup.py"), FILE)
    r.add_argument("-o", "--output", type=Path, metavar="RECIPE",
                   help="write the recipe here (default: print it); an existing file is not replaced")
    r.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="an option for setup.py (repeatable); setup.py sees no other variable of yours")
    r.add_argument("--name", help="the recipe's name (default: the distribution's)")
    r.add_argument("--url", help="where the recipe fetches the sdist (default: the file's file: URL)")
    r.add_argument("--cuda", default="13.0", help="the root's toolchain profile cuda-VERSION that is CUDA_HOME")
    r.add_argument("--python", help="the interpreter setup.py runs in (default: hermetic's own)")
    r.add_argument("--gpu", choices=("pretend", "none"), default="pretend",
                   help="pretend (default): setup.py's torch.cuda.is_available() answers True, as on a GPU builder")
    r.add_argument("--lock", help="the recipe's [toolchain] lock (default: ../manifests/cuda-VERSION-toolchain.txt)")
    r.add_argument("--timeout", type=_int_from(1, 86400, "a number of seconds"), default=600, metavar="S",
                   help="seconds setup.py may run (default 600); past them it is stopped, with everything it "
                        "started, and recipe new fails (exit 1)")
    _sandbox_option(r)

    p = sub.add_parser("completion", parents=[_common("completion")],
                       help="print the shell completion script (bash or zsh)")
    p.add_argument("shell", choices=("bash", "zsh"),
                   help='bash: eval "$(hermetic completion bash)" in ~/.bashrc; zsh: mkdir -p ~/.zfunc && hermetic '
                        'completion zsh > ~/.zfunc/_hermetic, with fpath=(~/.zfunc $fpath) before compinit in '
                        '~/.zshrc (README, "Shell completion")')
    return parser


_jobs = _int_from(1, 1024, "a number of jobs")


def _jobs_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("-j", "--jobs", type=_jobs, default=None, metavar="N",
                   help="compilers running at once (default $HERMETIC_JOBS, else $MAX_JOBS, else the recipe's "
                        "[limits] jobs, else hermetic.toml's jobs, else the CPU count); the receipt says which won")


def _dist_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dist", metavar="URL", default=None,
                   help="compile on a sccache-dist build cluster (its scheduler's URL; the token in "
                        "$HERMETIC_DIST_TOKEN); default $HERMETIC_DIST, else the recipe's [remote] dist, else a "
                        "hermetic.toml's dist; off: local")


def _sandbox_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sandbox", choices=("auto", "required", "off"), default=None,
                   help="run compilers, the import check and the measuring process where only the scratch root and "
                        "the lock folder are writable (bubblewrap): auto (default) where it works, required (exit 3 "
                        "where it does not), off (default $HERMETIC_SANDBOX, else the recipe's [limits] sandbox or "
                        "the runner's [cpu]/[gpu] sandbox)")


def _remote_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--remote-cache", metavar="URL", default=None,
                   help="share wheels, objects and modules through a Bazel HTTP cache (nginx WebDAV, bazel-remote); "
                        "default $HERMETIC_REMOTE_CACHE, else the recipe's [remote] url; user:password@ for basic "
                        "auth, or a bearer token in $HERMETIC_REMOTE_CACHE_TOKEN")
    p.add_argument("--remote-cache-mode", choices=("off", "ro", "rw"), default=None,
                   help="ro: read only (default); rw: also upload (trusted builders only); off: ignore the remote "
                        "(default $HERMETIC_REMOTE_CACHE_MODE, else the recipe's [remote] mode)")
