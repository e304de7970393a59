"""The node's settings reach the shim as environment variables of its wrapper (the installer
writes them): a value that does not parse stops the shim with one line naming the variable,
not a traceback in containerd's log; and the installer never writes one that would break
the wrapper's shell quoting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from agent.install import wrapper
from api.node import (
    FILL_LEDGER_ENV,
    FILL_THREADS_ENV,
    OCI_PULL_TIMEOUT_ENV,
    SIGNING_REQUIRED_ENV,
    NodeConfig,
    NodeSettingError,
)
from restore_runtime.errors import SnapshotError


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        (FILL_THREADS_ENV, "lots", "not an integer"),
        (OCI_PULL_TIMEOUT_ENV, "1m", "not a number"),
        (FILL_THREADS_ENV, "-2", "negative"),
        # a misspelt "false" once left signing required (safe) and the ledger on (not asked for)
        (SIGNING_REQUIRED_ENV, "flase", "not true or false"),
        (FILL_LEDGER_ENV, "of", "not true or false"),
    ],
)
def test_a_bad_setting_names_itself(name, value, why, tmp_path):
    with pytest.raises(NodeSettingError, match=f"{name}={value!r}: {why}"):
        NodeConfig.from_env({name: value})
    env = {**os.environ, name: value}
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "shim",
            "-namespace",
            "k8s.io",
            "-id",
            "x",
            "-address",
            str(tmp_path / "sock"),
            "delete",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.returncode == 1
    assert p.stderr.strip() == (
        f"containerd-shim-snapshot-v2: node setting {name}={value!r}: {why}"
    ), p.stderr


@pytest.mark.parametrize("value", ['runc" ; rm -rf / ; "', "$(id)", "a`b`", "a\\b", "a\nb"])
def test_the_installer_refuses_a_setting_that_would_break_the_wrapper(value, tmp_path):
    with pytest.raises(SnapshotError, match="may not hold"):
        wrapper(tmp_path, NodeConfig(runtime_binary=value))
