//! Who uses whom inside the library. Every `crate::` path in src/ (a `use`
//! line, a path in code, a doc link) names the top-level module it reaches;
//! a module may reach only the ones `MAY_USE` lists for it, so an arrow that
//! runs the wrong way fails here, naming the file, the line and the import.
//! docs/ARCHITECTURE.md ("Who uses whom") says the same map in words.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of src/ and the modules it may use. Read from the
/// bottom up, it is the layering: no module may use one listed below it.
const MAY_USE: &[(&str, &[&str])] = &[
    // Plain parts with nothing of Ondo's below them.
    ("error_kind", &[]),
    ("units", &[]),
    ("text_table", &[]),
    ("whole_file", &[]),
    ("environment", &[]),
    ("paths", &["environment"]),
    ("run_kinds", &[]),
    ("family", &[]),
    ("metrics", &[]),
    // Images into pixel values: no model, no MLX.
    ("vision", &[]),
    // The MLX side: models, generation, the synthetic models.
    (
        "engine",
        &[
            "environment",
            "error_kind",
            "family",
            "metrics",
            "run_kinds",
            "vision",
        ],
    ),
    ("synth", &["engine", "error_kind", "family", "paths"]),
    // Beside the engine, never loading a model: the hub and the history.
    (
        "hub",
        &[
            "environment",
            "error_kind",
            "family",
            "paths",
            "units",
            "whole_file",
        ],
    ),
    ("store", &["error_kind", "run_kinds"]),
    ("report", &["run_kinds", "store", "text_table", "units"]),
    // The one door into the engine, and what is built on it.
    (
        "session",
        &[
            "engine",
            "family",
            "hub",
            "metrics",
            "run_kinds",
            "store",
            "vision",
        ],
    ),
    ("app_settings", &["hub", "paths", "session", "store"]),
    (
        "resolve",
        &[
            "app_settings",
            "error_kind",
            "hub",
            "paths",
            "run_kinds",
            "session",
            "store",
            "synth",
        ],
    ),
    ("metallib", &["engine", "error_kind", "metrics"]),
    (
        "doctor",
        &[
            "engine",
            "environment",
            "hub",
            "metallib",
            "metrics",
            "paths",
            "session",
        ],
    ),
    (
        "demo",
        &["engine", "resolve", "run_kinds", "session", "store"],
    ),
    (
        "bench",
        &[
            "engine",
            "environment",
            "error_kind",
            "family",
            "hub",
            "resolve",
            "run_kinds",
            "session",
            "store",
            "synth",
            "vision",
        ],
    ),
    // A split model served for the app by Ondo's own command, as a child.
    (
        "served_split",
        &[
            "engine",
            "environment",
            "error_kind",
            "session",
            "whole_file",
        ],
    ),
    // The doors people and programs use.
    (
        "api",
        &[
            "app_settings",
            "engine",
            "error_kind",
            "family",
            "hub",
            "paths",
            "resolve",
            "run_kinds",
            "session",
            "store",
            "vision",
        ],
    ),
    (
        "cli",
        &[
            "api",
            "app_settings",
            "bench",
            "demo",
            "doctor",
            "engine",
            "environment",
            "error_kind",
            "family",
            "hub",
            "metallib",
            "metrics",
            "paths",
            "report",
            "resolve",
            "run_kinds",
            "session",
            "store",
            "synth",
            "text_table",
            "units",
            "whole_file",
        ],
    ),
];

/// One `crate::` path that leaves its own module.
#[derive(Debug, PartialEq)]
struct Reach {
    /// The top-level module (or crate-root item) the path names first.
    target: String,
    line: usize,
    /// The source line, trimmed, to show where it is.
    text: String,
}

/// Every top-level module the text's `crate::` paths name first, with its
/// line: `crate::a::b`, and each branch of `crate::{a::b, c}` (which may span
/// lines).
fn reaches(text: &str) -> Vec<Reach> {
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    let line_text = |line: usize| text.lines().nth(line - 1).unwrap_or("").trim().to_owned();
    let mut found = Vec::new();
    for (at, _) in text.match_indices("crate::") {
        let preceded_by_word = text[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        if preceded_by_word {
            continue;
        }
        let rest = &text[at + "crate::".len()..];
        let targets = match rest.strip_prefix('{') {
            Some(group) => top_level_names(group),
            None => leading_identifier(rest).into_iter().collect(),
        };
        let line = line_of(at);
        for target in targets {
            found.push(Reach {
                target,
                line,
                text: line_text(line),
            });
        }
    }
    found
}

/// The first name of each comma-separated branch of a `{...}` group,
/// `group` starting after its `{`.
fn top_level_names(group: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut depth = 0;
    let mut branch_start = true;
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => branch_start = true,
            c if branch_start && (c.is_alphanumeric() || c == '_') => {
                names.extend(leading_identifier(&group[at..]));
                branch_start = false;
            }
            _ => {}
        }
    }
    names
}

