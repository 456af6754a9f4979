//! kubelet's argv grammar: the one place a verb's argv is spelled and its arguments ordered, both
//! ways. [`Call::parse`] reads the argv kubelet passes; [`Call::to_argv`] writes one (what `flexvol
//! conformance`, `doctor` and `install` exec, and what `--help`'s examples show), and parsing what
//! it writes gives the call back. Other code names a verb only to compare with [`VerbSpec::name`]
//! or [`Call::verb`], never to build an argv.
//!
//! The grammar follows kubelet's Go code, not the community document (docs/protocol.md §2.0):
//! `detach` gets a volume name, `unmountdevice` a directory, `expandvolume`/`expandfs` take the
//! JSON first.
//! Parsing is positional and lenient where kubelet has varied: extra trailing arguments are
//! ignored, empty strings are accepted (kubelet passes `""` as the device of a non-attached
//! volume), and `isattached` accepts the JSON before or after the node name (1.6 sent it after).
//! A verb this grammar does not know is not an error: it is answered "Not supported".

/// One parsed kubelet call. Option JSON is kept as text; backends parse it into typed options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Call {
    /// `init`
    Init,
    /// `getvolumename <json>`
    GetVolumeName { options: String },
    /// `attach <json> <node>`
    Attach { options: String, node: String },
    /// `isattached <json> <node>` (or the 1.6 order `<node> <json>`)
    IsAttached { options: String, node: String },
    /// `detach <pvOrVolumeName> <node>`
    Detach { volume: String, node: String },
    /// `waitforattach <devicePath> <json>`
    WaitForAttach { device: String, options: String },
    /// `mountdevice <deviceMountPath> <devicePath> <json>`
    MountDevice {
        mount_dir: String,
        device: String,
        options: String,
    },
    /// `unmountdevice <deviceMountPath>`
    UnmountDevice { mount_dir: String },
    /// `mount <podVolumeDir> <json>`
    Mount { mount_dir: String, options: String },
    /// `unmount <podVolumeDir>`
    Unmount { mount_dir: String },
    /// `expandvolume <json> <deviceMountPath> <newSize> <oldSize>`
    ExpandVolume {
        options: String,
        mount_dir: String,
        new_size: u64,
        old_size: u64,
    },
    /// `expandfs <json> <devicePath> <podVolumeDir> <newSize> <oldSize>`
    ExpandFs {
        options: String,
        device: String,
        mount_dir: String,
        new_size: u64,
        old_size: u64,
    },
    /// Anything else, including legacy verbs such as `waitfordetach`.
    Unknown { verb: String },
}

/// What a verb looks like, for parsing arity and for `--help`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct VerbSpec {
    /// The exact verb kubelet sends.
    pub name: &'static str,
    /// Argument names after the verb, in kubelet's order.
    pub(crate) args: &'static [&'static str],
    /// Who calls it and what it does.
    pub(crate) about: &'static str,
}

