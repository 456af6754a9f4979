#!/usr/bin/env python3
"""tests/cluster/metrics-vs-docs.py DOC DAEMON < SCRAPE: the metric families a running daemon
serves (its /metrics text, on stdin) are exactly the ones docs/metrics.md lists for it (its
section, `## \\`flexvol provisioner\\``, plus `## Every daemon`), with the documented types.

Names as a query names them: a counter's `# TYPE flexvol_x counter` is `flexvol_x_total` (as
src/provision/telemetry/metrics_doc_tests.rs reads the registries without a cluster). Exit 0 and
one line saying how many matched, or exit 1 naming each missing and each undocumented family.
"""
import sys


def documented(doc_path, daemon):
    out, section = {}, None
    with open(doc_path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("## "):
                head = line[3:].strip()
                section = "every" if head == "Every daemon" else head.strip("`")
                continue
            if not line.startswith("| `flexvol_") or section not in ("every", daemon):
                continue
            cells = [c.strip() for c in line[1:].split("|")]
            out[cells[0].strip("`")] = cells[1]
    return out


def served(text):
    out = {}
    for line in text.splitlines():
        if not line.startswith("# TYPE "):
            continue
        name, ty = line[len("# TYPE "):].split(" ", 1)
        out[name + "_total" if ty == "counter" else name] = ty
    return out


def main():
    doc_path, daemon = sys.argv[1], sys.argv[2]
    want, got = documented(doc_path, daemon), served(sys.stdin.read())
    if not want:
        print(f"{daemon}: docs/metrics.md lists nothing for it")
        return 1
    bad = [f"documented, not served: {n} ({t})" for n, t in sorted(want.items()) if n not in got]
    bad += [f"served, not documented: {n} ({t})" for n, t in sorted(got.items()) if n not in want]
    bad += [f"{n}: served as {got[n]}, documented as {t}" for n, t in sorted(want.items()) if n in got and got[n] != t]
    if bad:
        print(f"{daemon}: /metrics and docs/metrics.md differ: " + "; ".join(bad))
        return 1
    print(f"{daemon}: serves exactly the {len(want)} families docs/metrics.md lists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
