"""Print each installed package whose version is not the one in constraints.txt (the lock).

    python scripts/lock_drift.py          # in the environment to check (make test-latest runs it)

Exit code 0 either way: a difference is information (the figures the notebooks quote were
measured with the locked versions), not an error.
"""

from __future__ import annotations

import sys

from minimind_lib.core.environment import LOCK_FILE, lock_drift


def main() -> int:
    drift = lock_drift()
    if drift is None:
        print(f"no lock file at {LOCK_FILE}")
    elif not drift:
        print(f"every installed package is at its version in {LOCK_FILE.name}")
    else:
        print(f"{len(drift)} installed packages differ from {LOCK_FILE.name}:")
        for d in drift:
            print(f"  {d.name:<32} {d.installed:<20} (locked {d.locked})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
