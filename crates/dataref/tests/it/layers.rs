//! The house's layering, read from `cargo metadata`: what `docs/src/architecture.md` says each crate
//! must not import is checked here, so the docs and the graph cannot drift apart.
//!
//! - Our crates' normal dependencies point one way, down [`STACK`].
//! - The release binary's whole tree holds neither the test support nor the benchmarks.
//! - Each heavy crate is a direct dependency of the crates that own it only.
//! - The tool framework does not pull in a tool's heavy dependencies.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

/// Bottom to top: a crate may depend (normally) only on crates before it.
const STACK: &[&str] = &[
    "dataref-protocol",
    "dataref-ops",
    "dataref-config",
    "dataref-workspace",
    "dataref-store",
    "dataref-sources",
    "dataref-sandbox",
    "dataref-sql",
    "dataref-export",
    "dataref-load",
    "dataref-chart",
    "dataref-tool",
    "dataref-builtins",
    "dataref-agent",
    "dataref-mcp",
    "dataref-http",
    "dataref-replica",
    "dataref-app",
    "dataref",
];

/// Outside the stack: dev and bench only; no crate of the stack may depend on them normally.
const ASIDE: &[&str] = &["dataref-test-support", "dataref-bench"];

/// Heavy crates and the only crates allowed to name them as normal dependencies.
const OWNERS: &[(&str, &[&str])] = &[
    ("rmcp", &["dataref-mcp"]),
    ("axum", &["dataref-http"]),
    ("hyper", &["dataref-http"]),
    ("ring", &["dataref-http"]),
    ("plotters", &["dataref-chart"]),
    ("parquet", &["dataref-export", "dataref-load"]),
    ("calamine", &["dataref-load"]),
    ("rust_xlsxwriter", &["dataref-export"]),
    (
        "rusqlite",
        &["dataref-store", "dataref-sources", "dataref-agent"],
    ),
    (
        "tokio-postgres",
        &[
            "dataref-sources",
            "dataref-replica",
            "dataref-test-support",
            "dataref-bench",
        ],
    ),
    ("mysql_async", &["dataref-sources", "dataref-bench"]),
    // The bench's baseline: the same object's GET alone, through the same client; a
    // `files` source on S3 (the client built in builtins, read by the engine in sql).
    (
        "object_store",
        &[
            "dataref-replica",
            "dataref-bench",
            "dataref-sql",
            "dataref-builtins",
        ],
    ),
    ("seccompiler", &["dataref-sandbox"]),
    ("datafusion", &["dataref-sql"]),
    ("minijinja", &["dataref-agent"]),
    ("clap", &["dataref", "dataref-bench"]),
    (
        "anyhow",
        &["dataref", "dataref-bench", "dataref-test-support"],
    ),
];

/// What the tool framework must not reach, even transitively: the agent runtime depends on
/// it without every tool's dependencies.
const FRAMEWORK_MUST_NOT_REACH: &[&str] = &[
    "dataref-sandbox",
    "dataref-sources",
    "dataref-sql",
    "dataref-chart",
    "dataref-export",
    "dataref-load",
    "datafusion",
    "plotters",
    "parquet",
    "rust_xlsxwriter",
    "calamine",
    "tokio-postgres",
    "mysql_async",
    "seccompiler",
    "rmcp",
];

struct Graph {
    /// Package name → its direct normal dependencies (by name).
    direct: BTreeMap<String, BTreeSet<String>>,
    /// Package name → the versions of it in the resolved graph.
    versions: BTreeMap<String, BTreeSet<String>>,
}

impl Graph {
    /// The graph for this host's platform, read once for all the tests here.
    fn get() -> &'static Self {
        static GRAPH: OnceLock<Graph> = OnceLock::new();
        GRAPH.get_or_init(Self::read)
    }

    fn read() -> Self {
        let rustc = Command::new("rustc")
            .arg("-vV")
            .output()
            .expect("run rustc -vV");
        let host = String::from_utf8_lossy(&rustc.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
            .expect("rustc -vV names the host");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked", "--offline"])
            .args(["--filter-platform", &host])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("run cargo metadata");
        assert!(
            out.status.success(),
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata JSON");
        let names: BTreeMap<&str, &str> = meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| {
                (
                    p["id"].as_str().expect("id"),
                    p["name"].as_str().expect("name"),
                )
            })
            .collect();
        let versions_of: BTreeMap<&str, &str> = meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| {
                (
                    p["id"].as_str().expect("id"),
                    p["version"].as_str().expect("version"),
                )
            })
            .collect();
        let mut direct = BTreeMap::new();
        let mut versions = BTreeMap::new();
        for node in meta["resolve"]["nodes"].as_array().expect("resolve nodes") {
            let id = node["id"].as_str().expect("node id");
            let name = names[id];
            versions
                .entry(name.to_owned())
                .or_insert_with(BTreeSet::new)
                .insert(versions_of[id].to_owned());
            let deps: BTreeSet<String> = node["deps"]
                .as_array()
                .expect("deps")
                .iter()
                .filter(|d| {
                    d["dep_kinds"]
                        .as_array()
                        .expect("dep_kinds")
                        .iter()
                        .any(|k| k["kind"].is_null())
                })
                .map(|d| names[d["pkg"].as_str().expect("pkg")].to_owned())
                .collect();
            direct
                .entry(name.to_owned())
                .or_insert_with(BTreeSet::new)
                .extend(deps);
        }
        Self { direct, versions }
    }

    fn deps(&self, name: &str) -> &BTreeSet<String> {
        self.direct
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not in the workspace's graph"))
    }

    fn reach(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![name.to_owned()];
        while let Some(n) = todo.pop() {
            for d in self.direct.get(&n).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    }
}

