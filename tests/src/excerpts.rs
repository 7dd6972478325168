//! The guide to writing an operator (docs/operator.md) quotes code that is compiled and tested:
//! each of its Rust examples names, in a `<!-- from: path -->` line above it, the file it is taken
//! from, and is that file's text, its lines in order, where a line `// ...` stands for any lines
//! left out. Indentation may differ (an excerpt from inside a module or an impl is dedented), and
//! blank lines are not compared. A change to the code that the guide does not follow fails here.

use std::path::Path;

const FROM: &str = "<!-- from: ";
const ELIDED: &str = "// ...";

/// What is wrong with the Rust examples of `doc`, read against the files under `root`: one line
/// a problem, empty when every example is an excerpt of the file it names.
pub fn problems(doc: &str, root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let mut source: Option<String> = None;
    let mut lines = doc.lines().enumerate();
    while let Some((number, line)) = lines.next() {
        if let Some(path) = line.strip_prefix(FROM).and_then(|l| l.strip_suffix(" -->")) {
            source = Some(path.to_owned());
            continue;
        }
        if !line.trim().starts_with("```") {
            continue;
        }
        if !line.trim().starts_with("```rust") {
            // A `from` line names the file of the next block only, whatever its language.
            source = None;
            continue;
        }
        let example: Vec<&str> = lines
            .by_ref()
            .map(|(_, l)| l)
            .take_while(|l| l.trim() != "```")
            .collect();
        let Some(path) = source.take() else {
            problems.push(format!(
                "line {}: a Rust example that names no file",
                number + 1
            ));
            continue;
        };
        match std::fs::read_to_string(root.join(&path)) {
            Ok(text) => {
                if let Some(line) = first_line_not_in(&example, &text) {
                    problems.push(format!(
                        "line {}: the example from {path} says {line:?}, which is not there",
                        number + 1
                    ));
                }
            }
            Err(e) => problems.push(format!("line {}: {path}: {e}", number + 1)),
        }
    }
    problems
}

/// The first line of `example` that `text` does not have where the example puts it: after a
/// `// ...` anywhere further on, else right after the line before. A line that comes more than once
/// (every operator has a `fn states`) is tried at each place it comes.
fn first_line_not_in<'a>(example: &[&'a str], text: &str) -> Option<&'a str> {
    let source: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let wanted: Vec<&str> = example
        .iter()
        .map(|l| l.trim())
        .filter(|l| !l.is_empty())
        .collect();
    let matched = longest_match(&wanted, &source, 0, true);
    let line = wanted.iter().filter(|l| **l != ELIDED).nth(matched)?;
    example.iter().copied().find(|l| l.trim() == *line)
}

/// How many of `wanted`'s lines (elisions not counted) match `source` from `from` on, at best.
fn longest_match(wanted: &[&str], source: &[&str], from: usize, skip: bool) -> usize {
    let Some((&line, rest)) = wanted.split_first() else {
        return 0;
    };
    if line == ELIDED {
        return longest_match(rest, source, from, true);
    }
    let places: Vec<usize> = if skip {
        (from..source.len())
            .filter(|&i| source[i] == line)
            .collect()
    } else {
        (source.get(from) == Some(&line))
            .then_some(from)
            .into_iter()
            .collect()
    };
    places
        .into_iter()
        .map(|i| 1 + longest_match(rest, source, i + 1, false))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> &'static Path {
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
    }

    #[test]
    fn every_rust_example_of_the_operator_guide_is_an_excerpt_of_the_code_it_names() {
        let doc = std::fs::read_to_string(root().join("docs/operator.md")).unwrap();
        assert!(doc.matches("```rust").count() >= 5, "the guide's examples");
        assert_eq!(problems(&doc, root()), Vec::<String>::new());
    }

    #[test]
    fn an_example_that_drifted_from_its_code_or_names_none_is_found() {
        let file = "tests/src/excerpts.rs";
        let faithful = format!("{FROM}{file} -->\n```rust\nconst FROM: &str = \"<!-- from: \";\n// ...\nfn first_line_not_in<'a>(example: &[&'a str], text: &str) -> Option<&'a str> {{\n```\n");
        assert_eq!(problems(&faithful, root()), Vec::<String>::new());
        let drifted = faithful.replace("Option<&'a str>", "Option<String>");
        assert_eq!(problems(&drifted, root()).len(), 1);
        let reordered = format!("{FROM}{file} -->\n```rust\nconst ELIDED: &str = \"// ...\";\nconst FROM: &str = \"<!-- from: \";\n```\n");
        assert_eq!(problems(&reordered, root()).len(), 1);
        let unnamed = "```rust\nfn main() {}\n```\n";
        assert_eq!(problems(unnamed, root()).len(), 1);
    }
}
