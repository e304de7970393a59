"""The Helm chart: it lints, renders, and every object it renders is accepted by a real
kube-apiserver (server-side dry run, so nothing is left behind for other tests)."""

from __future__ import annotations

import pytest

from devnode import chart

pytestmark = pytest.mark.skipif(chart.missing() is not None, reason=chart.missing() or "")

PLURALS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "Service": "/api/v1/namespaces/{ns}/services",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "PodDisruptionBudget": "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "NetworkPolicy": "/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "MutatingWebhookConfiguration":
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "RuntimeClass": "/apis/node.k8s.io/v1/runtimeclasses",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ValidatingAdmissionPolicy":
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding":
        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
}  # fmt: skip


def by_kind(objs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for o in objs:
        out.setdefault(o["kind"], []).append(o)
    return out


def test_chart_lints():
    p = chart.helm("lint", "--strict", str(chart.CHART), "--kube-version", chart.KUBE_VERSION)
    assert p.returncode == 0, p.stdout + p.stderr


def test_every_rendered_object_is_accepted_by_the_api_server(control_plane):
    # its own RuntimeClass name: the webhook tests create "snapshot" in the same API server
    objs = chart.render(set_values={"runtimeClass.name": "snapshot-chart-test"})
    assert set(by_kind(objs)) == set(PLURALS)
    with control_plane.client() as c:
        c.post("/api/v1/namespaces", json={"metadata": {"name": "snapshot-system"}})
        for o in objs:
            path = PLURALS[o["kind"]].format(ns=o["metadata"].get("namespace", ""))
            r = c.post(path, params={"dryRun": "All"}, json=o)
            assert r.status_code == 201, f"{o['kind']} {o['metadata']['name']}: {r.text}"


def test_defaults_wire_the_components_together():
    k = by_kind(chart.render())
    (mwc,) = k["MutatingWebhookConfiguration"]
    (hook,) = mwc["webhooks"]
    (svc,) = [s for s in k["Service"] if s["metadata"]["name"].endswith("-webhook")]
    assert hook["clientConfig"]["service"]["name"] == svc["metadata"]["name"]
    assert hook["failurePolicy"] == "Ignore" and hook["rules"][0]["operations"] == ["CREATE"]
    assert "snapshot-system" in hook["namespaceSelector"]["matchExpressions"][0]["values"]
    webhook = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-webhook"))
    args = webhook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--tls-secret=snap-snapshot-webhook-tls" in args and "--runtime-class=snapshot" in args
    (rc,) = k["RuntimeClass"]
    assert (rc["metadata"]["name"], rc["handler"]) == ("snapshot", "snapshot")
    (agent,) = k["DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    assert spec["hostPID"] and spec["containers"][0]["securityContext"] == {
        "privileged": True, "runAsUser": 0}  # fmt: skip
    assert spec["containers"][0]["command"] == ["snapshot-agent", "run"]
    role = next(r for r in k["ClusterRole"] if r["metadata"]["name"].endswith("-webhook"))
    assert role["rules"][0] == {"apiGroups": ["nvidia.com"], "resources": ["podsnapshots"],
                                "verbs": ["get"]}, "it reads PodSnapshots only"  # fmt: skip
    writes = [r for r in role["rules"][1:] if set(r["verbs"]) - {"get"}]
    assert all(r.get("resourceNames") == [mwc["metadata"]["name"]] for r in writes), (
        "and writes its own configuration's caBundle only"
    )


def test_defaults_are_secure():
    """helm template on default values: nothing secret rendered (the webhook and the signer
    make their certificates and the signing key themselves, once, in Secrets they keep),
    signing required, the webhook writing its own CA into its configuration, and the
    fail-closed ValidatingAdmissionPolicy with its binding."""
    k = by_kind(chart.render())
    assert "Secret" not in k and "ConfigMap" not in k
    (mwc,) = k["MutatingWebhookConfiguration"]
    assert "caBundle" not in mwc["webhooks"][0]["clientConfig"]
    webhook = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-webhook"))
    assert webhook["spec"]["replicas"] == 2
    pod = webhook["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert "--tls-secret=snap-snapshot-webhook-tls" in args
    assert f"--patch-ca-bundle={mwc['metadata']['name']}" in args
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]
    role = next(r for r in k["ClusterRole"] if r["metadata"]["name"] == "snap-snapshot-webhook")
    assert {
        "apiGroups": ["admissionregistration.k8s.io"],
        "resources": ["mutatingwebhookconfigurations"],
        "resourceNames": [mwc["metadata"]["name"]],
        "verbs": ["get", "patch"],
    } in role["rules"]

    spec = k["DaemonSet"][0]["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    url = "--signer-url=https://snap-snapshot-signer.snapshot-system.svc"
    assert url in init["args"] and url in spec["containers"][0]["args"]
    assert "--no-signing-required" not in init["args"]
    assert "--verify-key-path=/opt/snapshot/keys/verify.pem" in spec["containers"][0]["args"]
    token = next(v for v in spec["volumes"] if v["name"] == "signer-token")
    assert token["projected"]["sources"][0]["serviceAccountToken"]["audience"] == "snapshot-signer"
    # restore pods go only to nodes whose agent said the shim is there (nodes issue)
    (rc,) = k["RuntimeClass"]
    assert rc["scheduling"]["nodeSelector"] == {"snapshot.nvidia.com/ready": "true"}
    assert "--daemonset=snapshot-system/snap-snapshot-agent" in spec["containers"][0]["args"]


@pytest.mark.parametrize(
    ("values", "pinned"),
    [({}, True), ({"storage.shared": "true"}, False),
     ({"storage.type": "oci", "storage.oci.repository": "oci://reg.test/snaps"}, False)],
)  # fmt: skip
def test_restores_are_pinned_to_the_source_node_only_with_a_node_local_store(values, pinned):
    k = by_kind(chart.render(set_values=values))
    webhook = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-webhook"))
    args = webhook["spec"]["template"]["spec"]["containers"][0]["args"]
    assert ("--pin-to-source-node" in args) is pinned


def test_helm_template_is_byte_identical_run_after_run():
    """Operations issue: helm template (what Argo CD and Flux render with, where lookup finds
    nothing) made a new signing key, webhook CA and signer certificate on every run, so
    every GitOps sync rotated them and artifacts stopped verifying."""
    for values in ({}, {"storage.type": "oci", "storage.oci.repository": "oci://reg.test/snaps"}):
        first = chart.render_text(set_values=values)
        assert chart.render_text(set_values=values) == first
        assert "PRIVATE KEY" not in first and "CERTIFICATE" not in first


def test_no_gpu_node_holds_the_signing_key():
    """The key is read by the signer alone (its Role names the Secret; no ClusterRole reads
    Secrets), which is kept off GPU nodes; the agent (on every GPU node) gets the signer's CA
    from a ConfigMap and mounts no Secret. Before the signer, the agent mounted the private
    key and signed on the node."""
    k = by_kind(chart.render())
    agent = k["DaemonSet"][0]["spec"]["template"]["spec"]
    assert not [v for v in agent["volumes"] if "secret" in v]
    args = [a for c in (*agent["initContainers"], *agent["containers"]) for a in c["args"]]
    assert not [a for a in args if a.startswith("--sign-key")]
    signer = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-signer"))
    spec = signer["spec"]["template"]["spec"]
    assert "--key-secret=snap-snapshot-signing" in spec["containers"][0]["args"]
    readers = {r["metadata"]["name"] for r in (*k["Role"], *k["ClusterRole"])
               for rule in r["rules"] if "secrets" in rule.get("resources", [])
               and "snap-snapshot-signing" in rule.get("resourceNames", ["*"])}  # fmt: skip
    assert readers == {"snap-snapshot-signer-keeps"}
    (binding,) = [b for b in k["RoleBinding"]
                  if b["metadata"]["name"] == "snap-snapshot-signer-keeps"]  # fmt: skip
    assert binding["subjects"][0]["name"] == "snap-snapshot-signer"
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]  # fmt: skip
    assert term["matchExpressions"] == [
        {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]},
        {"key": "snapshot.nvidia.com/ready", "operator": "NotIn", "values": ["true"]}]  # fmt: skip
    # and the agent leaves a node where it runs anyway without restore pods
    (agent_args,) = [c["args"] for c in agent["containers"]]
    assert ("--not-beside=app.kubernetes.io/instance=snap,app.kubernetes.io/component in "
            "(signer,webhook,controller)") in agent_args  # fmt: skip
    assert agent.get("nodeSelector", {}) == {}, "every node by default: no GPU labels needed"
    role = next(r for r in k["ClusterRole"] if r["metadata"]["name"].endswith("-signer"))
    assert {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"],
            "verbs": ["create"]} in role["rules"]  # fmt: skip
    assert "--agent-service-account=snapshot-system:snap-snapshot-agent" in spec["containers"][0][
        "args"]  # fmt: skip

    policies = {o["metadata"]["name"].removeprefix("snap-snapshot-"): o
                for o in k["ValidatingAdmissionPolicy"]}  # fmt: skip
    # the agent stays on its node, the controller, the webhook and the uninstall hook to
    # their jobs
    assert sorted(policies) == ["agent-node", "annotations", "controller-writes",
                                "signer-creates", "unlabel-writes", "webhook-creates",
                                "webhook-writes"]  # fmt: skip
    vap = policies["annotations"]
    binding = next(b for b in k["ValidatingAdmissionPolicyBinding"]
                   if b["spec"]["policyName"] == vap["metadata"]["name"])  # fmt: skip
    assert vap["spec"]["failurePolicy"] == "Fail"
    assert vap["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_the_control_plane_stays_off_gpu_nodes_by_default():
    """Isolation round 3, attack 2: the controller (whose token hands PodSnapshots to nodes,
    what the signer trusts) and the webhook (whose node holds its serving key) could be
    scheduled onto GPU nodes. Each control-plane Deployment now requires a node without
    nvidia.com/gpu.present=true, and, as the agent runs on every node by default, one that
    restore pods are not made for (snapshot.nvidia.com/ready); a value per component sets
    another affinity."""
    no_gpu = [
        {"key": "nvidia.com/gpu.present", "operator": "NotIn", "values": ["true"]},
        {"key": "snapshot.nvidia.com/ready", "operator": "NotIn", "values": ["true"]},
    ]
    k = by_kind(chart.render())
    for part in ("controller", "webhook", "signer"):
        deploy = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith(f"-{part}"))
        terms = deploy["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
        assert [t["matchExpressions"] for t in terms] == [no_gpu], part
    k = by_kind(chart.render(set_values={"controller.affinity": "null"}))
    deploy = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-controller"))
    assert "nodeAffinity" not in deploy["spec"]["template"]["spec"]["affinity"]


def test_network_policies_let_only_scrapers_and_agents_reach_the_listeners():
    """Isolation round 3, attack 5 (with kubeclient/metrics_server.py's bounds): any pod
    could reach the agent's, controller's and signer's ports. A NetworkPolicy per component
    now admits only its port, from the release's namespace and networkPolicy.metricsFrom
    (the signer: from the agents too); off with networkPolicy.enabled=false."""
    k = by_kind(chart.render())
    pols = {p["metadata"]["name"].removeprefix("snap-snapshot-"): p["spec"]
            for p in k["NetworkPolicy"]}  # fmt: skip
    assert set(pols) == {"agent", "controller", "signer", "webhook"}
    release = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "snapshot-system"}}}  # fmt: skip
    for part, port in (("agent", 9400), ("controller", 9401)):
        (rule,) = pols[part]["ingress"]
        assert rule["ports"] == [{"port": port, "protocol": "TCP"}]
        assert release in rule["from"] and len(rule["from"]) == 2, rule
    (rule,) = pols["signer"]["ingress"]
    assert rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "agent"
    assert all(p["policyTypes"] == ["Ingress"] for p in pols.values())
    off = chart.render(set_values={"networkPolicy.enabled": "false"})
    assert "NetworkPolicy" not in by_kind(off)


