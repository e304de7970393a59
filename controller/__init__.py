"""PodSnapshot and SnapshotJob reconcilers: pure decisions (snapshots.py, jobs.py) over typed
objects, and a thin loop (loop.py) that reads the cluster and applies them."""
