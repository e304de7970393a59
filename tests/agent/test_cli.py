"""The agent's command line as the chart writes it: every flag the DaemonSet passes is
accepted and lands in the agent's configuration (a flag the parser lacks crash-looped the
agent in the cluster story, while every other test built AgentConfig directly)."""

from __future__ import annotations

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
