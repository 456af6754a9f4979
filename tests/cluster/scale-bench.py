#!/usr/bin/env python3
"""tests/cluster/scale-bench.py: the API side of tests/cluster/scale-bench (Python standard library
only). Talks to the test cluster's API server as its admin (client certificate of DIR/pki), with a
deadline on every request and every wait.

  scale-bench.py --dir DIR create [--parallel P] FILE
      POST each line of FILE ({"path": COLLECTION, "body": OBJECT}); any answer but 201 fails.
  scale-bench.py --dir DIR wait-count PATH --want N [--phase P] --timeout S --what TEXT
      until exactly N objects of the list PATH (query allowed) are there (in status.phase P).
  scale-bench.py --dir DIR strip-delete PATH
      remove the finalizers of every object of the list PATH, then delete the collection.
  scale-bench.py --dir DIR burst --file F --watch PATH --want N --timeout S --what TEXT
          --pids NAME=PID,... --out JSON
      watch PATH, create F (as `create`), until N objects of PATH are Bound; writes the seconds
      and the CPU seconds of each PID (and of the whole machine) over that span to JSON.
  scale-bench.py --dir DIR delete-burst --collection PATH --watch PATH --roots DIR,... --timeout S
          --what TEXT --pids NAME=PID,... --out JSON
      delete the collection PATH, until the list PATH (watched) is empty and the roots hold
      nothing but .flexvol (and nothing under .flexvol/volumes); writes seconds and CPU to JSON.
  scale-bench.py table RESULTS-JSONL
      the final table.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import ssl
import sys
import threading
import time
import urllib.parse

REQUEST_TIMEOUT = 30  # seconds, every request but a watch
CLK_TCK = os.sysconf("SC_CLK_TCK")


class ApiError(Exception):
    pass


def die(msg):
    print(f"scale-bench: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


class Api:
    def __init__(self, cluster_dir, port):
        pki = os.path.join(cluster_dir, "pki")
        self.ctx = ssl.create_default_context(cafile=os.path.join(pki, "ca.crt"))
        self.ctx.load_cert_chain(os.path.join(pki, "admin.crt"), os.path.join(pki, "admin.key"))
        self.port = port
        self.local = threading.local()

    def conn(self, timeout=REQUEST_TIMEOUT, fresh=False):
        if fresh:
            return http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=timeout)
        c = getattr(self.local, "conn", None)
        if c is None:
            c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=timeout)
            self.local.conn = c
        return c

    def request(self, method, path, body=None, content_type="application/json", deadline=None):
        """(status, parsed body). Retries connection errors, 429 and 5xx until the deadline."""
        deadline = deadline or time.monotonic() + 120
        data = None if body is None else json.dumps(body).encode()
        last = ""
        while True:
            c = self.conn()
            try:
                headers = {"Accept": "application/json"}
                if data is not None:
                    headers["Content-Type"] = content_type
                c.request(method, path, body=data, headers=headers)
                r = c.getresponse()
                raw = r.read()
                if r.status == 429 or r.status >= 500:
                    last = f"{r.status} {raw[:300]!r}"
                else:
                    try:
                        return r.status, json.loads(raw) if raw else None
                    except ValueError:
                        return r.status, raw.decode(errors="replace")
            except (OSError, http.client.HTTPException) as e:
                last = f"{type(e).__name__}: {e}"
                c.close()
                self.local.conn = None
            if time.monotonic() > deadline:
                raise ApiError(f"{method} {path}: no answer but {last} until the deadline")
            time.sleep(0.5)


def read_lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def create_all(api, items, parallel):
    deadline = time.monotonic() + 120 + len(items) * 0.5

    def one(it):
        st, body = api.request("POST", it["path"], it["body"], deadline=deadline)
        if st != 201:
            name = it["body"].get("metadata", {}).get("name")
            msg = body.get("message") if isinstance(body, dict) else body
            return f"create {it['path']} {name}: HTTP {st}: {msg}"
        return None

    with concurrent.futures.ThreadPoolExecutor(max_workers=parallel) as ex:
        errors = [e for e in ex.map(one, items) if e]
    if errors:
        die(f"{len(errors)} of {len(items)} creates failed, first: {errors[0]}")


def list_items(api, path):
    st, body = api.request("GET", path)
    if st != 200:
        raise ApiError(f"list {path}: HTTP {st}: {body}")
    return body


def phase_of(obj):
    return (obj.get("status") or {}).get("phase") or "(none)"


class Tracker:
    """A list+watch of PATH: name -> phase, with a condition to wait on. Relists when the watch ends."""

    def __init__(self, api, path):
        self.api, self.path = api, path
        self.objs = {}
        self.cond = threading.Condition()
        self.error = None
        self.synced = threading.Event()
        t = threading.Thread(target=self.run, daemon=True)
        t.start()

    def run(self):
        while True:
            try:
                body = list_items(self.api, self.path)
                with self.cond:
                    self.objs = {o["metadata"]["name"]: phase_of(o) for o in body["items"]}
                    self.cond.notify_all()
                self.synced.set()
                self.watch(body["metadata"]["resourceVersion"])
            except (OSError, http.client.HTTPException, ValueError, KeyError, ApiError) as e:
                self.error = f"{type(e).__name__}: {e}"
                time.sleep(0.5)

    def watch(self, rv):
        sep = "&" if "?" in self.path else "?"
        q = urllib.parse.urlencode({"watch": "1", "resourceVersion": rv, "timeoutSeconds": "240",
                                    "allowWatchBookmarks": "false"})
        c = self.api.conn(timeout=300, fresh=True)
        try:
            c.request("GET", f"{self.path}{sep}{q}", headers={"Accept": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                raise http.client.HTTPException(f"watch {self.path}: HTTP {r.status}: {r.read()[:300]!r}")
            while True:
                line = r.readline()
                if not line:
                    return  # the server ended the watch: relist
                ev = json.loads(line)
                typ, obj = ev.get("type"), ev.get("object") or {}
                if typ == "ERROR":
                    return  # e.g. 410 Gone: relist
                name = (obj.get("metadata") or {}).get("name")
                with self.cond:
                    if typ == "DELETED":
                        self.objs.pop(name, None)
                    elif typ in ("ADDED", "MODIFIED"):
                        self.objs[name] = phase_of(obj)
                    self.cond.notify_all()
        finally:
            c.close()

    def summary(self):
        with self.cond:
            counts = {}
            for p in self.objs.values():
                counts[p] = counts.get(p, 0) + 1
        return ", ".join(f"{n} {p}" for p, n in sorted(counts.items())) or "none"

    def wait(self, pred, timeout, what, extra=None):
        """Until pred(objs) (and extra(), polled, when given); returns the monotonic time it held."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                if pred(self.objs) and (extra is None or extra()):
                    return time.monotonic()
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(min(left, 0.2 if extra else 1.0))
        more = f"; last watch error: {self.error}" if self.error else ""
        die(f"timed out after {timeout:.0f} s waiting for {what}: now {self.summary()} of {self.path}{more}")


