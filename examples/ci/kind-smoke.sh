#!/usr/bin/env bash
# The kind smoke for your CI (examples/ci/kind-smoke.yml runs it on GitHub's runners): the
# public kindest/node, the chart, and the CPU example's story (SnapshotJob -> PodSnapshot
# Ready -> two Deployment replicas restored, condition nvidia.com/Restored=True). Needs
# docker, kind, kubectl and helm on PATH; run from the repository root.
#
# On a cgroup v1 host (older distributions), Kubernetes 1.35 and later refuse to start the
# kubelet unless KubeletConfiguration.failCgroupV1 is false; KIND_CONFIG below passes it.
# This repository's own suite runs the same story without Docker Hub: tests/test_kind_smoke.py.
set -euo pipefail
CLUSTER=${CLUSTER:-snapshot-smoke}
NS=snapshot-system
IMAGE=${IMAGE:-snapshot:smoke}
DEMO=${DEMO:-snapshot-cpu-demo:0.1}
KIND_CONFIG=$(mktemp)
trap 'kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; rm -f "$KIND_CONFIG"' EXIT
cat > "$KIND_CONFIG" <<'YAML'
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
kubeadmConfigPatches:
  - |
    kind: KubeletConfiguration
    failCgroupV1: false
YAML

docker build -q -t "$IMAGE" .
docker build -q -f examples/cpu_demo/Dockerfile -t "$DEMO" .
kind create cluster --name "$CLUSTER" --config "$KIND_CONFIG" ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"} --wait 180s
kind load docker-image --name "$CLUSTER" "$IMAGE" "$DEMO"
# one node: the control plane's components run beside the restore pods
helm install snapshot charts/snapshot -n "$NS" --create-namespace --wait --timeout 5m \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set agent.readyBesideControlPlane=true \
  --set-json 'signer.affinity=null' --set-json 'webhook.affinity=null' \
  --set-json 'controller.affinity=null'
kubectl wait --for=condition=Ready pods --all -n "$NS" --timeout=3m
kubectl create namespace demo
sed "s|snapshot-cpu-demo:0.1|$DEMO|" examples/cpu_demo/k8s/snapshotjob.yaml | kubectl -n demo apply -f -
kubectl -n demo wait --for=create podsnapshot/cpu-demo --timeout=5m
kubectl -n demo wait --for=condition=Ready podsnapshot/cpu-demo --timeout=10m
kubectl -n demo get podsnap cpu-demo
sed "s|snapshot-cpu-demo:0.1|$DEMO|" examples/cpu_demo/k8s/deployment.yaml | kubectl -n demo apply -f -
kubectl -n demo rollout status deploy/cpu-demo --timeout=5m
for pod in $(kubectl -n demo get pods -l app=cpu-demo,pod-template-hash -o name); do
  kubectl -n demo wait --for=condition=nvidia.com/Restored "$pod" --timeout=2m
  kubectl -n demo get "$pod" -o jsonpath='{.status.conditions[?(@.type=="nvidia.com/Restored")].message}'
  echo
done
echo "kind-smoke PASSED"
