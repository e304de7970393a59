"""What the control-plane components (webhook, controller, signer, node agent) share about
Kubernetes: the client (``api``; kubernetes-asyncio is imported only under the components
and here), the controller runtime (``watch``, ``workqueue``, ``leader``), and the
self-signed serving certificates of the webhook and the signer (``certs``). The engine and
the shim never import it; pod-spec edits, a contract between the webhook, the controller and
the agent, are in ``api/podspec.py``."""
