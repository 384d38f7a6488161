"""`make bench`: run every benchmarks/bench_*.py in turn and print their tables."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = 0
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n## {script.name}\n", flush=True)
        failed |= subprocess.call([sys.executable, str(script)]) != 0
    return failed


if __name__ == "__main__":
    sys.exit(main())
