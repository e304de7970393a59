#!/usr/bin/env bash
# kind smoke test, for machines with Docker: a kind cluster, the chart, and the CPU example's
# round trip (SnapshotJob -> PodSnapshot Ready -> a Deployment replica restored, condition
# nvidia.com/Restored=True). `make kind-smoke` runs it; without Docker or kind it says so and
# exits 0 (skipped), as on the development VM, where tests/test_node_flow.py runs the same
# manifests against a real API server and containerd instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
skip() { echo "kind-smoke SKIPPED: $*"; exit 0; }
command -v docker >/dev/null || skip "docker is not installed"
docker info >/dev/null 2>&1 || skip "the docker daemon is not reachable"
command -v kind >/dev/null || skip "kind is not installed (go install sigs.k8s.io/kind@latest)"
command -v kubectl >/dev/null || skip "kubectl is not installed"
HELM=${HELM:-$(command -v helm || echo /var/cache/snapshot-tools/bin/helm)}
[[ -x "$HELM" ]] || skip "helm not found (make tools builds one)"

CLUSTER=${CLUSTER:-snapshot-smoke}
NS=snapshot-system
trap 'kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true' EXIT

docker build -q -t snapshot:smoke .
docker build -q -f examples/cpu_demo/Dockerfile -t snapshot-cpu-demo:0.1 .
kind create cluster --name "$CLUSTER" --wait 120s
kind load docker-image --name "$CLUSTER" snapshot:smoke snapshot-cpu-demo:0.1
"$HELM" install snapshot charts/snapshot -n "$NS" --create-namespace --wait --timeout 5m \
  --set image.repository=snapshot --set image.tag=smoke --set image.pullPolicy=Never \
  --set agent.readyBesideControlPlane=true \
  --set-json 'signer.affinity=null' --set-json 'webhook.affinity=null' \
  --set-json 'controller.affinity=null'
kubectl apply -f examples/cpu_demo/k8s/snapshotjob.yaml
kubectl wait --for=condition=Completed snapjob/cpu-demo --timeout=10m
kubectl get podsnap cpu-demo
kubectl apply -f examples/cpu_demo/k8s/deployment.yaml
kubectl rollout status deploy/cpu-demo --timeout=5m
for pod in $(kubectl get pods -l app=cpu-demo -o name); do
  kubectl wait --for=condition=nvidia.com/Restored "$pod" --timeout=2m
  kubectl get "$pod" -o jsonpath='{.status.conditions[?(@.type=="nvidia.com/Restored")].message}'
  echo
done
echo "kind-smoke PASSED"
