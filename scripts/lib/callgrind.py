"""Counting a process's instructions under valgrind's callgrind, phase by phase: shared by
the scripts that run `redis-server` under `valgrind --tool=callgrind --instr-atstart=no
--callgrind-out-file=DIR/callgrind.out` (scripts/queue-costs, scripts/queue-instructions)."""

import glob
import os
import subprocess
import sys
import time


def count(pid, on):
    """Starts or stops counting the instructions of process `pid`."""
    subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)],
                   capture_output=True, check=True)
    if on:
        # Taken up by the process when it next runs: before the phase's first call.
        time.sleep(1)


def counted(pid, folder):
    """Stops counting and answers the instructions counted since counting last started
    (the newest dump's total, in `folder`)."""
    count(pid, False)
    subprocess.run(["callgrind_control", "-d", str(pid)], capture_output=True, check=True)
    dumps = glob.glob(os.path.join(folder, "callgrind.out.*"))
    newest = max(dumps, key=lambda d: int(d.rsplit(".", 1)[1]))
    with open(newest) as f:
        for line in f:
            if line.startswith("totals:"):
                return int(line.split()[1])
    sys.exit(f"no totals in {newest}")
