"""One compile sent to the build cluster, under the cluster's deadline (extensions.dist):
``python -S distguard.py SECONDS MARK -- COMMAND...``.

Past SECONDS the command's process group is stopped (TERM, then KILL 10 s later), MARK is made and the exit is
124, as timeout(1)'s. While MARK exists (a compile of this build passed the deadline), every later compile exits
1 at once without asking the cluster: the graph compiles the failed units here (Graph's local retry), so a
scheduler that answers hermetic's checks and then stalls costs one deadline, not one per unit (the re-attack on
issue 39, R4: 4 units at one job waited 4 deadlines).
"""

import os
import signal
import subprocess
import sys

KILL_AFTER_S = 10


def main(argv: list[str]) -> int:
    seconds, mark, command = float(argv[0]), argv[1], argv[3:]
    if os.path.exists(mark):
        sys.stderr.write("hermetic: an earlier compile passed the build cluster's deadline: this one is compiled "
                         "here\n")
        return 1
    proc = subprocess.Popen(command, process_group=0)
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        with open(mark, "a"):
            pass
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        sys.stderr.write(f"hermetic: the build cluster did not finish this compile within {seconds:g} s\n")
        return 124


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
