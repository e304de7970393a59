"""The project's images are built two ways, with Docker (the Dockerfiles) and without
(tools/build-image.sh + devnode/project_image.py, what the cluster tests run): both take the
same Debian packages and the same code, so what the tests run is what users build."""

from __future__ import annotations

import re
from pathlib import Path

from devnode import project_image

ROOT = Path(__file__).resolve().parent.parent


def _copies(dockerfile: Path) -> list[str]:
    """The sources of the Dockerfile's COPY lines."""
    out = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY "):
            out += line.split()[1:-1]
    return out


def test_the_project_image_installs_the_one_package_list():
    text = (ROOT / "Dockerfile").read_text()
    assert "COPY image/debian-packages" in text
    assert "$(grep -v '^#' /tmp/debian-packages)" in text
    build = (ROOT / "tools" / "build-image.sh").read_text()
    assert "grep -v '^#' \"$root/image/debian-packages\"" in build
    assert not re.search(r"apt-get install[^\n]*criu", text), "packages named outside the list"


def test_the_project_image_has_the_same_code_both_ways():
    copied = {c for c in _copies(ROOT / "Dockerfile") if (ROOT / c).is_dir() and c != "scripts"}
    assert copied == set(project_image.PROJECT_PACKAGES)
    files = project_image.spec("snapshot").files
    for pkg in project_image.PROJECT_PACKAGES:
        assert any(
            p.startswith(f"opt/snapshot/lib/python3.13/site-packages/{pkg}/") for p in files
        ), pkg


def test_the_demo_image_has_the_same_files_both_ways():
    copied = _copies(ROOT / "examples" / "cpu_demo" / "Dockerfile")
    listed = set(project_image.CPU_DEMO_FILES)
    assert set(copied) == listed, set(copied) ^ listed
