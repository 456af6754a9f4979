#!/usr/bin/env python3
"""release/release.py: the parts of release/build and release/check that read file formats (ELF,
OCI image layouts, the deployment manifests, Cargo.lock, SPDX). Standard library only; the
scripts call it, people call the scripts.

  release.py elf FILE ARCH                  FILE is an ELF executable for ARCH with no program
                                            interpreter (PT_INTERP): static, runs without a libc
  release.py version FILE ARCH [--runner CMD] [--expect-commit C] [--expect-base C]
                                            FILE --version (under CMD, e.g. qemu-aarch64-static)
                                            names a commit (12 hex, -dirty allowed) and ARCH's
                                            target: C, or C with or without -dirty; prints it
  release.py pin DIR DIGEST                 pins the flexvol image of the manifests under DIR by
                                            DIGEST (see pin_manifests)
  release.py sbom METADATA LOCK OUT --commit C --created T
                                            an SPDX 2.3 JSON document of every package of
                                            `cargo metadata` (METADATA) with Cargo.lock's checksums
  release.py check DIR --repo REPO [--kubectl K] [--qemu Q]
                                            every check of a built release but its SHA256SUMS
                                            (release/check runs sha256sum first)

Exit 1 with the reasons on stderr when a check fails.
"""
import hashlib
import io
import json
import os
import re
import struct
import subprocess
import sys
import tarfile

IMAGE = "registry.example.com/flexvol"
# A reference by tag: the name, ':' and a tag (Docker's tag grammar).
TAG_REF = re.compile(re.escape(IMAGE) + r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# Any reference to the image: by tag or by digest.
ANY_REF = re.compile(re.escape(IMAGE) + r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}|@sha256:[0-9a-f]*)")
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
ARCH = {
    # arch: (ELF e_machine, the target --version names)
    "amd64": (62, "x86_64-unknown-linux-gnu"),
    "arm64": (183, "aarch64-unknown-linux-gnu"),
}
KUSTOMIZATIONS = ("kustomization.yaml", "kustomization.yml", "Kustomization")
MANIFEST_EXT = (".yaml", ".yml")
LAYER_TYPES = ("application/vnd.oci.image.layer.v1.tar", "application/vnd.oci.image.layer.v1.tar+gzip")


class Failed(Exception):
    pass


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


# ---- ELF


