# lanebus — MIT License.
# The Python binding (python/README.md) against the real library: in-memory and
# durable buses, handlers that ack / retry / reject / raise, the DLQ, stats,
# serve(), and the exception of each bad input. Run by `meson test --suite python`.
import json
import threading
import time
import urllib.request

import pytest

import lanebus

WAIT = 10.0  # a hang guard, never a timing assertion


def wait_for(predicate, timeout=WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)  # releases the GIL: handlers run meanwhile
    return predicate()


def test_version():
    assert lanebus.__version__ == lanebus.version()
    assert lanebus.version().count(".") == 2


def test_topic_fan_out_to_groups_in_key_order():
    with lanebus.open(name="py-mem", workers=2) as bus:
        orders = bus.create_topic("shop.orders", lanes=4)
        assert (orders.name, orders.lanes, orders.is_queue, orders.durable) == ("shop.orders", 4, False, False)
        seen = {"billing": [], "audit": []}
        lock = threading.Lock()

        def handler_for(group):
            def handle(m):
                with lock:
                    seen[group].append((m.key, m.payload, m.topic, m.attempt))

            return handle

        billing = bus.subscribe(orders, "billing", handler_for("billing"))
        bus.subscribe(orders, "audit", handler_for("audit"))
        for i in range(200):
            orders.publish(f"order-{i}", key=f"customer-{i % 5}")  # str payload and key: UTF-8
        orders.publish(b"\x00\xffbinary", key=b"raw")
        assert wait_for(lambda: len(seen["billing"]) == 201 and len(seen["audit"]) == 201)
        for group in seen.values():
            for c in range(5):
                mine = [p for k, p, _, _ in group if k == f"customer-{c}".encode()]
                assert mine == [f"order-{i}".encode() for i in range(c, 200, 5)]  # per-key order
            assert (b"raw", b"\x00\xffbinary", "shop.orders", 1) in group
        billing.close()
        assert not billing.active
        billing.close()  # idempotent


def test_headers_and_trace_context_reach_the_handler():
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with lanebus.open(name="py-headers", workers=1) as bus:
        t = bus.create_topic("py.traced")
        seen = []
        bus.subscribe(t, "g", lambda m: seen.append(dict(m.headers)))
        t.publish(b"x", key="k", headers={"traceparent": tp, "tenant": b"acme"})
        t.publish(b"y", key="k")
        assert wait_for(lambda: len(seen) == 2)
        assert seen[0] == {"traceparent": tp.encode(), "tenant": b"acme"}
        assert seen[1] == {}
        try:
            t.publish(b"z", headers={"traceparent": "00-zz"})
            assert False, "a malformed traceparent must raise"
        except lanebus.Error as e:
            assert e.code == "InvalidArgument" and "traceparent" in str(e)


def test_retry_then_ack_and_exceptions_are_retries_not_crashes():
    with lanebus.open(workers=1) as bus:
        jobs = bus.create_queue("jobs", lanes=1)
        attempts = []

        def flaky(m):
            attempts.append((m.payload, m.attempt))
            if m.payload == b"raise" and m.attempt == 1:
                raise ValueError("boom")
            if m.payload == b"retry" and m.attempt < 3:
                return lanebus.retry("not yet")
            return lanebus.ack() if m.attempt % 2 else None

        bus.consume(jobs, flaky, max_attempts=3)
        jobs.publish("raise")
        jobs.publish("retry")
        assert wait_for(lambda: len(attempts) == 5)
        assert attempts == [(b"raise", 1), (b"raise", 2), (b"retry", 1), (b"retry", 2), (b"retry", 3)]
        stats = bus.stats()
        [topic] = [t for t in stats["topics"] if t["name"] == "jobs"]
        assert topic["published"] == 2
        assert json.loads(bus.stats_json())["topics"][0]["name"] == "jobs"