/// Every verb kubelet and kube-controller-manager send, in lifecycle order.
pub(crate) const VERBS: &[VerbSpec] = &[
    VerbSpec {
        name: "init",
        args: &[],
        about: "Report the driver's capabilities. Called by kubelet and kube-controller-manager whenever they probe the plugin directory; fast and side-effect free.",
    },
    VerbSpec {
        name: "getvolumename",
        args: &["JSON"],
        about: "Unused by kubelet (the PV name is used instead): always answered \"Not supported\".",
    },
    VerbSpec {
        name: "attach",
        args: &["JSON", "NODE"],
        about: "Attach the volume to NODE. Runs in kube-controller-manager, not on the node; returns the device path.",
    },
    VerbSpec {
        name: "isattached",
        args: &["JSON", "NODE"],
        about: "Tell the attach/detach controller whether the volume is attached to NODE.",
    },
    VerbSpec {
        name: "detach",
        args: &["VOLUME", "NODE"],
        about: "Detach the volume (given by PV or volume name) from NODE. Runs in kube-controller-manager.",
    },
    VerbSpec {
        name: "waitforattach",
        args: &["DEVICE", "JSON"],
        about: "On the node: make the device ready and return its path. kubelet kills it after 10 minutes.",
    },
    VerbSpec {
        name: "mountdevice",
        args: &["MOUNT_DIR", "DEVICE", "JSON"],
        about: "On the node: format the device if it is provably blank and mount it at the global MOUNT_DIR.",
    },
    VerbSpec {
        name: "unmountdevice",
        args: &["MOUNT_DIR"],
        about: "On the node: unmount the global MOUNT_DIR (no options are given) and release the device.",
    },
    VerbSpec {
        name: "mount",
        args: &["MOUNT_DIR", "JSON"],
        about: "On the node: make the volume appear at the pod's MOUNT_DIR. The only verb that gets pod info and secrets.",
    },
    VerbSpec {
        name: "unmount",
        args: &["MOUNT_DIR"],
        about: "On the node: remove the volume from the pod's MOUNT_DIR (no options are given). Never touches the data.",
    },
    VerbSpec {
        name: "expandvolume",
        args: &["JSON", "MOUNT_DIR", "NEW_SIZE", "OLD_SIZE"],
        about: "Controller-side resize. Stock kube-controller-manager never calls it for FlexVolumes.",
    },
    VerbSpec {
        name: "expandfs",
        args: &["JSON", "DEVICE", "MOUNT_DIR", "NEW_SIZE", "OLD_SIZE"],
        about: "On the node: grow the volume and its filesystem to NEW_SIZE bytes.",
    },
];

/// Looks up a verb's spec by name.
pub(crate) fn spec(name: &str) -> Option<&'static VerbSpec> {
    VERBS.iter().find(|v| v.name == name)
}

/// Why an argv could not be parsed into a [`Call`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ArgError {
    /// No verb at all.
    #[error("no verb given: expected one of {}", VERBS.iter().map(|v| v.name).collect::<Vec<_>>().join(", "))]
    NoVerb,
    /// Fewer arguments than the verb needs.
    #[error("{verb} needs {need} argument(s) ({usage}) but got {got}")]
    TooFew {
        verb: &'static str,
        need: usize,
        got: usize,
        usage: String,
    },
    /// A size that is not a non-negative integer byte count.
    #[error("{verb}: {what} must be a byte count (digits only), got {value:?}")]
    BadSize {
        verb: &'static str,
        what: &'static str,
        value: String,
    },
}

impl Call {
    /// The verb as kubelet spelled it.
    pub(crate) fn verb(&self) -> &str {
        match self {
            Call::Init => "init",
            Call::GetVolumeName { .. } => "getvolumename",
            Call::Attach { .. } => "attach",
            Call::IsAttached { .. } => "isattached",
            Call::Detach { .. } => "detach",
            Call::WaitForAttach { .. } => "waitforattach",
            Call::MountDevice { .. } => "mountdevice",
            Call::UnmountDevice { .. } => "unmountdevice",
            Call::Mount { .. } => "mount",
            Call::Unmount { .. } => "unmount",
            Call::ExpandVolume { .. } => "expandvolume",
            Call::ExpandFs { .. } => "expandfs",
            Call::Unknown { verb } => verb,
        }
    }

    /// The arguments after `argv[0]` that kubelet would pass for this call, in kubelet's order: the
    /// inverse of [`Call::parse`] (`parse(&c.to_argv()) == Ok(c)` for every verb; an `Unknown`
    /// call is its verb alone). Sizes are written as decimal byte counts.
    pub(crate) fn to_argv(&self) -> Vec<String> {
        let verb = self.verb().to_owned();
        match self {
            Call::Init | Call::Unknown { .. } => vec![verb],
            Call::GetVolumeName { options } => vec![verb, options.clone()],
            Call::Attach { options, node } | Call::IsAttached { options, node } => {
                vec![verb, options.clone(), node.clone()]
            }
            Call::Detach { volume, node } => vec![verb, volume.clone(), node.clone()],
            Call::WaitForAttach { device, options } => vec![verb, device.clone(), options.clone()],
            Call::MountDevice {
                mount_dir,
                device,
                options,
            } => vec![verb, mount_dir.clone(), device.clone(), options.clone()],
            Call::UnmountDevice { mount_dir } | Call::Unmount { mount_dir } => {
                vec![verb, mount_dir.clone()]
            }
            Call::Mount { mount_dir, options } => vec![verb, mount_dir.clone(), options.clone()],
            Call::ExpandVolume {
                options,
                mount_dir,
                new_size,
                old_size,
            } => vec![
                verb,
                options.clone(),
                mount_dir.clone(),
                new_size.to_string(),
                old_size.to_string(),
            ],
            Call::ExpandFs {
                options,
                device,
                mount_dir,
                new_size,
                old_size,
            } => vec![
                verb,
                options.clone(),
                device.clone(),
                mount_dir.clone(),
                new_size.to_string(),
                old_size.to_string(),
            ],
        }
    }

