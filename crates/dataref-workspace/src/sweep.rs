//! Removing old files from one directory of the workspace (spill files past retention).

use dataref_protocol::Timestamp;
use rustix::fs::{self, AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::Workspace;
use crate::beneath::io_error;
use crate::error::WorkspacePathError;
use crate::path::normalize;

/// What [`Workspace::remove_old_files`] removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Swept {
    pub removed: usize,
    pub bytes: u64,
}

impl Workspace {
    /// Removes the regular files directly in the top-level directory `dir` whose last
    /// modification is before `cutoff`. Subdirectories, links and other entries are left
    /// alone, and `dir` itself is opened without following a link, so a link planted in its
    /// place cannot make the sweep remove files elsewhere. A missing `dir` sweeps nothing.
    ///
    /// With a mirror, the files are removed from the shared index (each only if it is still
    /// the version that was old) and their local copies then go with the sync of `dir`;
    /// age is the time each version was published.
    pub fn remove_old_files(
        &self,
        dir: &str,
        cutoff: Timestamp,
    ) -> Result<Swept, WorkspacePathError> {
        let rel = normalize(dir.as_bytes())?;
        if rel.is_empty() || rel.contains('/') {
            return Err(WorkspacePathError::NotADirectory { path: rel });
        }
        if let Some(mirror) = self.mirror() {
            return self.remove_old_shared(mirror.as_ref(), &rel, cutoff);
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match fs::openat(self.root_fd(), rel.as_str(), flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(Swept::default()),
            Err(Errno::NOTDIR | Errno::LOOP) => {
                return Err(WorkspacePathError::NotADirectory { path: rel });
            }
            Err(e) => return Err(io_error("open", &rel, e)),
        };
        let mut names = Vec::new();
        let mut listing = Dir::read_from(&fd).map_err(|e| io_error("list", &rel, e))?;
        while let Some(entry) = listing.read() {
            let entry = entry.map_err(|e| io_error("list", &rel, e))?;
            let name = entry.file_name().to_owned();
            if name.as_bytes() != b"." && name.as_bytes() != b".." {
                names.push(name);
            }
        }
        let mut swept = Swept::default();
        for name in names {
            let Ok(stat) = fs::statat(&fd, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) else {
                continue; // gone meanwhile
            };
            if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile
                || stat.st_mtime >= cutoff.0
            {
                continue;
            }
            match fs::unlinkat(&fd, name.as_c_str(), AtFlags::empty()) {
                Ok(()) => {
                    swept.removed += 1;
                    swept.bytes += stat.st_size as u64;
                }
                Err(Errno::NOENT) => {}
                Err(e) => return Err(io_error("remove a file in", &rel, e)),
            }
        }
        Ok(swept)
    }
}
