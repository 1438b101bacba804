"""The wrapped clients keep the SDKs' types: mypy --strict checks tests/typing/wrapped_types.py,
whose ``assert_type`` calls name the SDK's own type for every wrapped method (an ``Any``
anywhere fails them)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPED = ROOT / "tests" / "typing" / "wrapped_types.py"


def test_wrapped_methods_return_the_sdk_types() -> None:
    done = subprocess.run(
        # imported modules are the package's own check (CI's mypy); only this file's errors
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", str(TYPED)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success" in done.stdout
