//! `release/build` and `release/check` (docs/releasing.md): a release built from the test's own
//! binary (`--binary`, so nothing is compiled twice) passes the check, the same inputs give the
//! same image digest, and the check fails, for its own reason, on a tampered artifact, a file
//! SHA256SUMS does not list, a manifest or kustomization pinned to another digest, an SBOM missing
//! a crate of Cargo.lock and an image whose config names another layer.

use crate::util::binary;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a release script; (success, stdout + stderr).
fn script(name: &str, args: &[&str]) -> (bool, String) {
    crate::util::run_joined(Command::new(repo().join("release").join(name)).args(args))
}

/// A copy of the release DIR at DEST (`cp -a`: the binaries keep their mode).
fn copy(dir: &Path, dest: &Path) {
    let ok = Command::new("cp")
        .args(["-a", "--"])
        .arg(dir)
        .arg(dest)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cp -a {} {}", dir.display(), dest.display());
}

/// Rewrites DIR's SHA256SUMS for its files as they are now, so that a check other than the sums
/// has to find what was changed.
fn rehash(dir: &Path) {
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let names: Vec<&str> = sums.lines().map(|l| &l[66..]).collect();
    let out = Command::new("sha256sum")
        .arg("--")
        .args(&names)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success());
    std::fs::write(dir.join("SHA256SUMS"), out.stdout).unwrap();
}

/// release/check on a changed copy of the release fails and says WANT.
fn check_fails(release: &Path, scratch: &Path, case: &str, want: &str, change: impl FnOnce(&Path)) {
    let d = scratch.join(case);
    copy(release, &d);
    change(&d);
    let (ok, out) = script("check", &[d.to_str().unwrap()]);
    assert!(!ok, "{case}: release/check passed:\n{out}");
    assert!(
        out.contains(want),
        "{case}: release/check did not say {want:?}:\n{out}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

fn edit(path: &Path, from: &str, to: &str) {
    let s = std::fs::read_to_string(path).unwrap();
    assert!(s.contains(from), "{}: no {from:?}", path.display());
    std::fs::write(path, s.replacen(from, to, 1)).unwrap();
}

#[test]
fn release_build_then_check_passes_and_catches_tampering() {
    let t = tempfile::tempdir().unwrap();
    let rel = t.path().join("release");
    let bin = binary();
    let (ok, out) = script(
        "build",
        &[
            "--arch",
            "amd64",
            "--allow-dirty",
            "--binary",
            bin.to_str().unwrap(),
            "--out",
            rel.to_str().unwrap(),
        ],
    );
    assert!(ok, "release/build:\n{out}");
    let version = env!("CARGO_PKG_VERSION");
    let name = format!("flexvol-{version}-linux-amd64");
    for f in [
        name.clone(),
        format!("{name}.oci.tar"),
        "manifests/deploy/kustomization.yaml".into(),
        "manifests/deploy/daemonset.yaml".into(),
        "manifests/deploy-overlays/node-loss/kustomization.yaml".into(),
        "manifests/deploy-overlays/capacity/scheduler-extender.yaml".into(),
        "sbom.spdx.json".into(),
        "images.txt".into(),
        "SHA256SUMS".into(),
    ] {
        assert!(rel.join(&f).is_file(), "{f} missing; build said:\n{out}");
    }
    assert_eq!(
        std::fs::read(rel.join(&name)).unwrap(),
        std::fs::read(&bin).unwrap()
    );
    // A second build over a non-empty directory is refused, not merged into it.
    let (ok, again) = script(
        "build",
        &[
            "--arch",
            "amd64",
            "--allow-dirty",
            "--binary",
            bin.to_str().unwrap(),
            "--out",
            rel.to_str().unwrap(),
        ],
    );
    assert!(!ok && again.contains("is not empty"), "{again}");

    let (ok, out) = script("check", &[rel.to_str().unwrap()]);
    assert!(ok, "release/check:\n{out}");
    let images = std::fs::read_to_string(rel.join("images.txt")).unwrap();
    let digest = images
        .split('@')
        .nth(1)
        .map(str::trim)
        .expect("images.txt: amd64 NAME@DIGEST");
    assert!(out.contains(&format!("amd64: image {digest}")), "{out}");
    let pinned = std::fs::read_to_string(rel.join("manifests/deploy/kustomization.yaml")).unwrap();
    assert!(pinned.contains(&format!("digest: {digest}")), "{pinned}");

    // Reproducible: the same binary, copied (a new mtime), gives the same image digest.
    let copy_of_bin = t.path().join("flexvol");
    std::fs::copy(&bin, &copy_of_bin).unwrap();
    let again = Command::new("python3")
        .arg(repo().join("tests/cluster/image.py"))
        .args(["--oci", "--arch", "amd64", "--tag"])
        .arg(format!("registry.example.com/flexvol:{version}"))
        .arg("--containerfile")
        .arg(repo().join("drivers/deploy/Containerfile.prebuilt"))
        .arg("--context")
        .arg(repo())
        .arg("--source-for")
        .arg(format!("/flexvol:{}", copy_of_bin.display()))
        .args([
            "--annotation",
            &format!("org.opencontainers.image.version={version}"),
        ])
        .args([
            "--annotation",
            &format!(
                "org.opencontainers.image.revision={}",
                revision(&rel, &name)
            ),
        ])
        .args([
            "--annotation",
            "org.opencontainers.image.source=https://github.com/flexvol/flexvol",
        ])
        .arg("--out")
        .arg(t.path().join("again.oci.tar"))
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), digest);
    std::fs::remove_file(&copy_of_bin).unwrap();

    let scratch = t.path().join("cases");
    std::fs::create_dir(&scratch).unwrap();
    check_fails(
        &rel,
        &scratch,
        "tampered-binary",
        "SHA256SUMS does not match",
        |d| {
            let p = d.join(&name);
            let mut b = std::fs::read(&p).unwrap();
            let n = b.len() - 1;
            b[n] ^= 1;
            std::fs::write(&p, b).unwrap();
        },
    );
    check_fails(
        &rel,
        &scratch,
        "unlisted-file",
        "files not in SHA256SUMS: extra",
        |d| {
            std::fs::write(d.join("extra"), "x").unwrap();
        },
    );
    let other = format!("sha256:{}", "0".repeat(64));
    check_fails(
        &rel,
        &scratch,
        "wrong-digest-in-a-manifest",
        &format!("controller.yaml: registry.example.com/flexvol@{other} is not"),
        |d| {
            // (every image reference is read by a kustomization, whose digest: pins it; a
            // reference by another digest planted in one is still caught)
            edit(
                &d.join("manifests/deploy-overlays/node-loss/controller.yaml"),
                &format!("registry.example.com/flexvol:{}", env!("CARGO_PKG_VERSION")),
                &format!("registry.example.com/flexvol@{other}"),
            );
            rehash(d);
        },
    );
    check_fails(
        &rel,
        &scratch,
        "wrong-digest-in-the-kustomization",
        "images entry for registry.example.com/flexvol has digest",
        |d| {
            edit(
                &d.join("manifests/deploy/kustomization.yaml"),
                digest,
                &other,
            );
            rehash(d);
        },
    );
    check_fails(&rel, &scratch, "sbom-missing-ring", "ring ", |d| {
        let p = d.join("sbom.spdx.json");
        let mut doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
        let pkgs = doc["packages"].as_array_mut().unwrap();
        let before = pkgs.len();
        pkgs.retain(|p| p["name"] != "ring");
        assert_eq!(pkgs.len(), before - 1, "the SBOM lists ring once");
        std::fs::write(&p, serde_json::to_string(&doc).unwrap()).unwrap();
        rehash(d);
    });
    check_fails(
        &rel,
        &scratch,
        "config-names-another-layer",
        "is not the layer's diff_id",
        |d| {
            rewrite_config_diff_id(&d.join(format!("{name}.oci.tar")));
            rehash(d);
        },
    );
}

