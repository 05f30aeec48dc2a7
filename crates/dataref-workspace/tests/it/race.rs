//! A directory is swapped for a link to the outside while operations are in flight. The
//! swap is one `renameat2(RENAME_EXCHANGE)`, so the name `d` is always either the real
//! directory or the link, and every interleaving is possible.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use dataref_workspace::{OpenMethod, Overwrite, WorkspacePathError as E};
use rustix::fs::{CWD, RenameFlags, renameat_with};

use crate::{Fixture, SECRET, read};

/// At least this many operations; more (up to [`TIME_LIMIT`]) if the swap was never seen
/// from both sides, so a starved swapper on a busy machine does not make a vacuous pass.
const ITERATIONS: usize = 2_000;
const TIME_LIMIT: Duration = Duration::from_secs(30);

/// Sets the flag when dropped, so a failing reader still stops the swapper (otherwise the
/// scope would wait for it forever).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// `work/d/` (real, holds `f`) and `work/d_link` (a link to the outside directory `out/`,
/// which also holds `f`); returns the fixture.
fn swap_fixture(absolute_link: bool) -> Fixture {
    let fx = Fixture::new();
    fx.file("d/f", "inside");
    fs::create_dir(fx.outside("out")).unwrap();
    fs::write(fx.outside("out/f"), SECRET).unwrap();
    if absolute_link {
        fx.link("d_link", fx.outside("out"));
    } else {
        fx.link("d_link", "../out");
    }
    fx
}

/// Swaps the names `a` and `b` under `root` until told to stop.
fn swapper(root: &Path, a: &str, b: &str, stop: &AtomicBool, swaps: &AtomicUsize) {
    let (a, b) = (root.join(a), root.join(b));
    while !stop.load(Ordering::Relaxed) {
        renameat_with(CWD, &a, CWD, &b, RenameFlags::EXCHANGE).unwrap();
        swaps.fetch_add(1, Ordering::Relaxed);
    }
}

fn is_eagain(e: &E) -> bool {
    matches!(e, E::Io { source, .. } if source.raw_os_error() == Some(rustix::io::Errno::AGAIN.raw_os_error()))
}

fn reads_never_see_the_outside(method: OpenMethod, absolute_link: bool) {
    let fx = swap_fixture(absolute_link);
    reads_race(&fx, method, "d/f", ("d", "d_link"), ITERATIONS);
}

/// Reads `requested` while `swap` is exchanged, asserting every read that succeeds saw
/// `inside`, and that both outcomes happened.
fn reads_race(
    fx: &Fixture,
    method: OpenMethod,
    requested: &str,
    swap: (&str, &str),
    iterations: usize,
) {
    let ws = fx.ws(method);
    let path = ws.resolve(requested).unwrap();
    let stop = AtomicBool::new(false);
    let swaps = AtomicUsize::new(0);
    let (mut inside, mut refused) = (0usize, 0usize);
    thread::scope(|s| {
        s.spawn(|| swapper(&fx.root, swap.0, swap.1, &stop, &swaps));
        let _stop = StopOnDrop(&stop);
        let start = Instant::now();
        let mut n = 0;
        while n < iterations || ((inside == 0 || refused == 0) && start.elapsed() < TIME_LIMIT) {
            match read(&ws, &path) {
                Ok(text) => {
                    assert_eq!(text, "inside", "read the outside file by {method:?}");
                    inside += 1;
                }
                Err(E::Escapes { .. }) => refused += 1,
                // Only `openat2` under constant renames, after its retries.
                Err(e) if is_eagain(&e) => refused += 1,
                Err(e) => panic!("unexpected error by {method:?}: {e:?}"),
            }
            n += 1;
        }
    });
    assert!(
        inside > 0 && refused > 0,
        "the race did not happen ({inside} inside, {refused} refused, {} swaps)",
        swaps.load(Ordering::Relaxed)
    );
}

#[test]
fn reads_race_a_relative_link_swap_openat2() {
    reads_never_see_the_outside(OpenMethod::Openat2, false);
}

#[test]
fn reads_race_a_relative_link_swap_nofollow_walk() {
    reads_never_see_the_outside(OpenMethod::NoFollowWalk, false);
}

#[test]
fn reads_race_an_absolute_link_swap_openat2() {
    reads_never_see_the_outside(OpenMethod::Openat2, true);
}

#[test]
fn reads_race_an_absolute_link_swap_nofollow_walk() {
    reads_never_see_the_outside(OpenMethod::NoFollowWalk, true);
}

/// The last component itself is swapped: a regular file for a link to an outside file.
/// The walk opens the leaf by name after looking at it, so this is the window its
/// `O_NOFOLLOW` closes.
fn final_component_race(method: OpenMethod) {
    let fx = Fixture::new();
    fx.file("f", "inside").link("f_link", "../outside.txt");
    // The window is two system calls wide, so more tries than for the directory swap.
    reads_race(&fx, method, "f", ("f", "f_link"), 10 * ITERATIONS);
}

#[test]
fn reads_race_a_final_file_swap_openat2() {
    final_component_race(OpenMethod::Openat2);
}

#[test]
fn reads_race_a_final_file_swap_nofollow_walk() {
    final_component_race(OpenMethod::NoFollowWalk);
}

/// Writes beneath `d/` while it is swapped: nothing may ever be created outside.
#[test]
fn writes_race_a_link_swap() {
    let fx = swap_fixture(false);
    let ws = fx.ws(OpenMethod::Auto);
    let stop = AtomicBool::new(false);
    let swaps = AtomicUsize::new(0);
    let (mut written, mut refused) = (0usize, 0usize);
    thread::scope(|s| {
        s.spawn(|| swapper(&fx.root, "d", "d_link", &stop, &swaps));
        let _stop = StopOnDrop(&stop);
        let start = Instant::now();
        let mut n = 0;
        while n < ITERATIONS / 4 || ((written == 0 || refused == 0) && start.elapsed() < TIME_LIMIT)
        {
            match ws.write_atomic(&format!("d/w{n}"), b"w", Overwrite::Replace) {
                Ok(_) => written += 1,
                Err(E::LinkInWritePath { .. }) => refused += 1,
                Err(e) => panic!("unexpected error: {e:?}"),
            }
            n += 1;
        }
    });
    let outside: Vec<_> = fs::read_dir(fx.outside("out"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(outside, ["f"], "a write escaped");
    assert!(
        written > 0 && refused > 0,
        "the race did not happen ({written} written, {refused} refused)"
    );
}
