//! How the binary is invoked, and the commands for people.
//!
//! Run as `hostpath`, `nfs` or `lvm` (how kubelet runs it, from `<vendor>~<driver>/<driver>`), it is
//! a FlexVolume driver: argv[1] is the verb and the reply is one JSON object. Run under any other
//! name (normally `flexvol`), it is a command-line tool for people: the same verbs by hand
//! (`flexvol hostpath mount DIR JSON`), `--help`, `--version`, `--pretty`, and operator commands.

#![allow(clippy::print_stdout)]

use crate::backend::Backend;
use crate::driver;
use crate::ops;
use crate::protocol::reply::{self, Reply};
use crate::protocol::verb::{self, Call, VERBS};
use clap::{Args, Parser, Subcommand};

const ABOUT: &str = "Kubernetes FlexVolume driver for hostPath, NFS and LVM volumes";

const LONG_ABOUT: &str = "\
Kubernetes FlexVolume driver for hostPath, NFS and LVM volumes.

kubelet runs this binary as <plugin-dir>/<vendor>~<driver>/<driver> (for example
/usr/libexec/kubernetes/kubelet-plugins/volume/exec/flexvol~hostpath/hostpath) and the name it
runs as selects the backend. Under its own name it runs the same verbs by hand, for debugging:

  flexvol --pretty hostpath init
  mkdir -p /tmp/k/pods/p1/volumes/flexvol~hostpath/vol
  flexvol hostpath mount /tmp/k/pods/p1/volumes/flexvol~hostpath/vol '{\"path\":\"/srv/flexvol/data\",\"type\":\"DirectoryOrCreate\"}'
  flexvol hostpath unmount /tmp/k/pods/p1/volumes/flexvol~hostpath/vol

Every verb prints exactly one JSON object (the reply kubelet reads) and exits 0 for Success and
\"Not supported\", 1 for Failure. Node configuration: /etc/flexvol/config.json, or the file named
by FLEXVOL_CONFIG. Each call is logged as one JSON line to /var/log/flexvol.log by default.";

#[derive(Parser)]
#[command(name = "flexvol", version = crate::version::LONG, about = ABOUT, long_about = LONG_ABOUT, disable_help_subcommand = true)]
struct Cli {
    /// Indent the JSON reply (for people; kubelet never passes this).
    #[arg(long, global = true)]
    pretty: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a hostpath driver verb by hand: flexvol hostpath VERB [ARGS]... (`flexvol hostpath --help` lists the verbs)
    #[command(name = "hostpath", disable_help_flag = true)]
    HostPath(VerbArgs),
    /// Run an nfs driver verb by hand: flexvol nfs VERB [ARGS]...
    #[command(disable_help_flag = true)]
    Nfs(VerbArgs),
    /// Run an lvm driver verb by hand: flexvol lvm VERB [ARGS]...
    #[command(disable_help_flag = true)]
    Lvm(VerbArgs),
    /// Install the driver into kubelet's plugin directory, one copy per driver name, atomically.
    #[command(
        after_help = "Example:\n  flexvol install --vendor flexvol --drivers hostpath,nfs,lvm\n  flexvol install --plugin-dir /var/lib/kubelet/volumeplugins --uninstall\n  flexvol install --plugin-dir /flexmnt --binary /flexvol --config /config/config.json --config-dest /host/etc/flexvol/config.json --nfs-key /nfs-key/key --nfs-key-dest /host/etc/flexvol/nfs-capability.key --sleep   # the DaemonSet (drivers/deploy)"
    )]
    Install(ops::install::InstallArgs),
    /// Check this node: tools, kernel features, config, directories and the installed drivers.
    #[command(
        after_help = "Every problem names its fix; the exit status is 1 when there is one.\n\nExample:\n  flexvol doctor\n  flexvol doctor --plugin-dir /var/lib/kubelet/volumeplugins --json"
    )]
    Doctor(ops::doctor::DoctorArgs),
    /// List the volumes this node's drivers manage, from the state records and the mount table.
    #[command(
        after_help = "Flags records without a mount, flexvol mounts without a record and volumes of pods that are gone; the exit status is 1 when there is one.\n\nExample:\n  flexvol status\n  flexvol status --json | jq '.volumes[] | select(.problem)'"
    )]
    Status(ops::status::StatusArgs),
    /// Find mounts and records kubelet forgot; clean them up only with --apply.
    #[command(
        long_about = "Find mounts and records kubelet forgot; clean them up only with --apply.\n\nA pod counts as gone only when its directory <kubelet-root>/pods/<uid> no longer exists, when its mount point was deleted while mounted, or when its uid is missing from the --live-pods list. Orphaned mounts are unmounted through the driver's own unmount (then the empty volume directory is removed); records of mounts that do not exist are forgotten. Nothing is ever deleted recursively, and no volume data is touched, with one exception: with --live-pvs FILE, a hostPath directory `flexvol provisioner` made (it holds its ownership marker) whose PV is not in FILE is an orphan if it was made before FILE was written and at least --min-age (default 1h) ago, and --apply deletes it the provisioner's way (FILE read and the age checked again just before, marker checked, never through a symlink). Younger directories are left alone: the provisioner makes a directory before its PV, so a list taken a moment earlier does not name it yet.",
        after_help = "Example:\n  flexvol gc                      # dry run: what would be cleaned up\n  kubectl get pods -A --field-selector spec.nodeName=$(hostname) -o jsonpath='{.items[*].metadata.uid}' > /tmp/live\n  flexvol gc --live-pods /tmp/live --apply\n  kubectl get pv -o name > /tmp/pvs && flexvol gc --live-pvs /tmp/pvs   # provisioned hostPath directories whose PV is gone"
    )]
    Gc(ops::gc::GcArgs),
    /// Move bound flexVolume PVs of flexvol's drivers to CSI PVs of `flexvol csi`, data in place (a dry run without --apply; --rollback moves them back).
    #[command(
        after_help = "The PV is re-created under the same name (the capability token of a provisioned volume stays valid) and its claim bound to it again; no volume data is touched. Refused while a pod uses the claim: stop the pods first. Each move is journaled (--journal-dir) so that a run killed anywhere converges when run again. See docs/migrate.md.

