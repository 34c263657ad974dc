"""Run ninja beside sccache's client daemon: ``python -S distwrap.py SCCACHE -- NINJA ARGV...`` (extensions.dist).

The daemon runs in the foreground as this process's child (``SCCACHE_START_SERVER=1 SCCACHE_NO_DAEMON=1``), so it
is inside the sandbox and the session the reaper stops, like the compilers. Once its socket answers, ninja runs;
then the daemon's statistics go to ``$HERMETIC_DIST_STATS``, the daemon is stopped and its socket removed. A
daemon that does not start in 60 s means exit 75 before any compile (the graph then builds without the cluster).
Exit: ninja's.
"""

import json
import os
import signal
import subprocess
import sys
import time

NO_DAEMON = 75


def main(argv: list[str]) -> int:
    sccache, ninja = argv[0], argv[2:]
    env = dict(os.environ)
    run = os.path.dirname(env["SCCACHE_CONF"])
    daemon_env = dict(env, SCCACHE_START_SERVER="1", SCCACHE_NO_DAEMON="1", SCCACHE_LOG="debug",
                      SCCACHE_ERROR_LOG=env["HERMETIC_DIST_LOG"], TMPDIR=os.path.join(run, "tmp"))
    sock = env["SCCACHE_SERVER_UDS"]
    daemon = subprocess.Popen([sccache], env=daemon_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            if daemon.poll() is not None or time.monotonic() > deadline:
                sys.stdout.write(f"hermetic: sccache's client daemon did not start (rc {daemon.poll()})\n")
                sys.stdout.flush()
                return NO_DAEMON
            ok = subprocess.run([sccache, "--show-stats", "--stats-format", "json"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if (
                os.path.exists(sock)) else None
            if ok is not None and ok.returncode == 0:
                break
            time.sleep(0.1)
        rc = subprocess.run(ninja, env=env).returncode
        stats = subprocess.run([sccache, "--show-stats", "--stats-format", "json"], env=env,
                               capture_output=True, text=True)
        try:
            data = json.loads(stats.stdout)
        except ValueError:
            data = {}
        with open(env["HERMETIC_DIST_STATS"], "w") as f:
            json.dump(data, f)
        return rc
    finally:
        if daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        if os.path.lexists(sock):
            os.unlink(sock)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