def check_elf(path, arch):
    """Raises Failed unless PATH is a 64-bit little-endian ELF executable for ARCH without a
    PT_INTERP program header (a dynamic executable names its loader there)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise Failed(f"{path}: not a 64-bit little-endian ELF file")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    if e_machine != ARCH[arch][0]:
        raise Failed(f"{path}: ELF machine {e_machine}, not {arch}'s {ARCH[arch][0]}")
    if e_type not in (2, 3):  # ET_EXEC, or ET_DYN for a static-pie
        raise Failed(f"{path}: ELF type {e_type} is not an executable")
    e_phoff = struct.unpack_from("<Q", data, 32)[0]
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    for i in range(e_phnum):
        (p_type,) = struct.unpack_from("<I", data, e_phoff + i * e_phentsize)
        if p_type == 3:  # PT_INTERP
            raise Failed(f"{path}: has a program interpreter (PT_INTERP): dynamically linked, not static")
        if p_type == 2 and e_type == 2:  # PT_DYNAMIC in a non-PIE executable: it loads libraries
            raise Failed(f"{path}: has a PT_DYNAMIC segment: dynamically linked, not static")


# ---- --version


def check_version(path, arch, runner=None, expect=None, base=None):
    cmd = ([runner] if runner else []) + [path, "--version"]
    try:
        out = subprocess.run(cmd, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Failed(f"{' '.join(cmd)}: {e}")
    line = out.stdout.decode(errors="replace").strip()
    m = re.fullmatch(r"flexvol (\S+) \(commit ([0-9a-f]{12}(?:-dirty)?), (\S+)\)", line)
    if out.returncode != 0 or not m:
        raise Failed(f"{path} --version: exit {out.returncode}, {line!r}: does not name a commit")
    if m.group(3) != ARCH[arch][1]:
        raise Failed(f"{path} --version names target {m.group(3)}, not {ARCH[arch][1]}")
    if expect and m.group(2) != expect:
        raise Failed(f"{path} --version names commit {m.group(2)}, not {expect}")
    if base and m.group(2).split("-")[0] != base:
        raise Failed(f"{path} --version names commit {m.group(2)}, not {base}")
    return m.group(1), m.group(2)


# ---- manifests


def strip_comment(s):
    return s.split(" #", 1)[0].split("\t#", 1)[0].strip().strip("'\"")


def top_list(lines, key):
    """The items of a top-level YAML block list `key:` (one `- item` a line)."""
    items, inside = [], False
    for line in lines:
        if re.match(r"^[A-Za-z]", line):
            inside = line.split(":", 1)[0] == key and strip_comment(line.split(":", 1)[1]) == ""
            continue
        if inside:
            m = re.match(r"^\s*-\s+(.*)$", line)
            if m:
                items.append(strip_comment(m.group(1)))
    return items


def image_entries(lines):
    """The entries of the top-level `images:` list: [(first line index, end index, {key: value})]."""
    out, inside, cur = [], False, None
    for i, line in enumerate(lines + ["end:"]):
        if re.match(r"^[A-Za-z]", line):
            if cur:
                out.append((cur[0], i, cur[1]))
                cur = None
            inside = line.split(":", 1)[0] == "images"
            continue
        if not inside or not line.strip() or line.lstrip().startswith("#"):
            continue
        m = re.match(r"^(\s*)-\s+(\w+):(.*)$", line)
        if m:
            if cur:
                out.append((cur[0], i, cur[1]))
            cur = (i, {m.group(2): strip_comment(m.group(3))})
            continue
        m = re.match(r"^\s+(\w+):(.*)$", line)
        if m and cur:
            cur[1][m.group(1)] = strip_comment(m.group(2))
    return out


def kustomizations(root):
    for d, _, files in os.walk(root):
        for f in files:
            if f in KUSTOMIZATIONS:
                yield os.path.join(d, f)


def kustomized_files(kfile, seen=None):
    """The files a kustomization reads as resources, through its bases and resource directories."""
    seen = set() if seen is None else seen
    d = os.path.dirname(kfile)
    with open(kfile, encoding="utf-8") as f:
        lines = f.read().splitlines()
    out = set()
    for item in top_list(lines, "resources") + top_list(lines, "bases") + top_list(lines, "patchesStrategicMerge"):
        p = os.path.normpath(os.path.join(d, item))
        if os.path.isdir(p):
            for k in KUSTOMIZATIONS:
                if os.path.isfile(os.path.join(p, k)) and os.path.join(p, k) not in seen:
                    seen.add(os.path.join(p, k))
                    out |= kustomized_files(os.path.join(p, k), seen)
        elif os.path.isfile(p):
            out.add(p)
    return out


def pinning_kustomizations(root):
    """The kustomizations with an `images:` entry for the flexvol image."""
    out = []
    for k in kustomizations(root):
        with open(k, encoding="utf-8") as f:
            lines = f.read().splitlines()
        if any(e[2].get("name") == IMAGE for e in image_entries(lines)):
            out.append(k)
    return out


def kept_by_kustomize(root):
    """The files whose image a kustomization's `images:` entry sets: kustomize v2.0.3 (kubectl
    1.20's) matches an entry's name only against name[:tag] references, not name@digest, so these
    keep their tag reference and the entry pins the digest (and a user's newName still applies)."""
    out = set()
    for k in pinning_kustomizations(root):
        out |= kustomized_files(k)
    return out


def manifest_files(root):
    for d, _, files in os.walk(root):
        for f in sorted(files):
            if f.endswith(MANIFEST_EXT) or f in KUSTOMIZATIONS:
                yield os.path.join(d, f)


def pin_manifests(root, digest):
    """Pins the image by DIGEST in the manifests under ROOT: each kustomization's flexvol `images:`
    entry gets `digest:` (and loses `newTag:`); every other file's `IMAGE:<tag>` becomes
    `IMAGE@<digest>`. Files a pinning kustomization reads keep their tag reference (see
    kept_by_kustomize)."""
    if not DIGEST.fullmatch(digest):
        raise Failed(f"not a digest: {digest}")
    kept = kept_by_kustomize(root)
    for k in pinning_kustomizations(root):
        with open(k, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for start, end, e in reversed(image_entries(lines)):
            if e.get("name") != IMAGE:
                continue
            body = [ln for ln in lines[start:end] if not re.match(r"^\s+(newTag|digest):", ln)]
            # The keys of an entry are indented as far as its first key, after "- ".
            indent = " " * (len(lines[start]) - len(lines[start].lstrip()) + 2)
            last = max(i for i, ln in enumerate(body) if ln.strip() and not ln.lstrip().startswith("#"))
            body.insert(last + 1, f"{indent}digest: {digest}   # the release's image (release/build)")
            lines[start:end] = body
        with open(k, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    for p in manifest_files(root):
        if p in kept or os.path.basename(p) in KUSTOMIZATIONS:
            continue
        with open(p, encoding="utf-8") as f:
            s = f.read()
        t = TAG_REF.sub(IMAGE + "@" + digest, s)
        if t != s:
            with open(p, "w", encoding="utf-8") as f:
                f.write(t)


def check_manifests(root, digest, kubectl=None):
    """Every reference to the image under ROOT is pinned by DIGEST: by digest in the file, or by
    the `digest:` of every kustomization that reads the file; rendered with KUBECTL's kustomize
    when given, every flexvol image of every kustomization is IMAGE@DIGEST (or its newName's)."""
    errors = []
    kept = kept_by_kustomize(root)
    pinning = pinning_kustomizations(root)
    for k in pinning:
        with open(k, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for _, _, e in image_entries(lines):
            if e.get("name") != IMAGE:
                continue
            if e.get("digest") != digest:
                errors.append(f"{k}: images entry for {IMAGE} has digest {e.get('digest')!r}, not {digest}")
            if "newTag" in e:
                errors.append(f"{k}: images entry for {IMAGE} still has newTag")
    n = 0
    for p in manifest_files(root):
        with open(p, encoding="utf-8") as f:
            s = f.read()
        for m in ANY_REF.finditer(s):
            n += 1
            ref = m.group(0)
            if ref == IMAGE + "@" + digest:
                continue
            if p in kept and TAG_REF.fullmatch(ref):
                continue
            errors.append(f"{p}: {ref} is not {IMAGE}@{digest}")
    if n == 0 and not pinning:
        errors.append(f"{root}: no reference to {IMAGE} at all")
    if kubectl:
        for k in pinning:
            d = os.path.dirname(k)
            try:
                out = subprocess.run([kubectl, "kustomize", d], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as e:
                errors.append(f"{kubectl} kustomize {d}: {e}")
                continue
            if out.returncode != 0:
                errors.append(f"{kubectl} kustomize {d}: {out.stderr.decode(errors='replace').strip()}")
                continue
            images = re.findall(r"^\s*(?:-\s+)?image:\s*(\S+)", out.stdout.decode(errors="replace"), re.M)
            ours = [i for i in images if "flexvol" in i]
            if not ours:
                errors.append(f"{kubectl} kustomize {d}: no flexvol image rendered")
            errors += [f"{kubectl} kustomize {d}: renders {i}, not @{digest}" for i in ours if not i.endswith("@" + digest)]
    if errors:
        raise Failed("\n".join(errors))


# ---- SBOM


def lock_packages(path):
    """(name, version, source, checksum) of every [[package]] of a Cargo.lock."""
    pkgs, cur = [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("["):
                if cur:
                    pkgs.append(cur)
                cur = {} if line == "[[package]]" else None
                continue
            m = re.match(r'^(name|version|source|checksum) = "(.*)"$', line)
            if cur is not None and m:
                cur[m.group(1)] = m.group(2)
    if cur:
        pkgs.append(cur)
    return [(p["name"], p["version"], p.get("source"), p.get("checksum")) for p in pkgs]


def spdx_id(name, version):
    return "SPDXRef-Package-" + re.sub(r"[^A-Za-z0-9.-]", "-", f"{name}-{version}")


def sbom(metadata, lock, commit, created):
    sums = {(n, v, s): c for n, v, s, c in lock_packages(lock)}
    root = metadata["resolve"]["root"]
    by_id = {p["id"]: p for p in metadata["packages"]}
    top = by_id[root]
    packages, relationships = [], []
    for p in sorted(metadata["packages"], key=lambda p: (p["name"], p["version"])):
        lic = p.get("license")
        e = {
            "SPDXID": spdx_id(p["name"], p["version"]),
            "name": p["name"],
            "versionInfo": p["version"],
            "downloadLocation": (
                f"https://crates.io/api/v1/crates/{p['name']}/{p['version']}/download"
                if (p.get("source") or "").startswith("registry+") else "NOASSERTION"
            ),
            "filesAnalyzed": False,
            "licenseConcluded": "NOASSERTION",
            # Old crates write "MIT/Apache-2.0"; SPDX says "MIT OR Apache-2.0".
            "licenseDeclared": re.sub(r"\s*/\s*", " OR ", lic) if lic else "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:cargo/{p['name']}@{p['version']}",
            }],
        }
        c = sums.get((p["name"], p["version"], p.get("source")))
        if c:
            e["checksums"] = [{"algorithm": "SHA256", "checksumValue": c}]
        if p["id"] == root:
            e["downloadLocation"] = "NOASSERTION"
            e["sourceInfo"] = f"built from commit {commit}"
        packages.append(e)
    relationships.append({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": spdx_id(top["name"], top["version"]),
    })
    for node in sorted(metadata["resolve"]["nodes"], key=lambda n: n["id"]):
        a = by_id[node["id"]]
        for dep in sorted(node.get("deps", []), key=lambda d: d["pkg"]):
            b = by_id[dep["pkg"]]
            relationships.append({
                "spdxElementId": spdx_id(a["name"], a["version"]),
                "relationshipType": "DEPENDS_ON",
                "relatedSpdxElement": spdx_id(b["name"], b["version"]),
            })
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": f"{top['name']}-{top['version']}",
        "documentNamespace": f"https://spdx.org/spdxdocs/{top['name']}-{top['version']}-{commit}",
        "creationInfo": {"created": created, "creators": ["Tool: flexvol-release-build"]},
        "packages": packages,
        "relationships": relationships,
    }


def check_sbom(path, lock):
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    errors = []
    if doc.get("spdxVersion") != "SPDX-2.3" or doc.get("SPDXID") != "SPDXRef-DOCUMENT":
        errors.append(f"{path}: not an SPDX 2.3 document")
    listed = {}
    for p in doc.get("packages", []):
        purl = [r["referenceLocator"] for r in p.get("externalRefs", []) if r.get("referenceType") == "purl"]
        listed[(p.get("name"), p.get("versionInfo"))] = (purl, p.get("checksums", []))
    for name, version, _, checksum in lock_packages(lock):
        if (name, version) not in listed:
            errors.append(f"{path}: {name} {version} of {lock} is not listed")
            continue
        purl, sums = listed[(name, version)]
        if purl != [f"pkg:cargo/{name}@{version}"]:
            errors.append(f"{path}: {name} {version}: purl {purl}")
        if checksum and {"algorithm": "SHA256", "checksumValue": checksum} not in sums:
            errors.append(f"{path}: {name} {version}: not Cargo.lock's checksum")
    if errors:
        raise Failed("\n".join(errors))


# ---- OCI


def check_oci(path, arch, binary, entrypoint, cmd):
    """PATH is an OCI image layout tarball of one image for linux/ARCH whose one layer holds
    BINARY at /flexvol (0755, root), run as ENTRYPOINT and CMD; every blob is named by its
    digest, every descriptor's size and digest are its blob's; the config's diff_id is the
    uncompressed layer's. Returns the manifest's digest."""
    errors = []
    blobs = {}
    with tarfile.open(path) as tar:
        names = []
        for m in tar.getmembers():
            names.append(m.name)
            if m.mtime != 0 or m.uid != 0 or m.gid != 0:
                errors.append(f"{path}: {m.name}: mtime {m.mtime}, owner {m.uid}:{m.gid} (want 0, 0:0)")
            if m.isfile():
                blobs[m.name] = tar.extractfile(m).read()
            elif not m.isdir():
                errors.append(f"{path}: {m.name}: neither a file nor a directory")
    if [n for n in names if n.startswith("blobs/sha256/")] != sorted(n for n in names if n.startswith("blobs/sha256/")):
        errors.append(f"{path}: blobs not in sorted order")
    for n, b in blobs.items():
        if n.startswith("blobs/sha256/") and sha256(b) != "sha256:" + n.rsplit("/", 1)[1]:
            errors.append(f"{path}: {n} does not hash to its name")
    if set(blobs) - {"oci-layout", "index.json"} - {n for n in blobs if n.startswith("blobs/sha256/")}:
        errors.append(f"{path}: files outside the layout: {sorted(blobs)}")

    def load(desc, media_types):
        if desc.get("mediaType") not in media_types:
            errors.append(f"{path}: descriptor mediaType {desc.get('mediaType')}, want one of {media_types}")
        d = desc.get("digest", "")
        b = blobs.get("blobs/sha256/" + d[7:]) if DIGEST.fullmatch(d) else None
        if b is None:
            raise Failed("\n".join(errors + [f"{path}: no blob {d}"]))
        if len(b) != desc.get("size"):
            errors.append(f"{path}: {d}: size {len(b)}, descriptor says {desc.get('size')}")
        return b

    try:
        if json.loads(blobs.get("oci-layout", b"{}")).get("imageLayoutVersion") != "1.0.0":
            errors.append(f"{path}: no oci-layout with imageLayoutVersion 1.0.0")
        index = json.loads(blobs["index.json"])
        if index.get("schemaVersion") != 2 or len(index.get("manifests", [])) != 1:
            raise Failed(f"{path}: index.json is not one manifest of schemaVersion 2")
        mdesc = index["manifests"][0]
        if mdesc.get("platform") != {"architecture": arch, "os": "linux"}:
            errors.append(f"{path}: index platform {mdesc.get('platform')}, not linux/{arch}")
        manifest = json.loads(load(mdesc, ["application/vnd.oci.image.manifest.v1+json"]))
        if manifest.get("schemaVersion") != 2 or manifest.get("mediaType") != "application/vnd.oci.image.manifest.v1+json":
            errors.append(f"{path}: manifest schemaVersion/mediaType {manifest.get('schemaVersion')} {manifest.get('mediaType')}")
        config = json.loads(load(manifest["config"], ["application/vnd.oci.image.config.v1+json"]))
        if len(manifest.get("layers", [])) != 1:
            raise Failed("\n".join(errors + [f"{path}: {len(manifest.get('layers', []))} layers, want 1"]))
        ldesc = manifest["layers"][0]
        data = load(ldesc, LAYER_TYPES)
        if ldesc["mediaType"].endswith("+gzip"):
            import gzip

            data = gzip.decompress(data)
        if config.get("architecture") != arch or config.get("os") != "linux":
            errors.append(f"{path}: config platform {config.get('os')}/{config.get('architecture')}, not linux/{arch}")
        if config.get("rootfs") != {"type": "layers", "diff_ids": [sha256(data)]}:
            errors.append(f"{path}: config rootfs {config.get('rootfs')} is not the layer's diff_id {sha256(data)}")
        c = config.get("config", {})
        if c.get("Entrypoint") != entrypoint or c.get("Cmd") != cmd:
            errors.append(f"{path}: entrypoint {c.get('Entrypoint')} cmd {c.get('Cmd')}, want {entrypoint} {cmd}")
        with tarfile.open(fileobj=io.BytesIO(data)) as layer:
            files = {m.name: m for m in layer.getmembers()}
            m = files.get("flexvol")
            if not m or not m.isfile() or m.mode != 0o755 or m.uid != 0 or m.mtime != 0:
                errors.append(f"{path}: layer has no /flexvol file of mode 0755, owner root, mtime 0")
            else:
                with open(binary, "rb") as f:
                    if layer.extractfile(m).read() != f.read():
                        errors.append(f"{path}: the layer's /flexvol is not {binary}")
            if set(files) != {"flexvol"}:
                errors.append(f"{path}: the layer holds {sorted(files)}, not just flexvol")
    except (KeyError, ValueError, TypeError, AttributeError, tarfile.TarError) as e:
        errors.append(f"{path}: malformed layout: {e!r}")
    if errors:
        raise Failed("\n".join(errors))
    return mdesc["digest"], manifest


# ---- the whole release


def check_release(d, repo, kubectl, qemu):
    sys.path.insert(0, os.path.join(repo, "tests", "cluster"))
    import image  # tests/cluster/image.py: the Containerfile the image must follow

    _, _, conf = image.parse_containerfile(os.path.join(repo, "drivers/deploy/Containerfile.prebuilt"), repo)
    errors, digests, commits = [], {}, set()
    bins = sorted(f for f in os.listdir(d) if re.fullmatch(r"flexvol-[^/]+-linux-(amd64|arm64)", f))
    if not bins:
        raise Failed(f"{d}: no flexvol-<version>-linux-<arch> binary")
    for b in bins:
        arch = b.rsplit("-", 1)[1]
        path = os.path.join(d, b)
        try:
            check_elf(path, arch)
            runner = None
            if arch != "amd64":
                if not qemu:
                    print(f"release/check: NOT RUN: {b} --version (no qemu-aarch64-static here; "
                          "its ELF header and image were checked)", file=sys.stderr)
                runner = qemu
            if arch == "amd64" or qemu:
                commits.add(check_version(path, arch, runner)[1])
            digest, manifest = check_oci(path + ".oci.tar", arch, path, conf.get("Entrypoint"), conf.get("Cmd"))
            digests[arch] = digest
            rev = manifest.get("annotations", {}).get("org.opencontainers.image.revision")
            if rev:
                commits.add(rev)
        except (Failed, OSError) as e:
            errors.append(str(e))
    if len(commits) > 1:
        errors.append(f"{d}: the binaries and images name different commits: {sorted(commits)}")
    pinned = digests.get("amd64") or digests.get("arm64")
    if pinned:
        try:
            check_manifests(os.path.join(d, "manifests"), pinned, kubectl)
        except (Failed, OSError) as e:
            errors.append(str(e))
    try:
        check_sbom(os.path.join(d, "sbom.spdx.json"), os.path.join(repo, "Cargo.lock"))
    except (Failed, OSError, ValueError) as e:
        errors.append(str(e))
    if errors:
        raise Failed("\n".join(errors))
    for arch, dg in sorted(digests.items()):
        print(f"{arch}: image {dg}")


def main():
    a = sys.argv[1:]

    def opt(name):
        if name in a:
            i = a.index(name)
            v = a[i + 1]
            del a[i:i + 2]
            return v
        return None

    try:
        if a[:1] == ["elf"] and len(a) == 3:
            check_elf(a[1], a[2])
        elif a[:1] == ["version"]:
            runner, expect, base = opt("--runner"), opt("--expect-commit"), opt("--expect-base")
            print(check_version(a[1], a[2], runner, expect, base)[1])
        elif a[:1] == ["pin"] and len(a) == 3:
            pin_manifests(a[1], a[2])
        elif a[:1] == ["check-manifests"]:
            kubectl = opt("--kubectl")
            check_manifests(a[1], a[2], kubectl)
        elif a[:1] == ["sbom"]:
            commit, created = opt("--commit"), opt("--created")
            with open(a[1], encoding="utf-8") as f:
                doc = sbom(json.load(f), a[2], commit, created)
            with open(a[3], "w", encoding="utf-8") as f:
                json.dump(doc, f, indent=1, sort_keys=True)
                f.write("\n")
        elif a[:1] == ["check"]:
            repo, kubectl, qemu = opt("--repo"), opt("--kubectl"), opt("--qemu")
            check_release(a[1], repo, kubectl, qemu)
        else:
            print(__doc__, file=sys.stderr)
            return 2
    except Failed as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
