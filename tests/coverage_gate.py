"""The coverage rule of ``make coverage``: every module of fairseq_hybrid/ with at least
MIN_STATEMENTS statements has at least MIN_PERCENT of its lines run by the test suite
(subprocesses and worker threads included). Reads the combined ``.coverage`` data; prints
the modules it judged and exits 1 naming any below the bar."""
from __future__ import annotations

import sys

import coverage

MIN_STATEMENTS = 40
MIN_PERCENT = 90.0


def main() -> int:
    cov = coverage.Coverage()
    cov.load()
    data = cov.get_data()
    failing = []
    for path in sorted(data.measured_files()):
        if "/fairseq_hybrid/" not in path:
            continue
        _, statements, _, missing, _ = cov.analysis2(path)
        if len(statements) < MIN_STATEMENTS:
            continue
        percent = 100.0 * (len(statements) - len(missing)) / len(statements)
        name = path[path.index("fairseq_hybrid/"):]
        print(f"{name:<40} {len(statements):>4} statements  {percent:5.1f}%")
        if percent < MIN_PERCENT:
            failing.append(f"{name} ({percent:.1f}%)")
    if failing:
        print(f"below {MIN_PERCENT:.0f}%: {', '.join(failing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
