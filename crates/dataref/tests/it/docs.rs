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

/// Every key of `dataref.toml` and every environment variable, from the doc comments in
/// dataref-config (`raw.rs`, `env.rs`).
#[test]
fn the_configuration_reference_is_what_the_code_says() {
    check_generated(
        "docs/src/reference/config.md",
        &dataref_config::reference::config_markdown(),
    );
    check_generated(
        "docs/src/reference/environment.md",
        &dataref_config::reference::environment_markdown(),
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

/// Every `.rs` file under `crates/*/src` and `crates/*/tests`, and every page people read.
fn texts_that_name_commands() -> Vec<PathBuf> {
    let root = root();
    let mut files = book_pages();
    files.push(root.join("README.md"));
    files.push(root.join("crates/README.md"));
    let mut dirs = vec![root.join("crates")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a crates folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "target") {
                    dirs.push(path);
                }
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn every_command_a_hint_or_page_names_exists() {
    // A hint that sends people to a command that is not there ("dataref tools" was one)
    // costs them more than no hint. Every `dataref WORD …` in backticks, in the code (hints,
    // errors, docs comments) and the pages, is run with `--help`.
    let mut named: BTreeSet<Vec<String>> = BTreeSet::new();
    for file in texts_that_name_commands() {
        let text = std::fs::read_to_string(&file).expect("read a file");
        for piece in text.split("`dataref ").skip(1) {
            let words: Vec<String> = piece
                .split(['`', '\n'])
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .take(2)
                .take_while(|w| {
                    w.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                        && w.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                })
                .map(str::to_owned)
                .collect();
            if !words.is_empty() {
                named.insert(words);
            }
        }
    }
    assert!(named.len() > 5, "found the commands: {named:?}");
    let help = |args: &[String]| {
        std::process::Command::new(super::BIN)
            .args(args)
            .arg("--help")
            .output()
            .expect("run dataref --help")
    };
    let mut missing = Vec::new();
    for words in &named {
        let first = help(&words[..1]);
        if !first.status.success() {
            missing.push(words[0].clone());
            continue;
        }
        // A second word is checked only where the first takes subcommands (`store verify`,
        // `token new`); elsewhere it is an argument (`ask question`). `bench` forwards to
        // another executable, which checks its own.
        let has_commands = String::from_utf8_lossy(&first.stdout).contains("Commands:");
        if words.len() == 2 && has_commands && words[0] != "bench" && !help(words).status.success()
        {
            missing.push(words.join(" "));
        }
    }
    assert!(
        missing.is_empty(),
        "named in backticks but not a command: {missing:?}"
    );
}
