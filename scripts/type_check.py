"""mypy over the package, held to a baseline that may only shrink.

    python scripts/type_check.py            # exit 1 if a file has more errors than its baseline
    python scripts/type_check.py --update   # write the counts of today (after fixing some)

The baseline (.ci/mypy_baseline.json) counts mypy's errors per file. A file over its count
fails, naming the new errors; a file under it is a fix, and the script says to lower the
baseline (`--update`), so that the count never grows back.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy_baseline.json"
ERROR = re.compile(r"^(?P<file>[^:\s]+\.py):\d+: error: ")


def mypy_errors() -> list[str]:
    """mypy's error lines over the package (settings in pyproject.toml's [tool.mypy])."""
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary"], cwd=ROOT,
                          capture_output=True, text=True)  # fmt: skip
    if proc.returncode not in (0, 1) or proc.stderr.strip():
        sys.exit(f"mypy did not run (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return [line for line in proc.stdout.splitlines() if ERROR.match(line)]


def main(argv: list[str]) -> int:
    errors = mypy_errors()
    counts = Counter(ERROR.match(line)["file"] for line in errors)
    if "--update" in argv:
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
        print(f"mypy: {len(errors)} errors; baseline written to {BASELINE.relative_to(ROOT)}")
        return 0
    baseline = json.loads(BASELINE.read_text())
    over = {f: n for f, n in counts.items() if n > baseline.get(f, 0)}
    print(f"mypy: {len(errors)} errors, baseline {sum(baseline.values())} "
          f"({len(counts)} files with errors)")  # fmt: skip
    for path in sorted(over):
        print(f"  {path}: {over[path]} errors, baseline {baseline.get(path, 0)}:")
        print("\n".join(f"    {line}" for line in errors if line.startswith(path + ":")))
    if any(counts.get(f, 0) < n for f, n in baseline.items()):
        print("  fewer errors than the baseline somewhere: lower it with --update")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
