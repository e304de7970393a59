"""The node agent (a DaemonSet): checkpoints the PodSnapshots handed to its node, deletes their
artifacts when they are deleted, and reports restore outcomes of pods on its node."""