Example:
  flexvol migrate --kubeconfig admin.conf --namespace team-a            # dry run
  flexvol migrate --kubeconfig admin.conf --namespace team-a --apply
  flexvol migrate --kubeconfig admin.conf pvc-0a1b --rollback --apply"
    )]
    Migrate(ops::migrate::MigrateArgs),
    /// Judge installed FlexVolume drivers (any vendor's) the way kubelet runs them; prints a table of checks.
    #[command(
        long_about = "Judge installed FlexVolume drivers (any vendor's) the way kubelet runs them; prints a table of checks.\n\nEach check is PASS, FAIL or SKIP; SKIP means it was not run and is never counted as a pass. Always checked: the install, init, unknown verbs, exit codes, and the error paths that need no options (malformed options JSON, a pod directory that does not exist: each must be a Failure, with any exit status, that mounts and creates nothing). With --options, the whole volume lifecycle of a test volume is replayed (without it, it is SKIP and the summary says how to run it). With --bad-options (repeatable), options the driver must refuse are tried the same way. Exit status 1 when any check fails, 2 for bad arguments.",
        after_help = "Examples:\n  flexvol conformance --driver flexvol/hostpath --driver flexvol/nfs    # probe and generic error paths only\n  flexvol conformance --plugin-dir /var/lib/kubelet/volumeplugins --driver flexvol/hostpath \\\n    --options '{\"path\":\"/srv/flexvol/conformance\",\"type\":\"DirectoryOrCreate\"}' \\\n    --bad-options '{\"path\":\"/srv/flexvol/does-not-exist\",\"type\":\"Directory\"}' --bad-options '{\"type\":\"Directory\"}'"
    )]
    Conformance(ops::conformance::ConformanceArgs),
    /// Provision volumes for claims of `<vendor>/hostpath`, `<vendor>/lvm` and `<vendor>/nfs` StorageClasses (a daemon; one per node).
    #[command(
        after_help = "hostPath directories and LVs are made on this node for the claims scheduled to it; NFS subdirectories for any claim of an nfs class. What each may use comes from the node config: hostPath roots from the local-path keys (nodePathMap, storageClassConfigs), volume groups from lvm.allowedVolumeGroups, exports from nfs.provisionedExports.\n\nExample:\n  flexvol provisioner --node-name $(hostname)                        # in the DaemonSet (service account)\n  flexvol provisioner --node-name node-a --kubeconfig ~/.kube/config"
    )]
    Provisioner(crate::provision::ProvisionerArgs),
    /// The cluster-wide controller (one replica): deletes the claims and PVs of nodes that are gone, for classes that opt in.
    #[command(
        after_help = "A class of a node-local kind opts in with the parameter nodeLossGracePeriod (e.g. \"10m\"): once a PV's node has had no Node object for that long, its claim and PV are deleted, with events, so that the claim's owner recreates it on another node. A node that exists (NotReady, cordoned, unreachable) is never acted on. See docs/node-loss.md.\n\nExample:\n  flexvol controller                                  # in the Deployment of drivers/deploy-overlays/node-loss/controller.yaml\n  flexvol controller --kubeconfig ~/.kube/config --resync-seconds 5"
    )]
    Controller(crate::controller::ControllerArgs),
    /// A kube-scheduler extender that keeps pods off nodes without room for their flexvol claims, from the capacity the node provisioners publish (docs/scheduler-extender.md; drivers/deploy-overlays/capacity/scheduler-extender.yaml).
    #[command(
        name = "scheduler-extender",
        after_help = "Configure kube-scheduler (KubeSchedulerConfiguration extenders) with urlPrefix http://<listen>, filterVerb filter, prioritizeVerb prioritize, nodeCacheCapable true, ignorable true. See docs/scheduler-extender.md.\n\nExample:\n  flexvol scheduler-extender --listen 127.0.0.1:8099"
    )]
    SchedulerExtender(crate::controller::extender::SchedulerExtenderArgs),
    /// A CSI node plugin serving hostPath volumes through the same backend as the FlexVolume verbs, registered with kubelet without a sidecar (docs/csi.md).
    #[command(
        after_help = "Serves the CSI Identity and Node services on --endpoint and kubelet's plugin registration on <kubelet-root>/plugins_registry/<driver-name>-reg.sock, until SIGTERM. Runs as root on the node (it bind-mounts into kubelet's pod directories).\n\nExample:\n  flexvol csi --endpoint unix:///var/lib/kubelet/plugins/hostpath.csi.flexvol.io/csi.sock --driver-name hostpath.csi.flexvol.io --node-name $(hostname)"
    )]
    Csi(crate::csi::CsiArgs),
}

