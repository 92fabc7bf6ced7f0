# lanebus — MIT License.
# The Python binding in one page: a durable order queue whose consumer is a
# Python function. A bad order is rejected to the dead-letter queue, a flaky
# one raises (a retry, then the DLQ), both are replayed once "fixed"; stats
# come back as a dict. Run: PYTHONPATH=build/python /usr/bin/python3 python/examples/orders.py
import tempfile
import threading

import lanebus

fixed = threading.Event()
done = []
all_done = threading.Event()


def ship(order):
    text = order.payload.decode()
    if text == "order-bad" and not fixed.is_set():
        return lanebus.reject("no such product")  # permanent: to the DLQ at once
    if text == "order-flaky" and not fixed.is_set():
        raise ConnectionError("carrier API down")  # transient: retried, then to the DLQ
    done.append(text)
    print(f"  shipped {text} (customer {order.key.decode()}, attempt {order.attempt})")
    if len(done) == 4:
        all_done.set()
    return None  # ack (lanebus.ack() works too)


with tempfile.TemporaryDirectory() as tmp:
    with lanebus.open(tmp + "/store", name="shop") as bus:
        orders = bus.create_queue("shop.orders", lanes=4, durable=True)
        bus.consume(orders, ship, max_attempts=2)
        for name in ("order-1", "order-bad", "order-flaky", "order-2"):
            orders.publish(name, key="customer-" + name[-1])  # fsynced before it returns
        while len(bus.dead_letters(state="pending")) < 2 or len(done) < 2:
            threading.Event().wait(0.01)
        for entry in bus.dead_letters():
            print(f"  DLQ #{entry.id}: {entry.payload.decode()} {entry.error_class}: {entry.reason}")
        fixed.set()
        print(f"  replayed {bus.replay([e.id for e in bus.dead_letters(state='pending')])}")
        all_done.wait(10)
        stats = bus.stats()
        [queue] = [t for t in stats["topics"] if t["name"] == "shop.orders"]
        print(f"  published {queue['published']}, shipped {len(done)}")
        assert sorted(done) == ["order-1", "order-2", "order-bad", "order-flaky"]
print("orders.py: ok")