def test_durable_store_dlq_list_and_replay(tmp_path):
    store = str(tmp_path / "store")
    fixed = threading.Event()
    handled = []

    def payments(m):
        if m.payload == b"bad" and not fixed.is_set():
            return lanebus.reject("card declined")
        if m.payload == b"flaky" and not fixed.is_set():
            raise RuntimeError("gateway down")
        handled.append(m.payload)

    with lanebus.open(store, name="py-durable", workers=2) as bus:
        q = bus.create_queue("payments", lanes=2, durable=True)
        assert q.durable and q.is_queue
        sub = bus.consume(q, payments, max_attempts=2)
        for p in ("ok-1", "bad", "flaky", "ok-2"):
            q.publish(p, key=p, idempotency_key="id-" + p, headers={"tenant": "acme"} if p == "bad" else None)
        assert wait_for(lambda: len(bus.dead_letters()) == 2 and len(handled) == 2)
        entries = {e.payload: e for e in bus.dead_letters()}
        bad, flaky = entries[b"bad"], entries[b"flaky"]
        assert (bad.error_class, bad.state, bad.reason, bad.topic) == ("permanent", "pending", "card declined", "payments")
        assert flaky.error_class == "transient" and flaky.reason.startswith("exception: RuntimeError: gateway down")
        assert flaky.attempts == 2 and bad.key == b"bad"
        assert bad.headers == {"tenant": b"acme"} and flaky.headers == {}
        assert [e.id for e in bus.dead_letters(state="pending", topic="payments")] == sorted([bad.id, flaky.id])
        assert bus.dead_letters(topic="elsewhere") == []
        fixed.set()
        assert bus.replay([bad.id, flaky.id], operator="pytest") == 2
        assert wait_for(lambda: sorted(handled) == [b"bad", b"flaky", b"ok-1", b"ok-2"])
        assert {e.state for e in bus.dead_letters()} == {"replayed"}
        with pytest.raises(lanebus.Error) as err:
            bus.replay([bad.id])  # already replayed
        assert err.value.code == "Conflict"
        sub.close()
        q.publish("kept")  # no consumer: stays in the store
    # The store keeps it across close and reopen.
    got = []
    with lanebus.open(store, workers=1) as bus:
        q = bus.create_queue("payments", lanes=2, durable=True)
        bus.consume(q, lambda m: got.append(m.payload))
        assert wait_for(lambda: got == [b"kept"])


def test_serve_exposes_metrics():
    with lanebus.open(name="py-served", workers=1) as bus:
        t = bus.create_topic("served.events", lanes=2)
        bus.subscribe(t, "g", lambda m: None)
        t.publish("hello")
        with bus.serve(listen="127.0.0.1:0", sample_interval=0.05) as server:
            assert server.port > 0 and server.url == f"http://127.0.0.1:{server.port}/"

            def scraped():
                body = urllib.request.urlopen(server.url + "metrics", timeout=5).read().decode()
                return 'lanebus_published_total{topic="served.events"} 1' in body

            assert wait_for(scraped)
            health = urllib.request.urlopen(server.url + "healthz", timeout=5)
            assert health.status == 200


def test_handler_can_publish_and_close_waits_for_it():
    with lanebus.open(workers=2) as bus:
        src = bus.create_topic("chain.in", lanes=1)
        dst = bus.create_topic("chain.out", lanes=1)
        out = []
        bus.subscribe(dst, "sink", lambda m: out.append(m.payload))
        bus.subscribe(src, "relay", lambda m: dst.publish(m.payload.upper()))
        for word in ("a", "b", "c"):
            src.publish(word)
        assert wait_for(lambda: out == [b"A", b"B", b"C"])


