#!/usr/bin/env python3
"""Run the reference model on every reference/examples/*.txt and compare its
output with the matching .events file, byte for byte.

    python3 reference/check_examples.py

The last line printed is `N passed, M failed`; the exit status is non-zero
if any example failed (or has no .events file).
"""

import difflib
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
MODEL = HERE / "model.py"
EXAMPLES = HERE / "examples"


def main():
    passed = 0
    failed = 0
    for commands in sorted(EXAMPLES.glob("*.txt")):
        expected_path = commands.with_suffix(".events")
        if not expected_path.exists():
            print("FAIL %s: no %s" % (commands.name, expected_path.name))
            failed += 1
            continue
        run = subprocess.run(
            [sys.executable, str(MODEL), "--check", str(commands)],
            capture_output=True,
        )
        expected = expected_path.read_bytes()
        if run.returncode == 0 and run.stdout == expected:
            print("ok   %s" % commands.name)
            passed += 1
            continue
        failed += 1
        print("FAIL %s (exit status %d)" % (commands.name, run.returncode))
        if run.stderr:
            sys.stdout.write(run.stderr.decode("utf-8", "replace"))
        diff = difflib.unified_diff(
            expected.decode("utf-8", "replace").splitlines(keepends=True),
            run.stdout.decode("utf-8", "replace").splitlines(keepends=True),
            fromfile=expected_path.name,
            tofile="model output",
        )
        sys.stdout.writelines(diff)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
