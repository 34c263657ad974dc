"""One nvcc compile as nvcc's own steps, the heavy ones through a launcher (sccache): ``python -S nvccsplit.py
--launcher SCCACHE -- NVCC ARGV...`` (extensions.dist; docs/builds.md, "Compiles on a build cluster").

sccache 0.16.0 cannot split ``nvcc --objdir-as-tempdir`` itself (it drops cicc and ptxas from its plan), and
without that flag nvcc's temporary names (``tmpxft_<pid>``) end up in the object. So this runs ``nvcc --dryrun``
on hermetic's unchanged command and then each step it prints: the two host preprocessing passes and fatbinary
locally, cudafe++, cicc, ptxas and the host compile through the launcher. The object is byte for byte the one
plain nvcc writes (proved per unit in tests/test_dist.py). nvcc's ``-MD -MF`` is done by the host preprocessing
pass that feeds cudafe++ and the one of the host compile, their dependencies united as nvcc's own file lists them.
Temporaries (``<object>.*`` of ``--objdir-as-tempdir``) are removed whether the compile succeeds or fails.
"""

import os
import re
import shlex
import subprocess
import sys

REMOTE = ("cudafe++", "cicc", "ptxas", "host")
_OPT = re.compile(r"^-O(\d|s|fast|g|z)?$")


def optimized(cmd: list[str]) -> bool:
    """The host compile optimizes: at -O0 gcc's code follows line locations (a ``nop`` for a closing brace),
    which the preprocessed text a remote compile reads moves, so such a host step stays local."""
    level = None
    for word in cmd:
        m = _OPT.match(word)
        if m:
            level = m.group(1)
    return level is not None and level not in ("0", "g")


def steps_of(args: list[str]) -> tuple[tuple[dict[str, str], list[list[str]]] | None, str]:
    """(environment, steps) of ``nvcc ARGS --dryrun``; None and nvcc's output where the dry run fails."""
    dry = subprocess.run([*args, "--dryrun"], capture_output=True, text=True)
    if dry.returncode != 0:
        return None, dry.stdout + dry.stderr
    env = dict(os.environ)
    steps = []
    for line in dry.stderr.splitlines():
        if not line.startswith("#$ "):
            continue
        line = line[3:]
        m = re.match(r"^([_A-Z]+)=(.*)$", line)
        if m:
            val = m.group(2)
            env[m.group(1)] = " ".join(shlex.split(val)) if '"' in val else val.strip()
            continue
        if line.startswith("--"):
            continue  # "-- Filter Dependencies -- > FILE": nvcc-internal, done below
        for var in sorted(env, key=len, reverse=True):
            line = line.replace(f"${var}/", env[var] + "/").replace(f'"${var}"', env[var])
        steps.append(shlex.split(line))
    return (env, steps), ""


def main(argv: list[str]) -> int:
    launcher: str | None = None
    while argv and argv[0] != "--":
        if argv[0] == "--launcher":
            launcher, argv = argv[1], argv[2:]
        else:
            sys.stderr.write(f"nvccsplit: unknown option {argv[0]}\n")
            return 2
    nvcc = argv[1:]
    depfile: str | None = None
    args: list[str] = []
    i = 0
    while i < len(nvcc):
        if nvcc[i] == "-MD":
            i += 1
        elif nvcc[i] == "-MF":
            depfile, i = nvcc[i + 1], i + 2
        else:
            args.append(nvcc[i])
            i += 1
    obj = args[args.index("-o") + 1]
    planned, output = steps_of(args)
    if planned is None:
        sys.stdout.write(output)
        return 1
    env, steps = planned
    parts: list[str] = []
    rc = 0
    try:
        for cmd in steps:
            if cmd[0] == "rm":
                continue
            name = os.path.basename(cmd[0])
            kind = name
            if name in ("gcc", "g++", "c++", "cc"):
                kind = "host" if "-c" in cmd else "host-E"
                if kind == "host-E" and depfile:
                    parts.append(f"{depfile}.{len(parts)}")
                    cmd = [*cmd, "-MD", "-MF", parts[-1], "-MT", obj]
            remote = kind in REMOTE and (kind != "host" or optimized(cmd))
            full = [launcher, *cmd] if launcher and remote else cmd
            rc = subprocess.run(full, env=env).returncode
            if rc != 0:
                sys.stdout.write(f"nvccsplit: step {kind} failed (rc {rc}): {shlex.join(full)}\n")
                return rc
        if depfile:  # the union of both preprocessing passes' dependencies, as nvcc's own -MD writes it
            seen: dict[str, None] = {}
            for part in parts:
                with open(part) as fh:
                    text = fh.read().replace("\\\n", " ")
                for dep in text.split(":", 1)[1].split():
                    seen.setdefault(dep)
            with open(depfile, "w") as out:
                out.write(f"{obj} : " + " \\\n    ".join(seen) + "\n")
        return 0
    finally:
        for cmd in steps:
            if cmd[0] == "rm":
                for tmp in cmd[1:]:
                    if tmp.startswith(obj + ".") and os.path.lexists(tmp):
                        os.unlink(tmp)
        folder = os.path.dirname(obj) or "."
        base = os.path.basename(obj) + "."
        for name in os.listdir(folder):
            if name.startswith(base) and not name.endswith((".d", ".cost", ".cost.start")) and rc != 0:
                os.unlink(os.path.join(folder, name))
        for part in parts:
            if os.path.lexists(part):
                os.unlink(part)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
