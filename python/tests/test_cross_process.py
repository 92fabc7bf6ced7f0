# lanebus — MIT License.
# A C++ process (python/tests/fill_queue.cpp) fills a durable queue while a
# Python consumer in this process reads the same LMDB store: every message
# arrives, and each is acked once (none is left for a second consumer).
import os
import subprocess
import threading

import lanebus

N = 1000
LANES = 4


def lane_for_key(key, lanes):
    # lanebus::lane_for_key: 64-bit FNV-1a of the key bytes, modulo lanes.
    h = 14695981039346656037
    for b in key:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h % lanes


def test_python_consumes_what_a_cpp_process_publishes(tmp_path):
    filler = os.environ["LANEBUS_FILL_QUEUE"]
    store = str(tmp_path / "store")
    got = []
    lock = threading.Lock()
    all_in = threading.Event()

    def handle(m):
        with lock:
            got.append(m.payload.decode())
            if len(set(got)) == N:
                all_in.set()

    # Create the queue here first, so the consumer is in place before the
    # producer starts; the producer then appends from its own process.
    with lanebus.open(store, name="py-consumer", workers=2) as bus:
        q = bus.create_queue("orders.cross", lanes=LANES, durable=True)
        bus.consume(q, handle)
        producer = subprocess.run([filler, store, "orders.cross", str(N)], capture_output=True, text=True,
                                  timeout=60)
        assert producer.returncode == 0, producer.stderr
        assert producer.stdout.strip() == f"published {N}"
        assert all_in.wait(30), f"{len(set(got))} of {N} arrived"
    assert sorted(set(got)) == sorted(f"msg-{i}" for i in range(N))
    # Per key (k<i % 16>), the producer's order.
    for k in range(16):
        mine = [int(p[4:]) for p in got if int(p[4:]) % 16 == k]
        assert mine == sorted(mine)
    # Acked: a second consumer on the store finds nothing left. Lanes are
    # FIFO, so a sentinel published now into each lane comes after anything
    # left there; the sentinels alone arrive.
    again = []
    sentinels = {}
    for k in range(1000):
        sentinels.setdefault(lane_for_key(f"end-{k}".encode(), LANES), f"end-{k}")
        if len(sentinels) == LANES:
            break
    lock = threading.Lock()
    ends = threading.Event()

    def second(m):
        with lock:
            again.append((m.lane, m.payload.decode()))
            if sum(p.startswith("end-") for _, p in again) == LANES:
                ends.set()

    with lanebus.open(store, workers=1) as bus:
        q = bus.create_queue("orders.cross", lanes=LANES, durable=True)
        bus.consume(q, second)
        for key in sentinels.values():
            q.publish(key, key=key)
        assert ends.wait(30)
    assert sorted(again) == sorted(sentinels.items())  # and each came in the lane lane_for_key names