def cpu_of(pid):
    """utime+stime (+ waited-for children) of PID in seconds, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is field 3 (state): utime is field 14, stime 15, cutime 16, cstime 17.
    return sum(int(x) for x in fields[11:15]) / CLK_TCK


def machine_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return (sum(v[:8]) - idle) / CLK_TCK


def parse_pids(s):
    out = {}
    for kv in filter(None, (s or "").split(",")):
        k, v = kv.split("=", 1)
        out[k] = int(v)
    return out


def cpu_snapshot(pids):
    snap = {k: cpu_of(p) for k, p in pids.items()}
    gone = [k for k, v in snap.items() if v is None]
    if gone:
        die(f"not running any more: {', '.join(gone)}")
    own = os.times()
    return snap, machine_busy(), own.user + own.system, os.getloadavg()[0]


def cpu_delta(pids, before):
    """CPU seconds of each PID since `before`; of the provisioner instances together; of the
    machine; and of every other process (the machine's less ours: how contended the run was)."""
    snap0, busy0, own0, load0 = before
    snap1, busy1, own1, load1 = cpu_snapshot(pids)
    cpu = {k: snap1[k] - snap0[k] for k in pids}
    busy = busy1 - busy0
    return {
        "cpu": {k: round(v, 2) for k, v in cpu.items()},
        "cpu_instances": round(sum(v for k, v in cpu.items() if k.startswith("provisioner-")), 2),
        "machine_busy": round(busy, 2),
        "others": round(max(0.0, busy - sum(cpu.values()) - (own1 - own0)), 2),
        "load_before": round(load0, 2),
        "load_after": round(load1, 2),
    }


def cmd_burst(api, a):
    items = read_lines(a.file)
    pids = parse_pids(a.pids)
    tr = Tracker(api, a.watch)
    if not tr.synced.wait(60):
        die(f"could not list {a.watch} within 60 s: {tr.error}")
    before = cpu_snapshot(pids)
    t0 = time.monotonic()
    create_all(api, items, a.parallel)
    t_created = time.monotonic()
    t1 = tr.wait(lambda o: sum(1 for p in o.values() if p == "Bound") >= a.want, a.timeout, a.what)
    res = {"seconds": round(t1 - t0, 2), "create_seconds": round(t_created - t0, 2)}
    res.update(cpu_delta(pids, before))
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(f"{a.what}: {res['seconds']} s (created in {res['create_seconds']} s)", file=sys.stderr)


def root_clean(roots):
    for r in roots:
        for e in os.listdir(r):
            if e != ".flexvol":
                return False
        vols = os.path.join(r, ".flexvol", "volumes")
        if os.path.isdir(vols) and os.listdir(vols):
            return False
    return True


def root_leftovers(roots):
    left = []
    for r in roots:
        left += [os.path.join(r, e) for e in os.listdir(r) if e != ".flexvol"]
        vols = os.path.join(r, ".flexvol", "volumes")
        if os.path.isdir(vols):
            left += [os.path.join(vols, e) for e in os.listdir(vols)]
    return left


def cmd_delete_burst(api, a):
    pids = parse_pids(a.pids)
    roots = [r for r in a.roots.split(",") if r]
    tr = Tracker(api, a.watch)
    if not tr.synced.wait(60):
        die(f"could not list {a.watch} within 60 s: {tr.error}")
    before = cpu_snapshot(pids)
    t0 = time.monotonic()
    st, body = api.request("DELETE", a.collection)
    if st != 200:
        die(f"delete {a.collection}: HTTP {st}: {body}")
    try:
        t1 = tr.wait(lambda o: not o, a.timeout, a.what, extra=lambda: root_clean(roots))
    except SystemExit:
        left = root_leftovers(roots)
        print(f"scale-bench: left on disk: {len(left)} entries, e.g. {left[:3]}", file=sys.stderr)
        raise
    res = {"seconds": round(t1 - t0, 2)}
    res.update(cpu_delta(pids, before))
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(f"{a.what}: {res['seconds']} s", file=sys.stderr)


def cmd_wait_count(api, a):
    tr = Tracker(api, a.path)
    if a.phase:
        pred = lambda o: sum(1 for p in o.values() if p == a.phase) == a.want  # noqa: E731
    else:
        pred = lambda o: len(o) == a.want  # noqa: E731
    t0 = time.monotonic()
    t1 = tr.wait(pred, a.timeout, a.what)
    print(f"{a.what}: {t1 - t0:.1f} s", file=sys.stderr)


def cmd_strip_delete(api, a):
    body = list_items(api, a.path)
    base = a.path.split("?", 1)[0]
    deadline = time.monotonic() + 300

    def one(o):
        if not o["metadata"].get("finalizers"):
            return None
        st, b = api.request("PATCH", f"{base}/{o['metadata']['name']}", {"metadata": {"finalizers": None}},
                            content_type="application/merge-patch+json", deadline=deadline)
        return None if st in (200, 404) else f"unset finalizers of {o['metadata']['name']}: HTTP {st}: {b}"

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as ex:
        errors = [e for e in ex.map(one, body["items"]) if e]
    if errors:
        die(errors[0])
    st, b = api.request("DELETE", a.path)
    if st != 200:
        die(f"delete {a.path}: HTTP {st}: {b}")


def fmt(v, unit="", digits=1):
    if v is None:
        return "-"
    return f"{v:.{digits}f}{unit}"


def cmd_table(a):
    rows = read_lines(a.results)
    if not rows:
        die(f"no results in {a.results}")
    head = ["", *[f"{r['nodes']} nodes, {r['claims']:,} claims" for r in rows], "target"]
    mib = 1024 * 1024
    lines = [
        ("claims -> Bound, static PVs (control plane alone)", [fmt(r["static"]["seconds"], " s") for r in rows], ""),
        ("claims -> Bound through the provisioner", [fmt(r["prov"]["seconds"], " s") for r in rows], ""),
        ("ratio provisioner / static", [fmt(r["prov"]["seconds"] / r["static"]["seconds"], "x", 2) for r in rows],
         "<= 1.1x"),
        ("CPU of all instances over the burst", [fmt(r["prov"]["cpu_instances"], " s") for r in rows], ""),
        ("  per provisioned claim", [fmt(1000 * r["prov"]["cpu_instances"] / r["claims"], " ms") for r in rows],
         "<= 10 ms, flat"),
        ("CPU of kube-apiserver, static burst", [fmt(r["static"]["cpu"]["kube-apiserver"], " s") for r in rows], ""),
        ("CPU of kube-apiserver, provisioner burst", [fmt(r["prov"]["cpu"]["kube-apiserver"], " s") for r in rows],
         ""),
        ("CPU of kube-controller-manager, static / provisioner burst",
         [f"{fmt(r['static']['cpu']['kube-controller-manager'])} / {fmt(r['prov']['cpu']['kube-controller-manager'], ' s')}"
          for r in rows], ""),
        ("RSS of the idle instance, before the burst", [fmt(r["idle_rss_before"] / mib, " MiB") for r in rows],
         "<= 16 MiB"),
        ("RSS of the idle instance, M claims elsewhere", [fmt(r["idle_rss_after"] / mib, " MiB") for r in rows],
         "<= 16 MiB, flat"),
        ("peak RSS (VmHWM) of the busiest instance", [fmt(r["peak_hwm"] / mib, " MiB") for r in rows], ""),
        ("delete: all claims -> PVs and directories gone", [fmt(r["delete"]["seconds"], " s") for r in rows], ""),
        ("  CPU of all instances over the delete", [fmt(r["delete"]["cpu_instances"], " s") for r in rows], ""),
        ("machine CPU busy over the provisioner burst (2 cores = 2 s/s)",
         [f"{fmt(r['prov']['machine_busy'], ' s')} in {fmt(r['prov']['seconds'], ' s')}" for r in rows], ""),
        ("  of which processes not of this benchmark", [fmt(r["prov"]["others"], " s") for r in rows],
         "~0 (else contended)"),
        ("load average before / after the provisioner burst",
         [f"{r['prov']['load_before']} / {r['prov']['load_after']}" for r in rows], ""),
    ]
    table = [head] + [[name, *vals, tgt] for name, vals, tgt in lines]
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    for j, row in enumerate(table):
        print("| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(row)) + " |")
        if j == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", help="the cluster dir (pki/)")
    p.add_argument("--port", type=int, help="the API server's port")
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("create")
    c.add_argument("--parallel", type=int, default=8)
    c.add_argument("file")
    w = sub.add_parser("wait-count")
    w.add_argument("path")
    w.add_argument("--want", type=int, required=True)
    w.add_argument("--phase")
    w.add_argument("--timeout", type=float, required=True)
    w.add_argument("--what", required=True)
    s = sub.add_parser("strip-delete")
    s.add_argument("path")
    b = sub.add_parser("burst")
    b.add_argument("--file", required=True)
    b.add_argument("--watch", required=True)
    b.add_argument("--want", type=int, required=True)
    b.add_argument("--timeout", type=float, required=True)
    b.add_argument("--what", required=True)
    b.add_argument("--pids", default="")
    b.add_argument("--out", required=True)
    b.add_argument("--parallel", type=int, default=8)
    d = sub.add_parser("delete-burst")
    d.add_argument("--collection", required=True)
    d.add_argument("--watch", required=True)
    d.add_argument("--roots", default="")
    d.add_argument("--timeout", type=float, required=True)
    d.add_argument("--what", required=True)
    d.add_argument("--pids", default="")
    d.add_argument("--out", required=True)
    t = sub.add_parser("table")
    t.add_argument("results")
    a = p.parse_args()
    if a.cmd == "table":
        return cmd_table(a)
    if not a.dir or not a.port:
        die("--dir and --port are needed")
    api = Api(a.dir, a.port)
    try:
        run(api, a)
    except ApiError as e:
        die(str(e))


def run(api, a):
    if a.cmd == "create":
        create_all(api, read_lines(a.file), a.parallel)
    elif a.cmd == "wait-count":
        cmd_wait_count(api, a)
    elif a.cmd == "strip-delete":
        cmd_strip_delete(api, a)
    elif a.cmd == "burst":
        cmd_burst(api, a)
    elif a.cmd == "delete-burst":
        cmd_delete_burst(api, a)


if __name__ == "__main__":
    main()
