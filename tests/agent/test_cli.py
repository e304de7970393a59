"""The agent's command line as the chart writes it: every flag the DaemonSet passes is
accepted and lands in the agent's configuration (a flag the parser lacks crash-looped the
agent in the cluster story, while every other test built AgentConfig directly)."""

from __future__ import annotations

import re
from pathlib import Path

from agent import cli
from devnode import chart
from restore_runtime.artifact.oci import OciRef
from tests.chart.test_chart import OCI, by_kind


def test_every_flag_the_chart_passes_reaches_the_agent_config():
    values = {**OCI, "storage.oci.prePull": "true"}
    (agent,) = by_kind(chart.render(set_values=values))["DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    main = spec["containers"][0]
    args = cli._parser().parse_args([*main["command"][1:], *main["args"], "--node", "n1"])
    cfg = cli.agent_config(args)
    assert cfg.node == "n1" and cfg.store == Path("/var/lib/snapshot/artifacts")
    assert cfg.oci_repository == OciRef.parse("oci://registry.internal:5000/snaps")
    assert cfg.pre_pull and cfg.registry.plain_http == frozenset({"registry.internal:5000"})
    assert cfg.registry.auth_file == Path("/oci-auth/.dockerconfigjson")
    assert cfg.sign_key is None, "no key on the node: the signer signs"
    assert cfg.signer is not None and cfg.signer.url.endswith("-signer.snapshot-system.svc")
    assert cfg.signer.ca == Path("/signer-ca/ca.crt")
    assert cfg.signer.token == Path("/var/run/secrets/snapshot-signer/token")
    (init,) = spec["initContainers"]
    parsed = cli._parser().parse_args([*init["command"][1:], *init["args"]])
    assert parsed.cmd == "install-node" and parsed.oci_plain_http == "registry.internal:5000"


def test_a_switch_that_is_neither_on_nor_off_names_its_flag(capsys):
    """A planted bad value (structure issue): the agent's ``--fill-ledger`` takes true or
    false, and anything else stops it with the flag's name (it used to read as "on")."""
    import pytest

    parser = cli._parser()
    args = parser.parse_args(["install-node", "--host-root", "/h", "--fill-ledger", "off"])
    assert args.fill_ledger is False
    with pytest.raises(SystemExit):
        parser.parse_args(["install-node", "--host-root", "/h", "--fill-ledger", "maybe"])
    assert "--fill-ledger" in capsys.readouterr().err


def test_each_node_setting_travels_from_its_chart_value_to_the_shim_under_one_name():
    """Structure issue, one name per setting: each chart value of the node's restore settings
    reaches install-node as the flag of its name, the settings as the field of its name, and
    the shim's wrapper as ``SNAPSHOT_<FIELD>``, which the shim reads back to the same value."""
    from api.node import NodeConfig

    planted = {"agent.fillThreads": "7", "agent.fillLedger": "false",
               "agent.runtimeBinary": "/usr/bin/nvidia-container-runtime"}  # fmt: skip
    (agent,) = by_kind(chart.render(set_values=planted))["DaemonSet"]
    (init,) = agent["spec"]["template"]["spec"]["initContainers"]
    args = cli._parser().parse_args([*init["command"][1:], *init["args"]])
    node = cli.install_settings(args)
    expected = {"fill_threads": 7, "fill_ledger": False,
                "runtime_binary": "/usr/bin/nvidia-container-runtime"}  # fmt: skip
    env = node.to_env()
    for key in planted:
        field = re.sub(r"(?<!^)(?=[A-Z])", "_", key.split(".")[1]).lower()  # fillThreads
        flag = "--" + field.replace("_", "-")
        assert any(a.startswith(flag + "=") for a in init["args"]), (key, flag)
        assert getattr(node, field) == expected[field], field
        assert f"SNAPSHOT_{field.upper()}" in env, (field, env)
    assert NodeConfig.from_env(env) == node