#[derive(Args)]
struct VerbArgs {
    /// The verb and its arguments, exactly as kubelet passes them.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "VERB [ARGS]"
    )]
    args: Vec<String>,
}

/// The program, from the raw argv: returns the exit code. An argument that is not UTF-8 is
/// refused with one Failure reply: kubelet only ever passes UTF-8 (JSON, paths it made), and
/// replacing bad bytes with U+FFFD would name another path than the one given.
pub fn main_os(args: Vec<std::ffi::OsString>) -> i32 {
    let mut text = Vec::with_capacity(args.len());
    for (i, a) in args.into_iter().enumerate() {
        match a.into_string() {
            Ok(s) => text.push(s),
            Err(_) => {
                let what = if i == 0 {
                    "the program name (argv[0])".to_owned()
                } else {
                    format!("argument {i}")
                };
                return driver::finish(&Reply::failure(format!(
                    "{what} is not valid UTF-8; flexvol refuses it rather than guess which path or option was meant (kubelet only passes UTF-8)"
                )));
            }
        }
    }
    main(&text)
}

/// The program: returns the exit code.
pub(crate) fn main(args: &[String]) -> i32 {
    let argv0 = args.first().map(String::as_str).unwrap_or("flexvol");
    let name = argv0.rsplit('/').next().unwrap_or(argv0);
    let rest = args.get(1..).unwrap_or(&[]);

    if let Some(backend) = Backend::from_name(name) {
        // kubelet never sends these; a person might.
        match rest.first().map(String::as_str) {
            Some("--help" | "-h") => {
                return print_backend_help(backend, rest.get(1).map(String::as_str));
            }
            Some("--version" | "-V") => return print_version(),
            _ => {}
        }
        return driver::run(backend, argv0, rest);
    }

    // Installed under a name that selects no backend, and called like a driver: answer in JSON.
    if rest.first().is_some_and(|v| verb::spec(v).is_some()) {
        let r = Reply::failure(format!(
            "flexvol was installed as {name:?}, which is not a driver name; install it as hostpath, nfs or lvm (see install.sh)"
        ));
        return driver::finish(&r);
    }

    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    reply::set_pretty(cli.pretty);
    match cli.command {
        Command::HostPath(v) => run_by_hand(Backend::HostPath, &v.args),
        Command::Nfs(v) => run_by_hand(Backend::Nfs, &v.args),
        Command::Lvm(v) => run_by_hand(Backend::Lvm, &v.args),
        Command::Install(a) => ops::install::run(&a),
        Command::Doctor(a) => ops::doctor::run(&a),
        Command::Status(a) => ops::status::run(&a),
        Command::Gc(a) => ops::gc::run(&a),
        Command::Migrate(a) => ops::migrate::run(&a),
        Command::Conformance(a) => ops::conformance::run(&a),
        Command::Provisioner(a) => crate::provision::run(&a),
        Command::Controller(a) => crate::controller::run(&a),
        Command::SchedulerExtender(a) => crate::controller::extender::run(&a),
        Command::Csi(a) => crate::csi::run(&a),
    }
}

