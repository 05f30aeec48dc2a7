//! The open workspaces of a server for many principals: at most [`CAP`] kept, least
//! recently used closed first.
//!
//! A workspace is an open directory fd. Keeping one per principal ever seen would let
//! callers who can mint principals (JWTs name any number) run the process out of
//! descriptors, after which every principal's calls fail. Bounded, the cache costs at most
//! [`CAP`] descriptors; a workspace closed here is opened again on its principal's next
//! call, and one a call still holds stays open until that call ends (it is only dropped
//! from the cache).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use dataref_protocol::Principal;
use dataref_workspace::Workspace;

/// Workspaces kept open at most (one descriptor each).
pub(crate) const CAP: usize = 256;

pub(crate) struct Cache {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    by_principal: HashMap<Principal, Entry>,
    /// Bumped on every use: the entry with the smallest `used` is the least recent.
    clock: u64,
}

struct Entry {
    workspace: Arc<Workspace>,
    used: u64,
}

impl Cache {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `principal`'s workspace, opened with `open` when it is not cached. When the cache
    /// is full, the least recently used workspace no call holds makes room; when every
    /// cached one is in use, the new one is handed out without being kept.
    pub(crate) fn get_or_open<E>(
        &self,
        principal: &Principal,
        open: impl FnOnce() -> Result<Workspace, E>,
    ) -> Result<Arc<Workspace>, E> {
        if let Some(w) = self.lock().touch(principal) {
            return Ok(w);
        }
        // Opened outside the lock (a few syscalls); of two racing opens the first kept wins.
        let opened = Arc::new(open()?);
        let mut inner = self.lock();
        if let Some(w) = inner.touch(principal) {
            return Ok(w);
        }
        if inner.by_principal.len() >= self.cap && !inner.evict_one() {
            return Ok(opened);
        }
        inner.clock += 1;
        let used = inner.clock;
        inner.by_principal.insert(
            principal.clone(),
            Entry {
                workspace: opened.clone(),
                used,
            },
        );
        Ok(opened)
    }

    /// Closes every cached workspace no call is using.
    pub(crate) fn forget_idle(&self) {
        self.lock()
            .by_principal
            .retain(|_, e| Arc::strong_count(&e.workspace) > 1);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_principal.len()
    }
}

impl Inner {
    fn touch(&mut self, principal: &Principal) -> Option<Arc<Workspace>> {
        self.clock += 1;
        let now = self.clock;
        let e = self.by_principal.get_mut(principal)?;
        e.used = now;
        Some(e.workspace.clone())
    }

    /// Drops the least recently used entry no call holds; `false` when all are held.
    fn evict_one(&mut self) -> bool {
        let victim = self
            .by_principal
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.workspace) == 1)
            .min_by_key(|(_, e)| e.used)
            .map(|(p, _)| p.clone());
        match victim {
            Some(p) => {
                self.by_principal.remove(&p);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(
        home: &std::path::Path,
        name: &str,
    ) -> Result<Workspace, dataref_workspace::WorkspaceError> {
        Workspace::for_principal(
            home,
            &Principal::new(name).unwrap_or_else(|e| panic!("{e}")),
        )
    }

    fn p(name: &str) -> Principal {
        Principal::new(name).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_least_recently_used_idle_workspace_makes_room() {
        let home = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cache = Cache::new(2);
        let get = |name: &str| {
            cache
                .get_or_open(&p(name), || open(home.path(), name))
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let a = get("a");
        drop(get("b"));
        // `a` is in use, so `b` (idle) goes even though `a` is older.
        drop(get("c"));
        assert_eq!(cache.len(), 2);
        assert!(Arc::ptr_eq(&a, &get("a")), "a stayed cached");
        drop(a);
        // All held: a new principal is served without being kept.
        let held_a = get("a");
        let held_c = get("c");
        let d = get("d");
        assert_eq!(cache.len(), 2);
        assert!(!Arc::ptr_eq(&d, &get("d")), "d was not kept");
        drop((held_a, held_c, d));
        cache.forget_idle();
        assert_eq!(cache.len(), 0);
    }
}
