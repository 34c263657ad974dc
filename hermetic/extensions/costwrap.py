"""Run one compile and write what it took: ``python -S costwrap.py COST_FILE COMMAND...``.

The build graph (extensions/graph.py) puts every compile of its ninja file under this wrapper. It writes the
time it starts to COST_FILE.start (the graph says which compiles run, and for how long), starts the
command, waits for it with wait4 (its wall time; its user and system time and those of every process it
waited for; the largest resident set among them), writes those and its exit status as JSON to COST_FILE (a
temp file renamed into place) and exits with the command's status. Standard library only, run without site:
it adds about 20 ms to a compile and imports nothing of hermetic.
"""

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    out, command = argv[0], argv[1:]
    start = time.time()
    t0 = time.monotonic()
    with open(f"{out}.start", "w") as f:
        f.write(repr(start))
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
    with open(tmp, "w") as f:
        json.dump(cost, f)
    os.replace(tmp, out)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
