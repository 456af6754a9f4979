//! Provisioning roots in rancher local-path-provisioner's own `config.json` format.
//!
//! The keys are local-path's, at the top level of the flexvol node config (so its ConfigMap's
//! `config.json` is a valid flexvol config unchanged, and a flexvol config may carry them next to
//! its own keys):
//!
//! ```json
//! {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["/opt/local-path-provisioner"]},
//!                  {"node": "node-b", "paths": []}],
//!  "storageClassConfigs": {"ssd": {"nodePathMap": [{"node": "node-a", "paths": ["/mnt/ssd"]}]}}}
//! ```
//!
//! Rules, as local-path checks them: paths are absolute and not `/`; a node is listed at most once;
//! a path at most once per node; a config has `nodePathMap` or `sharedFileSystemPath`, not both.
//! A node that is not listed gets the `DEFAULT_PATH_FOR_NON_LISTED_NODES` paths, and no root at all
//! when there is no such entry; a node listed with `"paths": []` has no root. A class named in
//! `storageClassConfigs` uses only its own map. `sharedFileSystemPath` is a root on every node.
//! `setupCommand`, `teardownCommand` and `cmdTimeoutSeconds` are accepted (a local-path config
//! stays valid) but nothing runs them: flexvol creates and removes directories itself.
//!
//! The roots are not allowed roots of the hostPath driver: every root named anywhere in the file
//! ([`LocalPathConfig::all_roots`]) is refused to inline volumes, and a directory inside one is
//! served only to the PV the provisioner made it for (its `capabilityToken`, see
//! [`crate::node::capability`]).

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// local-path's name for "any node not listed".
pub(crate) const DEFAULT_NODE: &str = "DEFAULT_PATH_FOR_NON_LISTED_NODES";

/// The keys of local-path's `config.json` that flexvol reads.
pub(crate) const KEYS: [&str; 6] = [
    "nodePathMap",
    "sharedFileSystemPath",
    "storageClassConfigs",
    "setupCommand",
    "teardownCommand",
    "cmdTimeoutSeconds",
];

/// One `nodePathMap` entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(crate) struct NodePath {
    /// A node name, or [`DEFAULT_NODE`].
    pub node: String,
    /// The roots on that node; empty means none.
    #[serde(default)]
    pub(crate) paths: Vec<PathBuf>,
}

/// A set of roots: the top level of the file, or one `storageClassConfigs` entry.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct PathMap {
    /// Roots per node.
    pub(crate) node_path_map: Vec<NodePath>,
    /// One root shared by every node.
    pub(crate) shared_file_system_path: Option<PathBuf>,
}

/// The local-path part of the node config.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct LocalPathConfig {
    /// Roots per node for classes without their own entry.
    pub(crate) node_path_map: Vec<NodePath>,
    /// One root shared by every node (instead of `nodePathMap`).
    pub(crate) shared_file_system_path: Option<PathBuf>,
    /// Roots per StorageClass name.
    pub(crate) storage_class_configs: BTreeMap<String, PathMap>,
    /// local-path's helper-pod setup command: accepted, not run.
    pub(crate) setup_command: Option<String>,
    /// local-path's helper-pod teardown command: accepted, not run.
    pub(crate) teardown_command: Option<String>,
    /// local-path's helper-pod timeout: accepted, not used.
    pub(crate) cmd_timeout_seconds: Option<u64>,
}

impl PathMap {
    fn check(&self, what: &str) -> Result<(), String> {
        if !self.node_path_map.is_empty() && self.shared_file_system_path.is_some() {
            return Err(format!(
                "{what}: nodePathMap and sharedFileSystemPath cannot both be set; keep one"
            ));
        }
        let mut nodes = std::collections::BTreeSet::new();
        for np in &self.node_path_map {
            if np.node.is_empty() {
                return Err(format!(
                    "{what}: a nodePathMap entry has an empty node name"
                ));
            }
            if !nodes.insert(np.node.as_str()) {
                return Err(format!(
                    "{what}: node {:?} is listed twice in nodePathMap; merge its paths into one entry",
                    np.node
                ));
            }
            let mut seen = std::collections::BTreeSet::new();
            for p in &np.paths {
                check_root(what, p)?;
                if !seen.insert(p) {
                    return Err(format!(
                        "{what}: path {:?} is listed twice for node {:?}",
                        p.display().to_string(),
                        np.node
                    ));
                }
            }
        }
        if let Some(p) = &self.shared_file_system_path {
            check_root(what, p)?;
        }
        Ok(())
    }

