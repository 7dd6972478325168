//! The state signature lock file: every operator, its states, their kinds, types and structures,
//! and the operator's signature. Checked in CI, so that a change of state structure — which
//! starts the operator's state afresh unless a migration carries it over — is never an accident.

use std::collections::BTreeMap;

use super::signature::{diff, Shape, Untraceable};
use super::{state_signature, StateDescriptor};

/// The lock file's path, relative to where `keyway signatures` runs unless `--lock` says otherwise.
pub const LOCK_FILE: &str = "state-signatures.lock";

const HEADER: &str = "\
# keyway state signatures. An operator's signature is part of the DynamoDB key of its state:
# when it changes, the operator's state starts afresh, unless a migration carries it over.
# Regenerate on purpose with: cargo run --release -- signatures --update
";

/// One state as the lock file records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockedState {
    /// The state's kind: `value`, `list`, `map` or `broadcast`.
    pub kind: String,
    /// The Rust type stored.
    pub type_name: String,
    /// The type's structure.
    pub shape: Shape,
}

/// One operator as the lock file records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockedOperator {
    /// The operator's state signature.
    pub signature: String,
    /// Its states, by name.
    pub states: BTreeMap<String, LockedState>,
}

/// The lock file cannot be written or read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum LockError {
    /// A state's structure cannot be traced, so it has no entry to write.
    #[error("operator {operator}, state {state}: {problem}")]
    Untraceable {
        /// The operator's name.
        operator: String,
        /// The state's name.
        state: String,
        /// Why its structure cannot be traced.
        problem: Untraceable,
    },
    /// A line of the lock file does not parse.
    #[error("{LOCK_FILE}:{line}: {problem}: {text:?}")]
    Malformed {
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        problem: &'static str,
        /// The line as it is.
        text: String,
    },
}

/// The lock entries of operators, by name.
pub fn entries(
    operators: &[(String, Vec<StateDescriptor>)],
) -> Result<BTreeMap<String, LockedOperator>, LockError> {
    operators
        .iter()
        .map(|(name, states)| {
            let locked = states
                .iter()
                .map(|s| {
                    let shape = s.shape.clone().map_err(|problem| LockError::Untraceable {
                        operator: name.clone(),
                        state: s.name.to_owned(),
                        problem,
                    })?;
                    Ok((
                        s.name.to_owned(),
                        LockedState {
                            kind: s.kind.as_str().to_owned(),
                            type_name: s.type_name.to_owned(),
                            shape,
                        },
                    ))
                })
                .collect::<Result<_, LockError>>()?;
            Ok((
                name.clone(),
                LockedOperator {
                    signature: state_signature(states),
                    states: locked,
                },
            ))
        })
        .collect()
}

/// The lock file's text for `entries`: a header, then each operator with its states and their
/// type paths.
pub fn render(entries: &BTreeMap<String, LockedOperator>) -> String {
    let mut out = String::from(HEADER);
    for (name, op) in entries {
        out.push_str(&format!("\noperator {name} {}\n", op.signature));
        for (state, locked) in &op.states {
            out.push_str(&format!(
                "  state {state} {} {}\n",
                locked.kind, locked.type_name
            ));
            for (path, ty) in &locked.shape.lines {
                out.push_str(&format!("    {path}: {ty}\n"));
            }
        }
    }
    out
}

/// The entries of a lock file's text, as `render` writes it (comment and blank lines skipped).
pub fn parse(text: &str) -> Result<BTreeMap<String, LockedOperator>, LockError> {
    let mut entries: BTreeMap<String, LockedOperator> = BTreeMap::new();
    let mut operator: Option<String> = None;
    let mut state: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let at = |problem: &'static str| LockError::Malformed {
            line: n + 1,
            problem,
            text: line.to_owned(),
        };
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(rest) = line.strip_prefix("operator ") {
            let (name, signature) = rest
                .split_once(' ')
                .ok_or_else(|| at("expected `operator NAME SIGNATURE`"))?;
            entries.insert(
                name.to_owned(),
                LockedOperator {
                    signature: signature.to_owned(),
                    states: BTreeMap::new(),
                },
            );
            operator = Some(name.to_owned());
            state = None;
        } else if let Some(rest) = line.strip_prefix("  state ") {
            let mut parts = rest.splitn(3, ' ');
            let (Some(name), Some(kind), Some(type_name)) =
                (parts.next(), parts.next(), parts.next())
            else {
                return Err(at("expected `  state NAME KIND TYPE`"));
            };
            let op = operator
                .as_ref()
                .and_then(|o| entries.get_mut(o))
                .ok_or_else(|| at("a state outside an operator"))?;
            let shape = Shape {
                lines: BTreeMap::new(),
            };
            op.states.insert(
                name.to_owned(),
                LockedState {
                    kind: kind.to_owned(),
                    type_name: type_name.to_owned(),
                    shape,
                },
            );
            state = Some(name.to_owned());
        } else if let Some(rest) = line.strip_prefix("    ") {
            let (path, ty) = rest
                .split_once(": ")
                .ok_or_else(|| at("expected `    PATH: TYPE`"))?;
            let locked = operator
                .as_ref()
                .zip(state.as_ref())
                .and_then(|(o, s)| entries.get_mut(o)?.states.get_mut(s))
                .ok_or_else(|| at("a type path outside a state"))?;
            locked.shape.lines.insert(path.to_owned(), ty.to_owned());
        } else {
            return Err(at("unexpected line"));
        }
    }
    Ok(entries)
}

