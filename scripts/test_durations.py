"""Write tests/durations.json (seconds per test file) from a run's junit XML, so that
scripts/test.sh's workers start with the heaviest files (tests/conftest.py orders them).

    python scripts/test_durations.py test-results/junit.xml    # after bash .ci/run
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

REPO = Path(__file__).resolve().parents[1]


def file_of(classname: str) -> str | None:
    """The test file of a junit ``classname`` (``tests.core.test_x`` or ``tests.core.test_x.TestY``)."""
    parts = classname.split(".")
    for end in (len(parts), len(parts) - 1):
        path = Path(*parts[:end]).with_suffix(".py")
        if (REPO / path).is_file():
            return path.as_posix()
    return None


def main(report: str) -> None:
    seconds: Counter[str] = Counter()
    for case in ElementTree.parse(report).iter("testcase"):
        path = file_of(case.get("classname", ""))
        if path is not None:
            seconds[path] += float(case.get("time", 0))
    out = REPO / "tests" / "durations.json"
    out.write_text(json.dumps({k: round(v, 1) for k, v in sorted(seconds.items())}, indent=0) + "\n")
    print(f"wrote {out}: {len(seconds)} files, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "test-results/junit.xml")