/// Whether `args` (argv with argv[0]) is a command line the tool accepts, without running it:
/// the same parser as [`main`], and for verbs run by hand a verb the grammar knows. `--help` and
/// `--version` are accepted. For the test that runs the documented commands
/// (tests/suite/docs_commands.rs): a command in the docs must at least parse.
pub fn check_args(args: &[String]) -> Result<(), String> {
    match Cli::try_parse_from(args) {
        Ok(c) => match c.command {
            Command::HostPath(v) | Command::Nfs(v) | Command::Lvm(v) => {
                match v.args.first().map(String::as_str) {
                    None | Some("--help" | "-h") => Ok(()),
                    Some(verb) if verb::spec(verb).is_some() => Ok(()),
                    Some(other) => Err(format!("{other:?} is not a driver verb")),
                }
            }
            _ => Ok(()),
        },
        Err(e) if !e.use_stderr() => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

fn run_by_hand(backend: Backend, args: &[String]) -> i32 {
    match (
        args.first().map(String::as_str),
        args.get(1).map(String::as_str),
    ) {
        (None | Some("--help" | "-h"), _) => print_backend_help(backend, None),
        (Some(v), Some("--help" | "-h")) => print_backend_help(backend, Some(v)),
        _ => driver::run(backend, "flexvol", args),
    }
}

fn print_version() -> i32 {
    println!("{}", crate::version::line());
    0
}

/// What each backend does with each verb, for help texts.
fn role(backend: Backend, verb: &str) -> &'static str {
    match (backend, verb) {
        (_, "init" | "getvolumename") => "",
        (Backend::HostPath, "mount" | "unmount") => "",
        (Backend::HostPath, _) => {
            "hostpath answers \"Not supported\" (not attachable, not resizable)."
        }
        (Backend::Nfs, "mount" | "unmount") => "",
        (Backend::Nfs, _) => "nfs answers \"Not supported\" (not attachable, not resizable).",
        (Backend::Lvm, "isattached") => {
            "lvm answers \"Not supported\": the controller cannot see a node's volume group, so any answer would be a guess; kubelet caches it and keeps the volume attached."
        }
        (Backend::Lvm, "expandvolume") => {
            "lvm answers Success without side effects; expandfs does the work on the node."
        }
        (Backend::Lvm, _) => "",
    }
}

fn example(backend: Backend, verb: &str) -> String {
    let json = match backend {
        Backend::HostPath => r#"{"path":"/srv/flexvol/data","type":"DirectoryOrCreate"}"#,
        Backend::Nfs => r#"{"server":"10.0.0.5","share":"/exports/data"}"#,
        Backend::Lvm => {
            r#"{"volumegroup":"vg0","volumeID":"lv1","size":"1Gi","kubernetes.io/fsType":"ext4"}"#
        }
    };
    let b = backend.name();
    let options = json.to_owned();
    let node = || "node-1".to_owned();
    let device = || "/dev/vg0/lv1".to_owned();
    let global =
        || format!("/var/lib/kubelet/plugins/kubernetes.io/flexvolume/flexvol/{b}/mounts/pv-1");
    // hostpath acts only on directories of kubelet's shape: <root>/pods/<uid>/volumes/<plugin>/<name>.
    let pod = format!("/tmp/k/pods/p1/volumes/flexvol~{b}/vol");
    let (before, call) = match verb {
        "init" => (String::new(), Call::Init),
        "getvolumename" => (String::new(), Call::GetVolumeName { options }),
        "attach" => (
            String::new(),
            Call::Attach {
                options,
                node: node(),
            },
        ),
        "isattached" => (
            String::new(),
            Call::IsAttached {
                options,
                node: node(),
            },
        ),
        "detach" => (
            String::new(),
            Call::Detach {
                volume: "pv-1".to_owned(),
                node: node(),
            },
        ),
        "waitforattach" => (
            String::new(),
            Call::WaitForAttach {
                device: device(),
                options,
            },
        ),
        "mountdevice" => (
            String::new(),
            Call::MountDevice {
                mount_dir: global(),
                device: device(),
                options,
            },
        ),
        "unmountdevice" => (
            String::new(),
            Call::UnmountDevice {
                mount_dir: global(),
            },
        ),
        "mount" => (
            format!("mkdir -p {pod} && "),
            Call::Mount {
                mount_dir: pod.clone(),
                options,
            },
        ),
        "unmount" => (String::new(), Call::Unmount { mount_dir: pod }),
        "expandvolume" => (
            String::new(),
            Call::ExpandVolume {
                options,
                mount_dir: global(),
                new_size: 2147483648,
                old_size: 1073741824,
            },
        ),
        "expandfs" => (
            String::new(),
            Call::ExpandFs {
                options,
                device: device(),
                mount_dir: format!("/var/lib/kubelet/pods/UID/volumes/flexvol~{b}/pv-1"),
                new_size: 2147483648,
                old_size: 1073741824,
            },
        ),
        _ => return String::new(),
    };
    let pretty = if matches!(call, Call::Init) {
        "--pretty "
    } else {
        ""
    };
    let words: Vec<String> = call.to_argv().iter().map(|w| shell_word(w)).collect();
    format!("{before}flexvol {pretty}{b} {}", words.join(" "))
}

/// `w` as one shell word for the examples: as is when it is made of path-like characters only (no
/// example word starts with `~`), else in single quotes.
fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.bytes()
            .all(|c| c.is_ascii_alphanumeric() || b"/._~=-:,@+".contains(&c));
    if plain {
        w.to_owned()
    } else {
        format!("'{}'", w.replace('\'', r"'\''"))
    }
}