    /// Parses the arguments after `argv[0]`: the verb, then its positional arguments.
    pub fn parse(args: &[String]) -> Result<Call, ArgError> {
        let (verb, rest) = args.split_first().ok_or(ArgError::NoVerb)?;
        let Some(spec) = spec(verb) else {
            return Ok(Call::Unknown { verb: verb.clone() });
        };
        if rest.len() < spec.args.len() {
            return Err(ArgError::TooFew {
                verb: spec.name,
                need: spec.args.len(),
                got: rest.len(),
                usage: format!("{} {}", spec.name, spec.args.join(" ")),
            });
        }
        let a = |i: usize| rest[i].clone();
        let size = |i: usize, what: &'static str| -> Result<u64, ArgError> {
            let v = &rest[i];
            if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
                return Err(ArgError::BadSize {
                    verb: spec.name,
                    what,
                    value: v.clone(),
                });
            }
            v.parse().map_err(|_| ArgError::BadSize {
                verb: spec.name,
                what,
                value: v.clone(),
            })
        };
        Ok(match spec.name {
            "init" => Call::Init,
            "getvolumename" => Call::GetVolumeName { options: a(0) },
            "attach" => Call::Attach {
                options: a(0),
                node: a(1),
            },
            "isattached" => {
                // 1.6-era kubelets sent `isattached <node> <json>`.
                if !looks_like_json(&rest[0]) && looks_like_json(&rest[1]) {
                    Call::IsAttached {
                        options: a(1),
                        node: a(0),
                    }
                } else {
                    Call::IsAttached {
                        options: a(0),
                        node: a(1),
                    }
                }
            }
            "detach" => Call::Detach {
                volume: a(0),
                node: a(1),
            },
            "waitforattach" => Call::WaitForAttach {
                device: a(0),
                options: a(1),
            },
            "mountdevice" => Call::MountDevice {
                mount_dir: a(0),
                device: a(1),
                options: a(2),
            },
            "unmountdevice" => Call::UnmountDevice { mount_dir: a(0) },
            "mount" => Call::Mount {
                mount_dir: a(0),
                options: a(1),
            },
            "unmount" => Call::Unmount { mount_dir: a(0) },
            "expandvolume" => Call::ExpandVolume {
                options: a(0),
                mount_dir: a(1),
                new_size: size(2, "NEW_SIZE")?,
                old_size: size(3, "OLD_SIZE")?,
            },
            "expandfs" => Call::ExpandFs {
                options: a(0),
                device: a(1),
                mount_dir: a(2),
                new_size: size(3, "NEW_SIZE")?,
                old_size: size(4, "OLD_SIZE")?,
            },
            _ => Call::Unknown { verb: verb.clone() },
        })
    }
}

