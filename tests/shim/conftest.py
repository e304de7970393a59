"""The containerd fixtures live in tests/conftest.py (the node-flow tests share them)."""
