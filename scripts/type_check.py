"""mypy over the package, held to a baseline that may only shrink.

    python scripts/type_check.py            # exit 1 if a file has more errors than its baseline
    python scripts/type_check.py --update   # write the counts of today (after fixing some)

The baseline (.ci/mypy_baseline.json) counts mypy's errors per file. A file over its count
fails, naming the new errors; a file under it fails too, until the baseline is lowered with
`--update` (so that no slack is left for errors to come back); `--update` refuses to raise a
count.
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
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode not in (0, 1) or proc.stderr.strip():
        sys.exit(f"mypy did not run (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    return [line for line in proc.stdout.splitlines() if ERROR.match(line)]


def main(argv: list[str]) -> int:
    errors = mypy_errors()
    counts = Counter(ERROR.match(line)["file"] for line in errors)
    if "--update" in argv:
        old = json.loads(BASELINE.read_text()) if BASELINE.exists() else None
        raised = {f: n for f, n in counts.items() if old is not None and n > old.get(f, 0)}
        if raised:
            print(f"mypy: refusing to raise the baseline of {', '.join(sorted(raised))}")
            return 1
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
        print(f"mypy: {len(errors)} errors; baseline written to {BASELINE.relative_to(ROOT)}")
        return 0
    baseline = json.loads(BASELINE.read_text())
    over = {f: n for f, n in counts.items() if n > baseline.get(f, 0)}
    print(
        f"mypy: {len(errors)} errors, baseline {sum(baseline.values())} "
        f"({len(counts)} files with errors)"
    )
    for path in sorted(over):
        print(f"  {path}: {over[path]} errors, baseline {baseline.get(path, 0)}:")
        print("\n".join(f"    {line}" for line in errors if line.startswith(path + ":")))
    under = sorted(f for f, n in baseline.items() if counts.get(f, 0) < n)
    if under:
        print(
            f"  fewer errors than the baseline in {', '.join(under)}: lower it with "
            "`python scripts/type_check.py --update` and commit it"
        )
    return 1 if over or under else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