def test_the_agent_and_controller_are_probed_and_the_controller_survives_drains():
    """What an admin expects (issue 41, in part): liveness and readiness probes on the agent
    and the controller (their metrics listener's /healthz), a PodDisruptionBudget and
    spread replicas for the controller, the agent's priority class a value."""
    k = by_kind(chart.render())
    for kind, part in (("DaemonSet", "agent"), ("Deployment", "controller")):
        obj = next(o for o in k[kind] if o["metadata"]["name"].endswith(f"-{part}"))
        spec = obj["spec"]["template"]["spec"]
        (main,) = spec["containers"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert main[probe]["httpGet"] == {"path": "/healthz", "port": "metrics"}, part
    agent = k["DaemonSet"][0]["spec"]["template"]["spec"]
    assert agent["priorityClassName"] == "system-node-critical"
    pdb = next(p for p in k["PodDisruptionBudget"]
               if p["metadata"]["name"].endswith("-controller"))  # fmt: skip
    assert pdb["spec"]["minAvailable"] == 1
    ctl = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-controller"))
    anti = ctl["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"][
        "topologyKey"] == "kubernetes.io/hostname"  # fmt: skip
    k = by_kind(chart.render(set_strings={"agent.priorityClassName": ""},
                             set_values={"controller.replicas": 1}))  # fmt: skip
    assert "priorityClassName" not in k["DaemonSet"][0]["spec"]["template"]["spec"]
    assert not [p for p in k.get("PodDisruptionBudget", [])
                if p["metadata"]["name"].endswith("-controller")]  # fmt: skip


def test_namespace_users_get_the_crds_through_the_built_in_roles():
    """Issue 41: without aggregated roles, a namespace's edit/view users could not use the
    CRDs. The chart's rules join the built-in edit/admin (read-write, never status) and
    view (read-only) roles."""
    roles = {r["metadata"]["name"]: r for r in by_kind(chart.render())["ClusterRole"]}
    edit, view = roles["snap-snapshot-edit"], roles["snap-snapshot-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    (rule,) = edit["rules"]
    assert rule["resources"] == ["podsnapshots", "snapshotjobs"] and "create" in rule["verbs"]
    assert not [r for r in view["rules"] if set(r["verbs"]) - {"get", "list", "watch"}]


def test_two_controller_replicas_elect_a_leader():
    k = by_kind(chart.render())
    deploy = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-controller"))
    assert deploy["spec"]["replicas"] == 2
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert "--leader-elect" in container["args"] and "--lease-duration=15" in container["args"]
    assert {e["name"] for e in container["env"]} == {"POD_NAME", "POD_NAMESPACE"}
    (role,) = [r for r in k["Role"] if r["metadata"]["name"].endswith("-controller-lease")]
    assert role["metadata"]["namespace"] == "snapshot-system"
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "update"]}]  # fmt: skip
    (binding,) = [b for b in k["RoleBinding"] if b["metadata"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"][0]["name"] == deploy["spec"]["template"]["spec"][
        "serviceAccountName"]  # fmt: skip


def test_metrics_services_and_the_service_monitor_toggle():
    k = by_kind(chart.render())
    assert "ServiceMonitor" not in k
    services = {s["metadata"]["name"]: s for s in k["Service"]}
    ctl = services["snap-snapshot-controller-metrics"]
    assert ctl["spec"]["ports"] == [{"name": "metrics", "port": 9401, "targetPort": "metrics"}]
    deploy = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-controller"))
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert "--metrics-port=9401" in container["args"]
    assert container["ports"] == [{"name": "metrics", "containerPort": 9401}]
    assert deploy["spec"]["template"]["metadata"]["labels"].items() >= ctl["spec"][
        "selector"].items()  # fmt: skip

    monitors = by_kind(chart.render(set_values={"metrics.serviceMonitor": "true",
                                                "metrics.serviceMonitorLabels.release": "kp",
                                                "metrics.interval": "15s"}))[
        "ServiceMonitor"]  # fmt: skip
    # all four components are scraped (operations issue: the webhook and the signer never
    # were), with the label a kube-prometheus install selects by
    assert {m["metadata"]["name"] for m in monitors} == {
        "snap-snapshot-controller", "snap-snapshot-agent", "snap-snapshot-webhook",
        "snap-snapshot-signer"}  # fmt: skip
    for m in monitors:
        assert m["metadata"]["labels"]["release"] == "kp"
        (endpoint,) = m["spec"]["endpoints"]
        assert endpoint["interval"] == "15s"
        component = m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
        svc = services.get(f"snap-snapshot-{component}-metrics") or services[
            f"snap-snapshot-{component}"]  # fmt: skip
        assert svc["metadata"]["labels"]["app.kubernetes.io/component"] == component
        port = endpoint["port"]
        assert port in {p["name"] for p in svc["spec"]["ports"]}
        if port == "https":  # checked against the component's own CA, by its Service name
            assert (
                endpoint["tlsConfig"]["serverName"]
                == f"{svc['metadata']['name']}.snapshot-system.svc"
            )


def test_signing_opt_out_is_explicit():
    k = by_kind(chart.render(set_values={"signing.required": "false"}))
    assert all(not d["metadata"]["name"].endswith("-signer") for d in k["Deployment"])
    assert all(not r["metadata"]["name"].endswith("-signer-keeps") for r in k["Role"])
    (init,) = k["DaemonSet"][0]["spec"]["template"]["spec"]["initContainers"]
    assert "--no-signing-required" in init["args"]


def test_existing_tls_secret_instead_of_the_generated_one():
    k = by_kind(chart.render(set_values={"webhook.tls.secretName": "webhook-tls",
                                         "webhook.tls.caBundle": "Q0E="}))  # fmt: skip
    webhook = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-webhook"))
    pod = webhook["spec"]["template"]["spec"]
    assert "--tls-cert=/tls/tls.crt" in pod["containers"][0]["args"]
    assert pod["volumes"][0]["secret"]["secretName"] == "webhook-tls"
    assert "Secret" not in k, "not generated"
    assert all(not r["metadata"]["name"].endswith("-webhook-keeps") for r in k["Role"])
    assert k["MutatingWebhookConfiguration"][0]["webhooks"][0]["clientConfig"]["caBundle"] == "Q0E="


@pytest.mark.parametrize(
    "values, message",
    [
        ({"webhook.tls.secretName": "mine"}, "needs caBundle"),
        ({"webhook.lookupTimeoutSeconds": "10"}, "lookupTimeoutSeconds must be below"),
        ({"storage.type": "oci"}, "storage.oci.repository is required"),
        # values.schema.json (issue 41): each used to render, then fail later or silently
        ({"storage.type": "OCI"}, "/storage/type': value must be one of"),
        ({"webhook.timeoutSeconds": "31"}, "/webhook/timeoutSeconds': maximum: got 31"),
        ({"storage.oci.repository": "reg.example.com/snaps"},
         "/storage/oci/repository': 'reg.example.com/snaps' does not match"),
        ({"controler.replicas": "2"}, "additional properties 'controler' not allowed"),
        ({"agent.maxCheckpoints": "0"}, "/agent/maxCheckpoints': minimum: got 0"),
    ],
)  # fmt: skip
def test_bad_values_fail_with_a_message(values, message):
    with pytest.raises(chart.RenderError, match=message):
        chart.render(set_values=values)


NON_DEFAULT = {"signing.secretName": "snapshot-keys", "agent.installShim": "false",
               "webhook.replicas": "1", "signer.replicas": "1",
               "controller.replicas": "1"}  # fmt: skip
LABELS = {"agent.nodeSelector.pool": "gpu",
          "runtimeClass.nodeSelector.snapshot\\.nvidia\\.com/shim": "true"}  # fmt: skip


@pytest.mark.parametrize("values", [{}, NON_DEFAULT], ids=["defaults", "non-default"])
def test_rendered_objects_match_the_kubernetes_schemas(values):
    """kubernetes-validate's published schemas, strict (no unknown fields), for the newest
    Kubernetes it knows; the API server test above covers the CRDs and admission."""
    import kubernetes_validate

    version = kubernetes_validate.latest_version()
    for o in chart.render(set_values=values, set_strings=LABELS if values else None):
        kubernetes_validate.validate(o, version, strict=True)


def test_signing_and_node_installation():
    k = by_kind(chart.render(set_values=NON_DEFAULT, set_strings=LABELS))
    (agent,) = k["DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    assert "initContainers" not in spec  # installShim=false
    assert "--signer-ca=/signer-ca/ca.crt" in spec["containers"][0]["args"]
    signer = next(d for d in k["Deployment"] if d["metadata"]["name"].endswith("-signer"))
    assert "--key-secret=snapshot-keys" in signer["spec"]["template"]["spec"]["containers"][0][
        "args"]  # fmt: skip
    assert "PodDisruptionBudget" not in k  # one replica of each: nothing to keep available
    (rc,) = k["RuntimeClass"]
    # helm merges maps: the admin's label comes beside the default readiness label
    assert rc["scheduling"]["nodeSelector"] == {
        "snapshot.nvidia.com/shim": "true",
        "snapshot.nvidia.com/ready": "true",
    }

    spec = by_kind(chart.render())["DaemonSet"][0]["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    assert init["command"] == ["snapshot-agent", "install-node"]
    restart = "--restart-command=nsenter --target 1 --mount -- systemctl restart containerd"
    assert restart in init["args"]
    assert spec.get("nodeSelector", {}) == {}, "every node: no GPU feature discovery needed"


OCI = {"storage.type": "oci", "storage.oci.repository": "oci://registry.internal:5000/snaps",
       "storage.oci.pullSecret": "regcred",
       "storage.oci.plainHTTP[0]": "registry.internal:5000"}  # fmt: skip


def test_oci_storage_reaches_the_agent_and_the_shim():
    """The agent pushes with the settings the shim pulls with (install-node writes them into
    the shim's wrapper); the pull secret is mounted read-only, root-only."""
    (agent,) = by_kind(chart.render(set_values=OCI))["DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    shared = ["--oci-plain-http=registry.internal:5000", "--oci-cache-max-gb=200",
              "--oci-auth-file=/oci-auth/.dockerconfigjson"]  # fmt: skip
    (init,), (main,) = spec["initContainers"], spec["containers"]
    assert all(a in init["args"] and a in main["args"] for a in shared)
    assert "--oci-repository=oci://registry.internal:5000/snaps" in main["args"]
    assert "--oci-pre-pull" not in main["args"]  # opt-in
    (agent,) = by_kind(chart.render(set_values={**OCI, "storage.oci.prePull": "true"}))["DaemonSet"]
    assert "--oci-pre-pull" in agent["spec"]["template"]["spec"]["containers"][0]["args"]
    assert {"name": "oci-auth", "secret": {"secretName": "regcred", "defaultMode": 0o400}} in spec[
        "volumes"]  # fmt: skip
    import kubernetes_validate

    for o in chart.render(set_values=OCI):
        kubernetes_validate.validate(o, kubernetes_validate.latest_version(), strict=True)


def test_a_push_secret_stays_in_the_agent_container():
    """Isolation round 2, finding 8: with a push secret, the node (the shim's copy, written
    by install-node onto the host) gets only the pull secret; the push credential is mounted
    in the agent container alone, never copied onto the node."""
    values = {**OCI, "storage.oci.pushSecret": "pushcred"}
    (agent,) = by_kind(chart.render(set_values=values))["DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    (init,), (main,) = spec["initContainers"], spec["containers"]
    assert "--oci-auth-file=/oci-auth/.dockerconfigjson" in init["args"]
    assert "--oci-auth-file=/oci-push/.dockerconfigjson" in main["args"]
    assert not any("/oci-auth/" in a for a in main["args"])
    mounts = {c["name"]: {m["name"] for m in c["volumeMounts"]} for c in (init, main)}
    assert "oci-auth" in mounts["install-shim"] and "oci-push" not in mounts["install-shim"]
    assert "oci-push" in mounts[main["name"]] and "oci-auth" not in mounts[main["name"]]
    assert {"name": "oci-push", "secret": {"secretName": "pushcred", "defaultMode": 0o400}} in spec[
        "volumes"]  # fmt: skip
    import kubernetes_validate

    for o in chart.render(set_values=values):
        kubernetes_validate.validate(o, kubernetes_validate.latest_version(), strict=True)


def test_the_agent_sees_the_hosts_systemd():
    """runc checkpoints a container of the systemd cgroup driver (kubeadm's default, and
    kind's) only where it sees systemd: without /run/systemd, every checkpoint on such a node
    failed with "systemd not running on this host" (found by the kind smoke, which now runs
    that driver). Read-only, and created empty on a host without systemd."""
    (agent,) = by_kind(chart.render())["DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    main = next(c for c in spec["containers"] if c["name"] == "agent")
    assert {"name": "systemd", "mountPath": "/run/systemd", "readOnly": True} in main[
        "volumeMounts"
    ]
    assert {
        "name": "systemd",
        "hostPath": {"path": "/run/systemd", "type": "DirectoryOrCreate"},
    } in spec["volumes"]


def test_the_agent_loads_the_hosts_cuda_driver():
    """The agent's CUDA checkpoint needs libcuda.so.1, which its image lacks (the driver's
    libraries are the node's): it is told where the host's root is, and finds the driver
    there (restore_runtime/cuda/driver.py). Without it, every GPU checkpoint failed with "no
    CUDA driver on this host" (found readying the GPU machine's cluster, issue 43)."""
    (agent,) = by_kind(chart.render())["DaemonSet"]
    spec = agent["spec"]["template"]["spec"]
    main = next(c for c in spec["containers"] if c["name"] == "agent")
    assert spec["hostPID"] is True  # /proc/1 is the host's init
    assert {"name": "SNAPSHOT_HOST_ROOT", "value": "/host"} in main["env"]
    assert {"name": "host", "mountPath": "/host", "readOnly": True} in main["volumeMounts"]