fn leading_identifier(text: &str) -> Option<String> {
    let name: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// A file's text before its test module: tests may build their fixtures
/// with any part of the crate (the engine's tests write tokenizers with
/// synth's writer), which is no arrow of the product's. Test modules sit at
/// the end of a file, after `#[cfg(test)]`.
fn product_code(text: &str) -> &str {
    match text.find("\n#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The modules `src/lib.rs` declares, and the items it re-exports with the
/// module each comes from (`pub use error_kind::ErrorKind`).
fn crate_root() -> (BTreeSet<String>, BTreeMap<String, String>) {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("src/lib.rs");
    let mut modules = BTreeSet::new();
    let mut reexports = BTreeMap::new();
    for line in lib.lines().map(str::trim) {
        let line = line.strip_prefix("pub ").unwrap_or(line);
        if let Some(name) = line.strip_prefix("mod ").and_then(|l| l.strip_suffix(';')) {
            modules.insert(name.trim().to_owned());
        } else if let Some(path) = line.strip_prefix("use ").and_then(|l| l.strip_suffix(';'))
            && let Some((module, item)) = path.rsplit_once("::")
        {
            reexports.insert(item.to_owned(), module.to_owned());
        }
    }
    (modules, reexports)
}

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable folder under src/") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

fn may_use() -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    MAY_USE
        .iter()
        .map(|(module, uses)| (*module, uses.iter().copied().collect()))
        .collect()
}

#[test]
fn every_module_uses_only_what_the_map_allows() {
    let (modules, reexports) = crate_root();
    let allowed = may_use();
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for file in &files {
        let relative = file.strip_prefix(src()).expect("a file under src/");
        let first = relative
            .components()
            .next()
            .expect("a path")
            .as_os_str()
            .to_string_lossy();
        let module = first.strip_suffix(".rs").unwrap_or(&first);
        // The crate root and the binary are the crate itself, not a module.
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(may) = allowed.get(module) else {
            wrong.push(format!(
                "src/{}: the module `{module}` is not in MAY_USE; add it there, with the \
                 modules it uses, and to docs/ARCHITECTURE.md",
                relative.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for reach in reaches(product_code(&text)) {
            checked += 1;
            let target = if modules.contains(&reach.target) {
                reach.target.clone()
            } else if let Some(from) = reexports.get(&reach.target) {
                from.clone()
            } else {
                // An item lib.rs itself defines (the allocator's name).
                continue;
            };
            if target == module || may.contains(target.as_str()) {
                continue;
            }
            wrong.push(format!(
                "src/{}:{}: `{}`: {module} may not use {target} (it may use: {})",
                relative.display(),
                reach.line,
                reach.text,
                may.iter().copied().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    assert!(checked > 100, "only {checked} crate:: paths found in src/");
    assert!(
        wrong.is_empty(),
        "imports the map does not allow (tests/boundaries.rs, MAY_USE; \
         docs/ARCHITECTURE.md, \"Who uses whom\"):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_map_names_every_module_and_only_modules() {
    let (modules, _) = crate_root();
    let allowed = may_use();
    for module in &modules {
        assert!(
            allowed.contains_key(module.as_str()),
            "src/lib.rs declares `{module}`, which MAY_USE does not place"
        );
    }
    for (module, uses) in &allowed {
        for used in uses {
            assert!(
                allowed.contains_key(used),
                "{module} may use `{used}`, which MAY_USE does not place"
            );
        }
    }
}

/// The map is a layering: following its arrows never leads back to where
/// they started, so no two modules need each other.
#[test]
fn the_map_has_no_cycle() {
    let allowed = may_use();
    // Depth-first, keeping the path walked so a cycle can be printed.
    fn walk<'a>(
        module: &'a str,
        allowed: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) {
        if let Some(at) = path.iter().position(|m| *m == module) {
            panic!(
                "MAY_USE has a cycle: {} -> {module}",
                path[at..].join(" -> ")
            );
        }
        if !done.insert(module) {
            return;
        }
        path.push(module);
        for used in allowed.get(module).into_iter().flatten() {
            walk(used, allowed, path, done);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for module in allowed.keys() {
        walk(module, &allowed, &mut Vec::new(), &mut done);
    }
}

#[test]
fn paths_are_found_in_use_lines_groups_and_code() {
    let text = "\
use crate::store::{RunRecord, Store};
use crate::{
    api::ServerConfig,
    engine::{LoadKind, stats::RunStats},
    ErrorKind,
};
pub(crate) fn f() -> u32 { crate::units::human_bytes(1); $crate::hub::x() }
/// See [`crate::report::write`]; subcrate::x is not ours.
";
    let found: Vec<(String, usize)> = reaches(text)
        .into_iter()
        .map(|r| (r.target, r.line))
        .collect();
    let expected = [
        ("store", 1),
        ("api", 2),
        ("engine", 2),
        ("ErrorKind", 2),
        ("units", 7),
        ("hub", 7),
        ("report", 8),
    ];
    assert_eq!(
        found,
        expected.map(|(t, l)| (t.to_owned(), l)).to_vec(),
        "{text}"
    );
}