    /// The roots this map gives `node`, in the order written.
    pub(crate) fn roots_for(&self, node: &str) -> Vec<PathBuf> {
        if let Some(p) = &self.shared_file_system_path {
            return vec![p.clone()];
        }
        let listed = self.node_path_map.iter().find(|e| e.node == node);
        let entry = listed.or_else(|| self.node_path_map.iter().find(|e| e.node == DEFAULT_NODE));
        entry.map(|e| e.paths.clone()).unwrap_or_default()
    }

    fn all(&self) -> impl Iterator<Item = &PathBuf> {
        self.node_path_map
            .iter()
            .flat_map(|e| e.paths.iter())
            .chain(self.shared_file_system_path.iter())
    }
}

fn check_root(what: &str, p: &Path) -> Result<(), String> {
    if !p.is_absolute() || p == Path::new("/") || crate::sys::paths::has_dotdot(p) {
        return Err(format!(
            "{what}: paths must be absolute directories other than / without \"..\", got {:?}",
            p.display().to_string()
        ));
    }
    Ok(())
}

impl LocalPathConfig {
    /// The roots `node` has for classes without an entry of their own (`nodePathMap` or
    /// `sharedFileSystemPath`).
    pub(crate) fn default_roots(&self, node: &str) -> Vec<PathBuf> {
        self.top().roots_for(node)
    }

    fn top(&self) -> PathMap {
        PathMap {
            node_path_map: self.node_path_map.clone(),
            shared_file_system_path: self.shared_file_system_path.clone(),
        }
    }

    /// Checks the rules in the module doc.
    pub(crate) fn check(&self) -> Result<(), String> {
        self.top().check("nodePathMap")?;
        for (class, m) in &self.storage_class_configs {
            m.check(&format!("storageClassConfigs.{class}"))?;
        }
        Ok(())
    }

    /// The roots for volumes of `class` on `node`.
    pub(crate) fn roots_for(&self, node: &str, class: &str) -> Vec<PathBuf> {
        match self.storage_class_configs.get(class) {
            Some(m) => m.roots_for(node),
            None => self.top().roots_for(node),
        }
    }

    /// Every root `node` has for some class: deciding whether it serves, and where deletes may act.
    pub(crate) fn node_roots(&self, node: &str) -> Vec<PathBuf> {
        let mut v = self.top().roots_for(node);
        for m in self.storage_class_configs.values() {
            v.extend(m.roots_for(node));
        }
        v.sort();
        v.dedup();
        v
    }