fn ours(name: &str) -> bool {
    name == "dataref" || name.starts_with("dataref-")
}

#[test]
fn our_crates_depend_one_way_down_the_stack() {
    let g = Graph::get();
    let workspace: BTreeSet<&String> = g.direct.keys().filter(|n| ours(n)).collect();
    for name in &workspace {
        assert!(
            STACK.contains(&name.as_str()) || ASIDE.contains(&name.as_str()),
            "{name} is in the workspace but not in this test's STACK or ASIDE: place it"
        );
    }
    let mut wrong = Vec::new();
    for (i, name) in STACK.iter().enumerate() {
        for dep in g.deps(name).iter().filter(|d| ours(d)) {
            match STACK.iter().position(|s| s == dep) {
                Some(j) if j < i => {}
                Some(_) => wrong.push(format!("{name} → {dep} points up the stack")),
                None => wrong.push(format!("{name} → {dep}: dev/bench-only crate")),
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
}

#[test]
fn the_release_binary_holds_no_test_support_and_no_benchmarks() {
    let g = Graph::get();
    g.deps("dataref");
    let reach = g.reach("dataref");
    for aside in ASIDE {
        assert!(!reach.contains(*aside), "dataref reaches {aside}");
    }
}

#[test]
fn heavy_crates_are_in_the_tree_once() {
    // Two arrows (or two DataFusions) would compile twice on 2 cores and could not pass a
    // batch from one to the other.
    let heavy = |n: &str| {
        n == "arrow"
            || n.starts_with("arrow-")
            || n == "parquet"
            || n.starts_with("datafusion")
            || [
                "sqlparser",
                "object_store",
                "tokio",
                "rustls",
                "reqwest",
                "hyper",
                "rmcp",
            ]
            .contains(&n)
    };
    let g = Graph::get();
    let twice: Vec<String> = g
        .versions
        .iter()
        .filter(|(name, v)| heavy(name) && v.len() > 1)
        .filter(|(name, v)| !(name.as_str() == "object_store" && object_store_pair(v)))
        .map(|(name, v)| format!("{name} {v:?}"))
        .collect();
    assert!(
        twice.is_empty(),
        "heavy crates in more than one version: {twice:?}"
    );
    assert!(
        Graph::get().versions.contains_key("datafusion"),
        "run_sql's engine is in the tree"
    );
}

/// The one allowed exception: DataFusion 55 pins object_store 0.13 for its object store
/// registry (local files only, no cloud client: a small crate), while `[shared]` needs 0.14,
/// whose S3 client uses the tree's reqwest (0.13's would bring a second reqwest, a far
/// larger build). Two versions, exactly these two minors, and no cloud feature on 0.13
/// (checked through its dependencies: no reqwest).
fn object_store_pair(versions: &BTreeSet<String>) -> bool {
    let minors: BTreeSet<&str> = versions
        .iter()
        .filter_map(|v| v.rsplit_once('.').map(|(minor, _)| minor))
        .collect();
    minors == BTreeSet::from(["0.13", "0.14"]) && versions.len() == 2 && {
        let reqwests = Graph::get()
            .versions
            .get("reqwest")
            .map_or(0, BTreeSet::len);
        reqwests == 1
    }
}

#[test]
fn heavy_crates_are_direct_dependencies_of_their_owners_only() {
    let g = Graph::get();
    let mut wrong = Vec::new();
    for (name, deps) in g.direct.iter().filter(|(n, _)| ours(n)) {
        for (heavy, owners) in OWNERS {
            if deps.contains(*heavy) && !owners.contains(&name.as_str()) {
                wrong.push(format!("{name} depends on {heavy} (owned by {owners:?})"));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_tool_framework_reaches_no_tools_heavy_dependencies() {
    let g = Graph::get();
    g.deps("dataref-tool");
    let reach = g.reach("dataref-tool");
    let found: Vec<_> = FRAMEWORK_MUST_NOT_REACH
        .iter()
        .filter(|n| reach.contains(**n))
        .collect();
    assert!(found.is_empty(), "dataref-tool reaches {found:?}");
}
