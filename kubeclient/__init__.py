"""What the control-plane components (webhook, controller, node agent) share about
Kubernetes: the client (``api``; kubernetes-asyncio is imported only under ``agent/``,
``controller/``, ``webhook/`` and here) and pod-spec edits (``podspec``). The engine and
the shim never import it."""