/// The commit the release's binary names (`--version`), as release/build wrote it into the image.
fn revision(rel: &Path, name: &str) -> String {
    let out = Command::new(rel.join(name))
        .arg("--version")
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&out.stdout).into_owned();
    line.split("(commit ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .unwrap_or_else(|| panic!("--version: {line}"))
        .to_owned()
}

/// Changes the image's config to name another diff_id and re-links the layout (config blob named by
/// its new digest, manifest and index updated), so that only the diff_id check can catch it.
fn rewrite_config_diff_id(tar: &Path) {
    let script = r#"
import hashlib, io, json, sys, tarfile
p = sys.argv[1]
with tarfile.open(p) as t:
    files = {m.name: t.extractfile(m).read() for m in t.getmembers() if m.isfile()}
def h(b): return hashlib.sha256(b).hexdigest()
index = json.loads(files["index.json"])
md = index["manifests"][0]
manifest = json.loads(files.pop("blobs/sha256/" + md["digest"][7:]))
config = json.loads(files.pop("blobs/sha256/" + manifest["config"]["digest"][7:]))
config["rootfs"]["diff_ids"] = ["sha256:" + "1" * 64]
cb = json.dumps(config, sort_keys=True).encode()
files["blobs/sha256/" + h(cb)] = cb
manifest["config"].update(digest="sha256:" + h(cb), size=len(cb))
mb = json.dumps(manifest, sort_keys=True).encode()
files["blobs/sha256/" + h(mb)] = mb
md.update(digest="sha256:" + h(mb), size=len(mb))
files["index.json"] = json.dumps(index, sort_keys=True).encode()
with tarfile.open(p, "w") as t:
    for n in sorted(files):
        ti = tarfile.TarInfo(n); ti.size = len(files[n]); ti.mode = 0o644
        t.addfile(ti, io.BytesIO(files[n]))
"#;
    let ok = Command::new("python3")
        .args(["-c", script])
        .arg(tar)
        .status()
        .unwrap()
        .success();
    assert!(ok, "rewriting {}", tar.display());
}