    /// Every root named anywhere in the file (for any node).
    pub(crate) fn all_roots(&self) -> Vec<PathBuf> {
        let top = self.top();
        let mut v: Vec<PathBuf> = top
            .all()
            .chain(self.storage_class_configs.values().flat_map(|m| m.all()))
            .cloned()
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// Splits local-path's keys off a JSON config object: returns them parsed and checked, and
    /// leaves the other keys in `obj` for the flexvol config proper.
    pub(crate) fn split_off(
        obj: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Option<Self>, String> {
        let mut lp = serde_json::Map::new();
        for k in KEYS {
            if let Some(v) = obj.remove(k) {
                lp.insert(k.to_owned(), v);
            }
        }
        if lp.is_empty() {
            return Ok(None);
        }
        let c: LocalPathConfig =
            serde_json::from_value(serde_json::Value::Object(lp)).map_err(|e| e.to_string())?;
        c.check()?;
        Ok(Some(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two `config.json` examples of local-path-provisioner's README, verbatim.
    pub(crate) const README_CONFIG: &str = r#"{
        "nodePathMap":[
        {
                "node":"DEFAULT_PATH_FOR_NON_LISTED_NODES",
                "paths":["/opt/local-path-provisioner"]
        },
        {
                "node":"yasker-lp-dev1",
                "paths":["/opt/local-path-provisioner", "/data1"]
        },
        {
                "node":"yasker-lp-dev3",
                "paths":[]
        }
        ]
}"#;
    pub(crate) const README_CLASS_CONFIG: &str = r#"{
        "storageClassConfigs":{
                "ssd":{
                        "nodePathMap":[
                        {
                                "node":"DEFAULT_PATH_FOR_NON_LISTED_NODES",
                                "paths":["/opt/local-path-provisioner-ssd"]
                        }
                        ]
                },
                "hdd":{
                        "sharedFileSystemPath": "/mnt/hdd"
                }
        }
}"#;

    fn parse(s: &str) -> Result<Option<LocalPathConfig>, String> {
        let mut v: serde_json::Value = serde_json::from_str(s).unwrap();
        LocalPathConfig::split_off(v.as_object_mut().unwrap())
    }

    #[test]
    fn readme_configs_give_the_roots_local_path_would() {
        let c = parse(README_CONFIG).unwrap().unwrap();
        assert_eq!(
            c.roots_for("yasker-lp-dev1", "local-path"),
            vec![
                PathBuf::from("/opt/local-path-provisioner"),
                PathBuf::from("/data1")
            ]
        );
        assert_eq!(
            c.roots_for("other", "x"),
            vec![PathBuf::from("/opt/local-path-provisioner")]
        );
        assert!(c.roots_for("yasker-lp-dev3", "x").is_empty());
        assert!(c.node_roots("yasker-lp-dev3").is_empty());
        assert_eq!(c.all_roots().len(), 2);

        let c = parse(README_CLASS_CONFIG).unwrap().unwrap();
        assert_eq!(
            c.roots_for("n", "ssd"),
            vec![PathBuf::from("/opt/local-path-provisioner-ssd")]
        );
        assert_eq!(c.roots_for("n", "hdd"), vec![PathBuf::from("/mnt/hdd")]);
        // A class the file does not name uses the top-level map, which is empty here.
        assert!(c.roots_for("n", "other").is_empty());
        assert_eq!(c.node_roots("n").len(), 2);
    }

    #[test]
    fn no_default_entry_means_no_root_for_unlisted_nodes() {
        let c = parse(r#"{"nodePathMap":[{"node":"a","paths":["/srv"]}]}"#)
            .unwrap()
            .unwrap();
        assert_eq!(c.roots_for("a", "x"), vec![PathBuf::from("/srv")]);
        assert!(c.roots_for("b", "x").is_empty());
    }

    #[test]
    fn local_path_rules_are_enforced() {
        for (bad, want) in [
            (
                r#"{"nodePathMap":[{"node":"a","paths":["rel"]}]}"#,
                "absolute",
            ),
            (
                r#"{"nodePathMap":[{"node":"a","paths":["/"]}]}"#,
                "other than /",
            ),
            (
                r#"{"nodePathMap":[{"node":"a","paths":["/x/../etc"]}]}"#,
                "..",
            ),
            (
                r#"{"nodePathMap":[{"node":"a","paths":["/x","/x"]}]}"#,
                "listed twice for node",
            ),
            (
                r#"{"nodePathMap":[{"node":"a","paths":[]},{"node":"a","paths":[]}]}"#,
                "listed twice in nodePathMap",
            ),
            (
                r#"{"nodePathMap":[{"node":"a","paths":["/x"]}],"sharedFileSystemPath":"/y"}"#,
                "cannot both",
            ),
            (r#"{"nodePathMap":[{"node":"a","pathz":[]}]}"#, "pathz"),
            (
                r#"{"storageClassConfigs":{"c":{"nodePathMap":[{"node":"a","paths":["x"]}]}}}"#,
                "storageClassConfigs.c",
            ),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
        assert_eq!(parse(r#"{"stateDir":"/s"}"#).unwrap(), None);
    }
}
