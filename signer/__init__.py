"""The artifact signer: the only holder of the cluster's signing key, off the GPU nodes.
Node agents ask it, over TLS and with their pod-bound service-account tokens, to sign the
manifest of a checkpoint they are making; it signs only for a PodSnapshot handed to the
asking agent's own node, and only a manifest bound to that PodSnapshot (policy.py)."""
