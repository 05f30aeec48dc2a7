//! What people read stays whole: the README is short, the book lists every page, and every
//! link between our own pages (and every `#anchor`) leads somewhere.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    [env!("CARGO_MANIFEST_DIR"), "..", ".."].iter().collect()
}

/// The book's pages (`docs/src` and its folders), sorted.
fn book_pages() -> Vec<PathBuf> {
    let mut pages = Vec::new();
    let mut dirs = vec![root().join("docs/src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a docs folder") {
            let path = entry.expect("a docs entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// A heading's anchor as GitHub and mdBook make it: lower case, punctuation dropped,
/// spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .into_iter()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// Every `[label](target)` and `![alt](target)` outside code: the targets.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_link_between_our_pages_leads_somewhere() {
    let root = root();
    let mut files = vec![root.join("README.md"), root.join("crates/README.md")];
    files.extend(book_pages());
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read a page");
        let dir = file.parent().expect("a page's folder");
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let linked: PathBuf = if path.is_empty() {
                file.clone()
            } else {
                dir.join(path)
            };
            if !linked.exists() {
                broken.push(format!("{}: {target} (no such file)", show(file)));
                continue;
            }
            if let Some(anchor) = anchor {
                let text = std::fs::read_to_string(&linked).unwrap_or_default();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{}: {target} (no such heading)", show(file)));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 20,
        "only {checked} links found: is the parser right?"
    );
}

fn show(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn the_book_lists_every_page_and_the_readme_stays_short() {
    let root = root();
    let summary = std::fs::read_to_string(root.join("docs/src/SUMMARY.md")).expect("SUMMARY");
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    let src = root.join("docs/src");
    for page in book_pages() {
        let name = page
            .strip_prefix(&src)
            .expect("a page under docs/src")
            .to_string_lossy()
            .into_owned();
        if name != "SUMMARY.md" {
            assert!(
                listed.contains(&name),
                "docs/src/SUMMARY.md does not list {name}"
            );
        }
    }
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let lines = readme.lines().count();
    assert!(
        lines < 300,
        "the README is {lines} lines: it is the front door (what it is, the two commands, a \
         short tour, links); move the rest into docs/src"
    );
    assert!(
        readme.contains("scripts/demo") && readme.contains("scripts/test"),
        "the README's two commands"
    );
}

/// A reference page generated from the code (`--help`, `tools/list`): the committed file must
/// be what the code generates now, as uv's `generate-all --check`. `DATAREF_UPDATE_DOCS=1`
/// writes it instead.
pub(crate) fn check_generated(rel: &str, generated: &str) {
    let path = root().join(rel);
    if std::env::var_os("DATAREF_UPDATE_DOCS").is_some() {
        std::fs::write(&path, generated).expect("write the generated page");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{rel} is not what the code generates now; regenerate it with \
         `DATAREF_UPDATE_DOCS=1 cargo test --test it` in crates/dataref and commit it"
    );
}

/// `crates/README.md` names every crate of the workspace, once, in two lines at most (the
/// detail lives in the architecture page and in each crate's docs).
#[test]
fn the_crate_list_is_whole_and_short() {
    let root = root();
    let text = std::fs::read_to_string(root.join("crates/README.md")).expect("crates/README");
    let mut entries: Vec<(String, usize)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("- **`") {
            let name = rest.split('`').next().unwrap_or_default().to_owned();
            entries.push((name, 1));
        } else if line.starts_with("  ")
            && !line.trim().is_empty()
            && let Some(last) = entries.last_mut()
        {
            last.1 += 1;
        }
    }
    let mut crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .expect("read crates/")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .map(|p| {
            p.file_name()
                .expect("a name")
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    crates.sort();
    let mut named: Vec<String> = entries.iter().map(|(n, _)| n.clone()).collect();
    named.sort();
    assert_eq!(named, crates, "crates/README.md lists each crate once");
    for (name, lines) in &entries {
        assert!(
            *lines <= 2,
            "{name} takes {lines} lines in crates/README.md: two at most, the rest goes to \
             docs/src/architecture.md or the crate's docs"
        );
    }
}