def test_bad_inputs_raise_clear_exceptions(tmp_path):
    with lanebus.open(workers=1) as bus:
        with pytest.raises(lanebus.Error, match="InvalidName") as err:
            bus.create_topic("bad name!")
        assert err.value.code == "InvalidName"
        with pytest.raises(lanebus.Error, match="InvalidArgument") as err:
            bus.create_topic("t.lanes", lanes=0)
        with pytest.raises(lanebus.Error) as err:
            bus.create_topic("t.durable", durable=True)  # an in-memory bus has no store
        assert err.value.code == "InvalidArgument"
        t = bus.create_topic("t.ok", lanes=2)
        with pytest.raises(lanebus.Error, match="Conflict"):
            bus.create_topic("t.ok", lanes=3)
        with pytest.raises(lanebus.Error, match="Conflict"):
            bus.create_queue("t.ok", lanes=2)
        with pytest.raises(lanebus.Error) as err:
            bus.find("t.missing")
        assert err.value.code == "NotFound"
        with pytest.raises(lanebus.Error) as err:
            t.publish(b"")
        assert err.value.code == "InvalidArgument" and "payload is empty" in str(err.value)
        with pytest.raises(TypeError, match="payload must be bytes or str"):
            t.publish(42)
        with pytest.raises(TypeError, match="key must be bytes or str"):
            t.publish("x", key=3.5)
        with pytest.raises(lanebus.Error) as err:
            t.publish("x" * (2 << 20))
        assert err.value.code == "PayloadTooLarge"
        with pytest.raises(TypeError, match="callable"):
            bus.subscribe(t, "g", "not a function")
        with pytest.raises(lanebus.Error, match="InvalidName"):
            bus.subscribe(t, "bad group!", lambda m: None)
        with pytest.raises(lanebus.Error, match="max_attempts"):
            bus.subscribe(t, "g", lambda m: None, max_attempts=0)
        with pytest.raises(lanebus.Error, match="start must be"):
            bus.subscribe(t, "g", lambda m: None, start="middle")
        with pytest.raises(lanebus.Error, match="is a topic"):
            bus.consume(t, lambda m: None)  # a topic, not a queue
        with pytest.raises(lanebus.Error) as err:
            bus.dead_letters()  # an in-memory bus has no DLQ
        assert err.value.code == "InvalidArgument"
        with pytest.raises(lanebus.Error, match="Busy|InvalidArgument"):
            bus.serve(listen="not-an-address")
        other = lanebus.open(workers=1)
        with pytest.raises(lanebus.Error, match="another bus"):
            other.subscribe(t, "g", lambda m: None)
        other.close()
    with pytest.raises(lanebus.Error) as err:
        t.publish("after close")
    assert err.value.code == "ShutDown"
    with pytest.raises(lanebus.Error, match="closed"):
        bus.create_topic("late")
    with pytest.raises(lanebus.Error, match="durability"):
        lanebus.open(str(tmp_path / "s"), durability="maybe")
    with pytest.raises(lanebus.Error, match="directory must not be empty"):
        lanebus.open("")
    with pytest.raises(lanebus.Error) as err:
        lanebus.open(str(tmp_path / "no" / "such" / "parent"))
    assert err.value.code in ("IOError", "NotFound", "PermissionDenied")
    with lanebus.open(str(tmp_path / "d"), workers=1) as bus:
        with pytest.raises(lanebus.Error, match="state must be"):
            bus.dead_letters(state="lost")
        with pytest.raises(lanebus.Error) as err:
            bus.replay([12345])
        assert err.value.code == "NotFound"
    assert isinstance(err.value, Exception) and issubclass(lanebus.Error, Exception)


def test_a_handler_returning_garbage_is_rejected_not_a_crash():
    with lanebus.open(workers=1) as bus:
        t = bus.create_topic("garbage", lanes=1)
        calls = []

        def handle(m):
            calls.append(m.attempt)
            return 42

        bus.subscribe(t, "g", handle, max_attempts=3)
        t.publish("x")
        assert wait_for(lambda: any(g["name"] == "g" and g["totals"]["rejected"] == 1
                                    for tp in bus.stats()["topics"] for g in tp["groups"]))
        assert calls == [1]  # a reject is not retried


def test_unclosed_bus_is_closed_at_exit(tmp_path):
    # A bus (with a live handler) that the program never closes: the atexit
    # hook closes it before the interpreter goes away (no hang, no crash).
    import subprocess
    import sys
    import os

    code = (
        "import lanebus\n"
        "bus = lanebus.open(workers=2)\n"
        "t = bus.create_topic('exit.t', lanes=2)\n"
        "bus.subscribe(t, 'g', lambda m: None)\n"
        "for i in range(1000): t.publish(str(i), key=str(i))\n"
        "print('done')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=os.environ)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done"


def test_close_releases_the_gil_while_it_waits_for_handlers():
    # Subscription.close() and Bus.close() wait for running handler calls;
    # those calls need the GIL to finish, so the waits must release it (held,
    # this test would deadlock and hit meson's timeout).
    with lanebus.open(workers=2) as bus:
        t = bus.create_topic("gil.t", lanes=2)
        started = threading.Event()
        finished = []

        def slow(m):
            started.set()
            time.sleep(0.2)  # gives the GIL away; taking it back needs close() to have released it
            finished.append(m.payload)

        sub = bus.subscribe(t, "g", slow)
        t.publish("one", key="a")
        assert started.wait(WAIT)
        sub.close()  # waits for the running call
        assert finished == [b"one"]
        started.clear()
        bus.subscribe(t, "g2", slow)
        for i in range(3):
            t.publish(str(i), key=str(i))
        assert started.wait(WAIT)
    # `with` exit drained the backlog: every call finished.
    assert sorted(finished) == [b"0", b"1", b"2", b"one"]
