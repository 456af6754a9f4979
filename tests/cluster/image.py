#!/usr/bin/env python3
"""tests/cluster/image.py: write a one-layer container image as a docker-archive tarball (what
`docker save` writes and `ctr images import` reads), with no container engine: the test cluster
has no registry, so its images are built here and imported into each node's containerd.

  image.py --tag NAME:TAG --out FILE --containerfile FILE --context DIR
      the image a Containerfile describes. Only what a one-stage image of local files needs is
      understood (FROM scratch, COPY SRC DEST, ENTRYPOINT [...], CMD [...], USER, LABEL k=v, WORKDIR,
      comments); anything else (RUN, ADD, a second stage, COPY --from) is refused with its line,
      so the test never builds something other than what podman would build from the same file.
  image.py --tag NAME:TAG --out FILE --file SRC:DEST ... [--symlink DEST:TARGET ...]
           [--entrypoint JSON] [--cmd JSON] [--user U]
      the same from arguments (the busybox workload and pause images of the tests).

The layer is reproducible (owner root, mtime 0, sorted), so the same inputs give the same image ID.
Files keep their mode; parent directories are 0755. Exit 1 with the reason on any error.
"""
import argparse
import hashlib
import io
import json
import os
import shlex
import sys
import tarfile


def die(msg):
    print(f"image.py: {msg}", file=sys.stderr)
    sys.exit(1)


def parse_containerfile(path, context):
    files, symlinks, conf = [], [], {}
    seen_from = False
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    # Continuation lines (trailing backslash) are joined first.
    joined, cur = [], ""
    for raw in lines:
        s = raw.strip()
        if not cur and (not s or s.startswith("#")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        joined.append(cur + s)
        cur = ""
    for line in joined:
        word, _, rest = line.partition(" ")
        word = word.upper()
        rest = rest.strip()
        if word == "FROM":
            if seen_from or rest.split()[0] != "scratch":
                die(f"{path}: only one stage FROM scratch is supported, not: {line}")
            seen_from = True
        elif not seen_from:
            die(f"{path}: {line}: before FROM")
        elif word == "COPY":
            args = shlex.split(rest)
            if any(a.startswith("--") for a in args) or len(args) != 2:
                die(f"{path}: only COPY SRC DEST is supported, not: {line}")
            src = os.path.join(context, args[0])
            files.append((src, args[1]))
        elif word in ("ENTRYPOINT", "CMD"):
            try:
                v = json.loads(rest)
            except ValueError:
                die(f"{path}: {word} must be in exec (JSON) form: {line}")
            conf["Entrypoint" if word == "ENTRYPOINT" else "Cmd"] = v
        elif word == "USER":
            conf["User"] = rest
        elif word == "WORKDIR":
            conf["WorkingDir"] = rest
        elif word == "LABEL":
            for kv in shlex.split(rest):
                k, _, v = kv.partition("=")
                conf.setdefault("Labels", {})[k] = v
        else:
            die(f"{path}: unsupported instruction: {line}")
    if not seen_from:
        die(f"{path}: no FROM")
    return files, symlinks, conf


def add_dirs(tar, dest, done):
    parts = dest.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/".join(parts[:i])
        if d in done:
            continue
        done.add(d)
        ti = tarfile.TarInfo(d)
        ti.type = tarfile.DIRTYPE
        ti.mode = 0o755
        tar.addfile(ti)


def layer(files, symlinks):
    buf = io.BytesIO()
    done = set()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        entries = [(d, "f", s) for s, d in files] + [(d, "l", t) for d, t in symlinks]
        for dest, kind, what in sorted(entries):
            add_dirs(tar, dest, done)
            ti = tarfile.TarInfo(dest.strip("/"))
            if kind == "l":
                ti.type = tarfile.SYMTYPE
                ti.linkname = what
                ti.mode = 0o777
                tar.addfile(ti)
                continue
            try:
                st = os.stat(what)
                with open(what, "rb") as f:
                    data = f.read()
            except OSError as e:
                die(f"cannot read {what}: {e}")
            ti.size = len(data)
            ti.mode = st.st_mode & 0o7777
            tar.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tag", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--containerfile")
    p.add_argument("--context", default=".")
    p.add_argument("--file", action="append", default=[])
    p.add_argument("--symlink", action="append", default=[])
    p.add_argument("--entrypoint")
    p.add_argument("--cmd")
    p.add_argument("--user")
    a = p.parse_args()
    if a.containerfile:
        files, symlinks, conf = parse_containerfile(a.containerfile, a.context)
    else:
        files = [tuple(f.split(":", 1)) for f in a.file]
        symlinks = [tuple(s.split(":", 1)) for s in a.symlink]
        conf = {}
        if a.entrypoint:
            conf["Entrypoint"] = json.loads(a.entrypoint)
        if a.cmd:
            conf["Cmd"] = json.loads(a.cmd)
        if a.user:
            conf["User"] = a.user
    if not files:
        die("an image without files")
    conf.setdefault("Env", ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    data = layer(files, symlinks)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": conf,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/cluster/image.py"}],
        },
        sort_keys=True,
    ).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id[7:] + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [a.tag], "Layers": [layer_name]}]).encode()
    tmp = "%s.%d.tmp" % (a.out, os.getpid())  # two builders of one image (host and guest) never share a file
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, blob in ((config_name, config), (layer_name, data), ("manifest.json", manifest)):
            if "/" in name:
                ti = tarfile.TarInfo(name.split("/")[0])
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o755
                tar.addfile(ti)
            ti = tarfile.TarInfo(name)
            ti.size = len(blob)
            ti.mode = 0o644
            tar.addfile(ti, io.BytesIO(blob))
    os.replace(tmp, a.out)
    print(config_name[:-5])


if __name__ == "__main__":
    main()
