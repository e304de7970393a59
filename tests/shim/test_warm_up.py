"""The shim daemon of a restoring pod imports the engine ahead of StartContainer
(shim/bootstrap.py ``warm_up_restore``); a plain pod's shim stays light. Run in fresh
interpreters: what one imported cannot leak into the other."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from restore_runtime.contracts.annotations import ARTIFACT

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import sys, threading
from pathlib import Path
from shim.bootstrap import warm_up_restore
warm_up_restore(Path(sys.argv[1]))
for t in threading.enumerate():
    if t.name == "warm-up":
        t.join(60)
print(",".join(m for m in ("restore_runtime.executor", "pycriu.images") if m in sys.modules))
"""


def _loaded(bundle: Path) -> str:
    p = subprocess.run([sys.executable, "-c", PROBE, str(bundle)], capture_output=True,
                       text=True, cwd=ROOT, check=True)  # fmt: skip
    return p.stdout.strip()


def test_a_restoring_pods_shim_imports_the_engine_before_start(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"annotations": {ARTIFACT: "file:///x"}}))
    assert _loaded(tmp_path) == "restore_runtime.executor,pycriu.images"


def test_a_plain_pods_shim_imports_nothing_more(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"annotations": {"a": "b"}}))
    assert _loaded(tmp_path) == ""
    (tmp_path / "config.json").write_text("not json")
    assert _loaded(tmp_path) == ""
