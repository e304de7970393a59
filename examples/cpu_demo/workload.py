"""CPU demo workload: a real model served over TCP, with a cold start worth skipping.

At start it imports scikit-learn, loads the handwritten-digits data set that ships inside the
package (nothing is downloaded) and trains a random forest, as a server loads and warms a
model. Each connection gets ``digest=<sha256 of the predicted probabilities for a fixed
batch> count=<requests served>``: a restored replica is correct when the digest equals the
source's. It answers the snapshot handshake when SNAPSHOT_CONTROL_DIR is set.

    python -m examples.cpu_demo.workload HOST PORT [digits|large]

``large`` trains a bigger forest on a synthetic data set (scikit-learn's make_classification,
generated at start): a longer cold start and a bigger checkpoint, for the benchmark.
"""

from __future__ import annotations

import contextlib
import hashlib
import socket
import sys
import threading
import time


def train(kind: str):
    from sklearn.ensemble import RandomForestClassifier

    if kind == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        n_trees = 400
    elif kind == "large":
        from sklearn.datasets import make_classification

        x, y = make_classification(
            n_samples=60_000, n_features=30, n_informative=15, n_classes=4, random_state=0
        )
        n_trees = 120
    else:
        raise SystemExit(f"unknown model {kind!r}: digits or large")
    return RandomForestClassifier(n_estimators=n_trees, random_state=0, n_jobs=1).fit(x, y), x


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    kind = sys.argv[3] if len(sys.argv) > 3 else "digits"
    t0 = time.monotonic()
    import pickle

    from restore_runtime.workload import Handshake

    model, x = train(kind)
    weights = len(pickle.dumps(model))  # the model's size, as "weights" in the benchmark table
    batch = x[:64]
    count = 0
    lock = threading.Lock()
    print(f"model ready in {time.monotonic() - t0:.2f}s", flush=True)

    hs = Handshake()
    if hs.enabled:

        def quiesce() -> dict:
            lock.acquire()
            return {"served": count}

        def resume(info) -> None:
            print(f"resumed mode={info.mode} podIP={info.pod_ip}", flush=True)
            lock.release()

        hs.serve_in_background(quiesce, resume)

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    while True:
        conn, _ = srv.accept()
        with lock, conn:
            count += 1
            digest = hashlib.sha256(model.predict_proba(batch).tobytes()).hexdigest()[:16]
            # a client may be gone by now (a TCP readiness probe connects and closes at once)
            with contextlib.suppress(OSError):
                conn.sendall(f"digest={digest} count={count} weights={weights}\n".encode())


if __name__ == "__main__":
    main()
