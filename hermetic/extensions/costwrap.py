"""Run one compile and write what it took: ``python -S costwrap.py COST_FILE COMMAND...``.

The build graph (extensions/graph.py) puts every compile of its ninja file under this wrapper. It writes the
time it starts to COST_FILE.start (the graph says which compiles run, and for how long), starts the
command, waits for it with wait4 (its wall time; its user and system time and those of every process it
waited for; the largest resident set among them), writes those and its exit status as JSON to COST_FILE (a
temp file renamed into place) and exits with the command's status. Standard library only, run without site:
it adds about 20 ms to a compile and imports nothing of hermetic.

Its own writes can fail as the compiler's can (a disk that fills while it compiles): then it says so in one
line, with the system's words ("No space left on device", which the build's hint looks for), never a
traceback, and exits non-zero; no cost file is left, so the compile counts as failed.
"""

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    out, command = argv[0], argv[1:]
    start = time.time()
    t0 = time.monotonic()
    trouble = _write(f"{out}.start", repr(start))
    if trouble is not None:
        sys.stderr.write(f"hermetic: cannot record the compile's start: {trouble}\n")
        return 1
    try:
        pid = os.posix_spawnp(command[0], command, os.environ)
    except OSError as e:
        sys.stderr.write(f"{command[0]}: {e.strerror}\n")
        return 127
    _pid, status, usage = os.wait4(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    cost = {"start": start, "seconds": round(time.monotonic() - t0, 4),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 4), "max_rss": usage.ru_maxrss * 1024,
            "returncode": code}
    tmp = f"{out}.tmp{os.getpid()}"
    trouble = _write(tmp, json.dumps(cost))
    if trouble is None:
        try:
            os.replace(tmp, out)
        except OSError as e:
            trouble = f"{out}: {e.strerror}"
    if trouble is not None:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        sys.stderr.write(f"hermetic: cannot record what the compile took: {trouble}\n")
        return code if code > 0 else 1
    return code if code >= 0 else 128 - code


def _write(path: str, text: str) -> str | None:
    """Write ``text`` to ``path``; None, or what went wrong ("PATH: No space left on device")."""
    try:
        with open(path, "w") as f:
            f.write(text)
    except OSError as e:
        return f"{path}: {e.strerror}"
    return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
