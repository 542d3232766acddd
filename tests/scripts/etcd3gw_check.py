"""Runs etcd3gw (the OpenStack Python client of etcd's JSON gateway)
against one server and prints what it saw, one JSON object, with nothing
that differs between two servers (ids, revisions, terms, addresses).

Usage: etcd3gw_check.py http://HOST:PORT

The integration test json_gateway.rs runs it against etcd 3.5.1 and the
store and compares the two outputs.
"""

import json
import sys
import threading
import time
from urllib.parse import urlparse

from etcd3gw.client import Etcd3Client

# How long the watch thread may take to see the events, in seconds.
WATCH_TIMEOUT_S = 10


def kv(client, out):
    out["put"] = client.put("gw/a", "1")
    client.put("gw/b", "2")
    client.put("gw/c", "3")
    out["get"] = client.get("gw/a")
    out["get_missing"] = client.get("gw/none")
    prefix = client.get_prefix("gw/")
    out["get_prefix"] = [(v, m["key"], m["version"]) for v, m in prefix]
    out["get_prefix_sorted"] = [
        v for v, _ in client.get_prefix("gw/", sort_order="descend", sort_target="key")
    ]
    out["create_existing"] = client.create("gw/a", "x")
    out["create_new"] = client.create("gw/new", "n")
    out["replace_ok"] = client.replace("gw/a", "1", "11")
    out["replace_stale"] = client.replace("gw/a", "1", "12")
    out["delete"] = client.delete("gw/b")
    out["delete_missing"] = client.delete("gw/b")
    out["delete_prefix"] = client.delete_prefix("gw/")
    out["after_delete"] = [(v, m["key"]) for v, m in client.get_all()]


def lease(client, out):
    lease = client.lease(ttl=60)
    client.put("gw/leased", "v", lease=lease)
    out["lease_ttl_positive"] = lease.ttl() > 0
    out["lease_refresh"] = lease.refresh() > 0
    out["lease_keys"] = [k.decode() if isinstance(k, bytes) else k for k in lease.keys()]
    out["lease_revoke"] = lease.revoke()
    out["leased_after_revoke"] = client.get("gw/leased")


def watch(client, out):
    events, cancel = client.watch("gw/w")
    seen = []

    def consume():
        for event in events:
            seen.append((event.get("type", "PUT"), event["kv"]["key"].decode(),
                         event["kv"].get("value", b"").decode()))
            if len(seen) == 3:
                break

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    time.sleep(1)
    client.put("gw/w", "w1")
    client.put("gw/w", "w2")
    client.delete("gw/w")
    thread.join(WATCH_TIMEOUT_S)
    cancel()
    out["watch"] = seen


def lock(client, out):
    first = client.lock(id="gw-lock", ttl=60)
    second = client.lock(id="gw-lock", ttl=60)
    out["lock_acquire"] = first.acquire()
    out["lock_held"] = first.is_acquired()
    out["lock_second_blocked"] = second.is_acquired()
    out["lock_refresh"] = first.refresh() > 0
    out["lock_release"] = first.release()
    out["lock_second_after"] = second.acquire()
    second.release()


def cluster(client, out):
    members = client.members()
    out["members"] = len(members)
    status = client.status()
    out["status_has_leader"] = "leader" in status


def text(value):
    """`value` with bytes decoded, for printing as JSON."""
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, (list, tuple)):
        return [text(v) for v in value]
    if isinstance(value, dict):
        return {k: text(v) for k, v in value.items()}
    return value


def main():
    url = urlparse(sys.argv[1])
    client = Etcd3Client(host=url.hostname, port=url.port, protocol=url.scheme)
    out = {}
    for step in (kv, lease, watch, lock, cluster):
        step(client, out)
    print(json.dumps(text(out), sort_keys=True))


if __name__ == "__main__":
    main()