fn looks_like_json(s: &str) -> bool {
    s.trim_start().starts_with('{')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Call, ArgError> {
        Call::parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn every_verb_parses_with_its_exact_arity() {
        for v in VERBS {
            let mut args = vec![v.name.to_string()];
            args.extend(v.args.iter().map(|a| {
                if a.contains("SIZE") {
                    "1".into()
                } else {
                    "{}".to_string()
                }
            }));
            let call = Call::parse(&args).unwrap();
            assert_eq!(call.verb(), v.name);
            // One argument short is an error that names the usage.
            if !v.args.is_empty() {
                let err = Call::parse(&args[..args.len() - 1]).unwrap_err();
                assert!(err.to_string().contains(v.name), "{err}");
            }
        }
    }

    /// One call of every verb, with distinct values in every field so a swapped pair shows.
    fn one_of_each() -> Vec<Call> {
        let o = || r#"{"kubernetes.io/pvOrVolumeName":"pv-1","path":"/srv/a b"}"#.to_string();
        vec![
            Call::Init,
            Call::GetVolumeName { options: o() },
            Call::Attach {
                options: o(),
                node: "node-1".into(),
            },
            Call::IsAttached {
                options: o(),
                node: "node-1".into(),
            },
            Call::Detach {
                volume: "pv-1".into(),
                node: "node-1".into(),
            },
            Call::WaitForAttach {
                device: "/dev/vg0/lv1".into(),
                options: o(),
            },
            Call::MountDevice {
                mount_dir: "/g/pv-1".into(),
                device: "".into(),
                options: o(),
            },
            Call::UnmountDevice {
                mount_dir: "/g/pv-1".into(),
            },
            Call::Mount {
                mount_dir: "/pods/u/volumes/v".into(),
                options: o(),
            },
            Call::Unmount {
                mount_dir: "/pods/u/volumes/v".into(),
            },
            Call::ExpandVolume {
                options: o(),
                mount_dir: "/g/pv-1".into(),
                new_size: 2147483648,
                old_size: 0,
            },
            Call::ExpandFs {
                options: o(),
                device: "/dev/vg0/lv1".into(),
                mount_dir: "/pods/u/volumes/v".into(),
                new_size: u64::MAX,
                old_size: 1073741824,
            },
            Call::Unknown {
                verb: "waitfordetach".into(),
            },
        ]
    }

    #[test]
    fn to_argv_is_the_inverse_of_parse_for_every_verb() {
        let calls = one_of_each();
        // Every verb of the grammar is covered.
        for v in VERBS {
            assert!(calls.iter().any(|c| c.verb() == v.name), "{}", v.name);
        }
        for c in calls {
            let argv = c.to_argv();
            assert_eq!(argv[0], c.verb());
            if let Some(spec) = spec(c.verb()) {
                assert_eq!(argv.len(), spec.args.len() + 1, "{argv:?}");
            }
            assert_eq!(Call::parse(&argv).as_ref(), Ok(&c), "{argv:?}");
        }
    }

    #[test]
    fn isattached_accepts_both_orders() {
        let modern = p(&["isattached", r#"{"a":"b"}"#, "node-1"]).unwrap();
        let legacy = p(&["isattached", "node-1", r#"{"a":"b"}"#]).unwrap();
        assert_eq!(modern, legacy);
        assert_eq!(
            modern,
            Call::IsAttached {
                options: r#"{"a":"b"}"#.into(),
                node: "node-1".into()
            }
        );
    }

    #[test]
    fn extra_args_and_empty_strings_are_tolerated() {
        assert_eq!(
            p(&["mountdevice", "/m", "", "{}", "extra"]).unwrap(),
            Call::MountDevice {
                mount_dir: "/m".into(),
                device: "".into(),
                options: "{}".into()
            }
        );
        assert_eq!(p(&["init", "x", "y"]).unwrap(), Call::Init);
    }

    #[test]
    fn unknown_verbs_are_not_errors() {
        assert_eq!(
            p(&["waitfordetach", "/dev/x"]).unwrap(),
            Call::Unknown {
                verb: "waitfordetach".into()
            }
        );
        assert_eq!(
            p(&["--bogus"]).unwrap(),
            Call::Unknown {
                verb: "--bogus".into()
            }
        );
        assert_eq!(p(&[]).unwrap_err(), ArgError::NoVerb);
    }

    #[test]
    fn expand_argument_order_and_sizes() {
        assert_eq!(
            p(&[
                "expandfs",
                "{}",
                "/dev/vg/lv",
                "/pod",
                "2147483648",
                "1073741824"
            ])
            .unwrap(),
            Call::ExpandFs {
                options: "{}".into(),
                device: "/dev/vg/lv".into(),
                mount_dir: "/pod".into(),
                new_size: 2147483648,
                old_size: 1073741824
            }
        );
        assert!(matches!(
            p(&["expandfs", "{}", "d", "/p", "-1", "0"]),
            Err(ArgError::BadSize { .. })
        ));
        assert!(matches!(
            p(&["expandvolume", "{}", "/m", "1Gi", "0"]),
            Err(ArgError::BadSize { .. })
        ));
    }
}
