"""What the control-plane components (webhook, controller, node agent) share about
Kubernetes: the one client module (``api``, the only importer of kubernetes-asyncio) and
pod-spec edits (``podspec``). The engine and the shim never import it."""
