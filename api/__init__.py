"""The contracts every component shares, defined once and parsed in one place each: CRD
models, annotations, the artifact's manifest and memory index, handshake files, the restore
report, the containerd runtime table and the node's settings. Imports nothing of ours
(tests/test_layering.py), so the webhook, the controller and kubeclient need no engine."""