fn print_backend_help(backend: Backend, verb: Option<&str>) -> i32 {
    let b = backend.name();
    if let Some(spec) = verb.and_then(verb::spec) {
        println!(
            "Usage: flexvol [--pretty] {b} {} {}\n",
            spec.name,
            spec.args.join(" ")
        );
        println!("{}", spec.about);
        let r = role(backend, spec.name);
        if !r.is_empty() {
            println!("{r}");
        }
        println!("\nExample:\n  {}", example(backend, spec.name));
        return 0;
    }
    if let Some(v) = verb {
        println!(
            "{v:?} is not a FlexVolume verb; kubelet would get {{\"status\":\"Not supported\"}}.\n"
        );
    }
    println!("Usage: flexvol [--pretty] {b} VERB [ARGS]...");
    println!("   or: <plugin-dir>/<vendor>~{b}/{b} VERB [ARGS]...   (how kubelet runs it)\n");
    println!("Verbs (flexvol {b} VERB --help for one):");
    for v in VERBS {
        println!("  {} {}", v.name, v.args.join(" "));
        println!("      {}", v.about);
        let r = role(backend, v.name);
        if !r.is_empty() {
            println!("      {r}");
        }
    }
    println!(
        "\nExample:\n  {}\n  {}",
        example(backend, "mount"),
        example(backend, "unmount")
    );
    0
}
