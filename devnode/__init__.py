"""A private containerd node on this machine (containerd + CRI + CNI bridge + our shim),
for the demo and the integration tests. Nothing here is part of the product."""