/// What differs between the lock file and the operators, named by operator, state and type path;
/// empty when they agree.
pub fn check(
    locked: &BTreeMap<String, LockedOperator>,
    current: &BTreeMap<String, LockedOperator>,
) -> Vec<String> {
    let mut changes = Vec::new();
    for (name, now) in current {
        let Some(before) = locked.get(name) else {
            changes.push(format!("operator {name}: new, signature {}", now.signature));
            continue;
        };
        let mut details = Vec::new();
        for (state, s) in &now.states {
            match before.states.get(state) {
                None => details.push(format!(
                    "state {state}: added ({} of {})",
                    s.kind, s.type_name
                )),
                Some(b) if b.kind != s.kind => details.push(format!(
                    "state {state}: kind {} changed to {}",
                    b.kind, s.kind
                )),
                Some(b) => details.extend(
                    diff(&b.shape, &s.shape)
                        .into_iter()
                        .map(|d| format!("state {state}: {d}")),
                ),
            }
        }
        for state in before
            .states
            .keys()
            .filter(|s| !now.states.contains_key(*s))
        {
            details.push(format!("state {state}: removed"));
        }
        if before.signature != now.signature || !details.is_empty() {
            changes.push(format!(
                "operator {name}: signature {} changed to {}",
                before.signature, now.signature
            ));
            changes.extend(details.into_iter().map(|d| format!("  {d}")));
        }
    }
    for name in locked.keys().filter(|n| !current.contains_key(*n)) {
        changes.push(format!("operator {name}: no longer exists"));
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::{ListState, ValueState};

    fn operators(count_type_changed: bool) -> Vec<(String, Vec<StateDescriptor>)> {
        const COUNT: ValueState<u64> = ValueState::new("count");
        const COUNT_SIGNED: ValueState<i64> = ValueState::new("count");
        const SEEN: ListState<(String, u32)> = ListState::new("seen");
        let count = if count_type_changed {
            COUNT_SIGNED.descriptor()
        } else {
            COUNT.descriptor()
        };
        vec![("counter".into(), vec![count, SEEN.descriptor()])]
    }

    #[test]
    fn a_rendered_lock_parses_back_to_the_same_entries() {
        let current = entries(&operators(false)).unwrap();
        let text = render(&current);
        assert!(
            text.contains(
                "  state seen list (alloc::string::String, u32)\n    $item: TUPLE<STR,U32>\n"
            ),
            "{text}"
        );
        assert_eq!(parse(&text).unwrap(), current);
        assert!(check(&parse(&text).unwrap(), &current).is_empty());
    }

    #[test]
    fn a_changed_state_type_is_reported_with_its_operator_state_and_path() {
        let locked = entries(&operators(false)).unwrap();
        let changes = check(&locked, &entries(&operators(true)).unwrap());
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(
            changes[0].starts_with("operator counter: signature "),
            "{changes:?}"
        );
        assert_eq!(changes[1], "  state count: $: U64 changed to I64");
    }

    #[test]
    fn a_malformed_lock_names_the_line() {
        let err = parse("operator x abc\n  state broken\n").unwrap_err();
        let LockError::Malformed { line, problem, .. } = &err else {
            panic!("{err}")
        };
        assert_eq!(*line, 2);
        assert!(problem.contains("state NAME KIND TYPE"), "{err}");
        assert!(
            err.to_string().starts_with("state-signatures.lock:2: "),
            "{err}"
        );
    }
}
