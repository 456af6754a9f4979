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

  Options of both forms:
  --arch amd64|arm64     the platform in the config (and, with --oci, in the index); amd64 unless
                         given
  --source-for DEST:FILE the file a Containerfile's COPY puts at DEST is read from FILE instead of
                         its context path (release/build: the release's binary, whatever its
                         target directory)
  --oci                  write an OCI image layout tarball instead (oci-layout, index.json,
                         blobs/sha256/...: what `skopeo copy oci-archive:FILE ...` and
                         `ctr images import` read); the layer is an uncompressed tar, so its digest
                         is its diff_id and no compressor's version changes it. --tag's NAME:TAG
                         goes into the index as io.containerd.image.name (ctr) and TAG as
                         org.opencontainers.image.ref.name (skopeo's oci-archive:FILE:TAG).
                         Prints the manifest's digest (sha256:...), the image's digest once pushed
                         unchanged.
  --annotation K=V       an annotation of the OCI manifest (with --oci; repeatable)

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


def parse_containerfile(path, context, source_for=None):
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
            if source_for and args[1] in source_for:
                src = source_for.pop(args[1])
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


ARCHES = ("amd64", "arm64")


def tar_blobs(out, entries):
    """Writes a tarball of (name, bytes) entries, each parent directory first, mode 0644/0755,
    owner root, mtime 0, aside then renamed (two builders of one image, host and guest, never
    share a file)."""
    tmp = "%s.%d.tmp" % (out, os.getpid())
    done = set()
    with tarfile.open(tmp, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, blob in entries:
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d in done:
                    continue
                done.add(d)
                ti = tarfile.TarInfo(d)
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o755
                tar.addfile(ti)
            ti = tarfile.TarInfo(name)
            ti.size = len(blob)
            ti.mode = 0o644
            tar.addfile(ti, io.BytesIO(blob))
    os.replace(tmp, out)


def descriptor(media_type, blob, **extra):
    d = {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}
    d.update(extra)
    return d


def write_oci(out, tag, arch, data, config, annotations):
    """An OCI image layout (image-spec v1.0) of one manifest, as a tarball."""
    layer_desc = descriptor("application/vnd.oci.image.layer.v1.tar", data)
    config_desc = descriptor("application/vnd.oci.image.config.v1+json", config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": [layer_desc],
    }
    if annotations:
        manifest["annotations"] = annotations
    manifest = json.dumps(manifest, sort_keys=True).encode()
    ref = tag.rsplit(":", 1)[1] if ":" in tag.rsplit("/", 1)[-1] else "latest"
    manifest_desc = descriptor(
        "application/vnd.oci.image.manifest.v1+json",
        manifest,
        platform={"architecture": arch, "os": "linux"},
        annotations={"io.containerd.image.name": tag, "org.opencontainers.image.ref.name": ref},
    )
    index = json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [manifest_desc]},
        sort_keys=True,
    ).encode()
    blobs = sorted(
        ("blobs/sha256/" + d["digest"][7:], b)
        for d, b in ((layer_desc, data), (config_desc, config), (manifest_desc, manifest))
    )
    layout = json.dumps({"imageLayoutVersion": "1.0.0"}).encode()
    tar_blobs(out, blobs + [("index.json", index), ("oci-layout", layout)])
    return manifest_desc["digest"]


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
    p.add_argument("--arch", default="amd64", choices=ARCHES)
    p.add_argument("--source-for", action="append", default=[])
    p.add_argument("--oci", action="store_true")
    p.add_argument("--annotation", action="append", default=[])
    a = p.parse_args()
    source_for = dict(s.split(":", 1) for s in a.source_for)
    if a.containerfile:
        files, symlinks, conf = parse_containerfile(a.containerfile, a.context, source_for)
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
    if source_for:
        die("--source-for names no COPY destination of the Containerfile: " + ", ".join(sorted(source_for)))
    if a.annotation and not a.oci:
        die("--annotation is for --oci")
    if not files:
        die("an image without files")
    conf.setdefault("Env", ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
    data = layer(files, symlinks)
    diff_id = "sha256:" + hashlib.sha256(data).hexdigest()
    config = json.dumps(
        {
            "architecture": a.arch,
            "os": "linux",
            "created": "1970-01-01T00:00:00Z",
            "config": conf,
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
            "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "tests/cluster/image.py"}],
        },
        sort_keys=True,
    ).encode()
    if a.oci:
        print(write_oci(a.out, a.tag, a.arch, data, config, dict(kv.split("=", 1) for kv in a.annotation)))
        return
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    layer_name = diff_id[7:] + "/layer.tar"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [a.tag], "Layers": [layer_name]}]).encode()
    tar_blobs(a.out, ((config_name, config), (layer_name, data), ("manifest.json", manifest)))
    print(config_name[:-5])


if __name__ == "__main__":
    main()
