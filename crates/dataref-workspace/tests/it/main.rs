//! Integration tests of dataref-workspace against real directory trees in temporary
//! directories: the resolution table, races against link swaps, a property test over
//! random paths, listings and atomic writes, and two workspaces sharing one mirror.
#![expect(
    clippy::disallowed_methods,
    reason = "fixtures build files and hostile trees directly, outside the code under test"
)]
// `allow-unwrap-in-tests` covers `#[test]` functions, not the helpers they share.
#![expect(
    clippy::unwrap_used,
    reason = "test helpers fail by panicking, like the tests that call them"
)]

mod list;
mod mirror;
mod prop;
mod quota;
mod race;
mod resolve;
mod untrusted;
mod write;

use std::fs;
use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use dataref_workspace::{OpenMethod, Workspace, WorkspacePath, WorkspacePathError};

/// Both ways of opening beneath the root; every behaviour test runs with each.
pub const METHODS: [OpenMethod; 2] = [OpenMethod::Openat2, OpenMethod::NoFollowWalk];

/// A temporary directory holding the workspace root `work/` and, beside it, things that
/// must stay out of reach: `work-secret/x` (a sibling whose name starts with the root's)
/// and `outside.txt`.
pub struct Fixture {
    pub tmp: tempfile::TempDir,
    pub root: PathBuf,
}

pub const SECRET: &str = "SECRET";

impl Fixture {
    pub(crate) fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("work");
        fs::create_dir(&root).unwrap();
        fs::create_dir(tmp.path().join("work-secret")).unwrap();
        fs::write(tmp.path().join("work-secret/x"), SECRET).unwrap();
        fs::write(tmp.path().join("outside.txt"), SECRET).unwrap();
        Self { tmp, root }
    }

    pub fn ws(&self, method: OpenMethod) -> Workspace {
        Workspace::open(&self.root)
            .unwrap()
            .with_open_method(method)
    }

    pub fn outside(&self, rel: &str) -> PathBuf {
        self.tmp.path().join(rel)
    }

    pub fn file(&self, rel: &str, content: &str) -> &Self {
        let path = self.root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(path, content).unwrap();
        self
    }

    pub fn dir(&self, rel: &str) -> &Self {
        fs::create_dir_all(self.root.join(rel)).unwrap();
        self
    }

    /// A link at `rel` (inside the root) pointing at `target`, verbatim.
    pub fn link(&self, rel: &str, target: impl AsRef<Path>) -> &Self {
        symlink(target, self.root.join(rel)).unwrap();
        self
    }
}

pub fn read(ws: &Workspace, path: &WorkspacePath) -> Result<String, WorkspacePathError> {
    let mut text = String::new();
    ws.open_read(path)?.read_to_string(&mut text).unwrap();
    Ok(text)
}

/// Resolve and read in one go.
pub fn read_str(ws: &Workspace, requested: &str) -> Result<String, WorkspacePathError> {
    read(ws, &ws.resolve(requested)?)
}
