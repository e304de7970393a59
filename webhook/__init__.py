"""Mutating admission webhook: rewrites pods annotated nvidia.com/restore-from to restore from
their PodSnapshot under the snapshot RuntimeClass."""
