//! State-structure signatures, derived from the state types themselves.
//!
//! The structure of a type is traced through its `Deserialize` implementation (serde-reflection),
//! so structs, enums, tuples, options, sequences, maps, sets and generic types need no code of
//! their own. The structure is written as sorted lines `path: type` — `$: SEQ<Person>`,
//! `Person.address: Address`, `Address.zip: OPTION<STR>`, `Status::Banned.reason: STR` — which
//! name the type path that changed when two structures differ, and whose SHA-256 is the
//! signature: stable across builds, platforms and compiler versions (no `TypeId`, no std hasher).
//!
//! Field and variant order does not count (JSON reads by name); names, types, variants, nesting
//! and type names do. A sequence and a set serialize alike and read each other, so they are one
//! shape. A type whose `Deserialize` cannot be traced (`serde_json::Value`, untagged enums)
//! supplies its shape by hand (`ValueState::with_shape`).

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde_reflection::{
    ContainerFormat, Format, Named, Samples, Tracer, TracerConfig, VariantFormat,
};

use crate::domain::hash::sha256_hex;

/// A type whose structure cannot be traced, and why.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct Untraceable(pub String);

/// The structure of a state type as `path: type` lines, sorted by path, traced or given by hand
/// (`Shape::custom`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Each type path's type, sorted by path.
    pub lines: BTreeMap<String, String>,
}

impl Shape {
    /// The traced structure of `T`, rooted at `root` (`$` for a value, `$item` for a list's
    /// elements, `$key` and `$value` for a map's).
    pub fn of<T: DeserializeOwned>(root: &str) -> Result<Self, Untraceable> {
        let mut tracer = Tracer::new(TracerConfig::default());
        let samples = Samples::new();
        let (format, _) = tracer
            .trace_type::<T>(&samples)
            .map_err(|e| Untraceable(e.to_string()))?;
        let registry = tracer.registry().map_err(|e| Untraceable(e.to_string()))?;
        let mut lines = BTreeMap::new();
        lines.insert(root.to_owned(), render(&format));
        for (name, container) in &registry {
            container_lines(name, container, &mut lines);
        }
        Ok(Self { lines })
    }

    /// A shape given by hand for a type that cannot be traced; change `text` whenever the
    /// serialized structure changes.
    pub fn custom(root: &str, text: &str) -> Self {
        Self {
            lines: BTreeMap::from([(root.to_owned(), format!("CUSTOM<{text}>"))]),
        }
    }

    /// Both shapes' lines in one: a map's key and value shapes make the map's.
    pub fn merge(mut self, other: Shape) -> Self {
        self.lines.extend(other.lines);
        self
    }

    /// The lines, one per type path.
    pub fn text(&self) -> String {
        self.lines
            .iter()
            .map(|(path, ty)| format!("{path}: {ty}"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The first 16 hex digits of the SHA-256 of `text`: changes whenever any line does.
    pub fn signature(&self) -> String {
        sha256_hex(&[self.text().as_bytes()], 16)
    }
}

fn render(format: &Format) -> String {
    match format {
        Format::Variable(_) => "UNKNOWN".into(),
        Format::TypeName(name) => name.clone(),
        Format::Unit => "UNIT".into(),
        Format::Bool => "BOOL".into(),
        Format::I8 => "I8".into(),
        Format::I16 => "I16".into(),
        Format::I32 => "I32".into(),
        Format::I64 => "I64".into(),
        Format::I128 => "I128".into(),
        Format::U8 => "U8".into(),
        Format::U16 => "U16".into(),
        Format::U32 => "U32".into(),
        Format::U64 => "U64".into(),
        Format::U128 => "U128".into(),
        Format::F32 => "F32".into(),
        Format::F64 => "F64".into(),
        Format::Char => "CHAR".into(),
        Format::Str => "STR".into(),
        Format::Bytes => "BYTES".into(),
        Format::Option(inner) => format!("OPTION<{}>", render(inner)),
        Format::Seq(inner) => format!("SEQ<{}>", render(inner)),
        Format::Map { key, value } => format!("MAP<{},{}>", render(key), render(value)),
        Format::Tuple(items) => format!(
            "TUPLE<{}>",
            items.iter().map(render).collect::<Vec<_>>().join(",")
        ),
        Format::TupleArray { content, size } => format!("ARRAY<{};{size}>", render(content)),
    }
}

fn fields(prefix: &str, fields: &[Named<Format>], lines: &mut BTreeMap<String, String>) {
    if fields.is_empty() {
        lines.insert(prefix.to_owned(), "STRUCT<>".into());
    }
    for field in fields {
        lines.insert(format!("{prefix}.{}", field.name), render(&field.value));
    }
}

fn tuple(prefix: &str, items: &[Format], lines: &mut BTreeMap<String, String>) {
    lines.insert(prefix.to_owned(), format!("TUPLE/{}", items.len()));
    for (i, item) in items.iter().enumerate() {
        lines.insert(format!("{prefix}.{i}"), render(item));
    }
}

fn container_lines(name: &str, container: &ContainerFormat, lines: &mut BTreeMap<String, String>) {
    match container {
        ContainerFormat::UnitStruct => {
            lines.insert(name.to_owned(), "UNIT".into());
        }
        ContainerFormat::NewTypeStruct(inner) => {
            lines.insert(name.to_owned(), format!("NEWTYPE<{}>", render(inner)));
        }
        ContainerFormat::TupleStruct(items) => tuple(name, items, lines),
        ContainerFormat::Struct(named) => fields(name, named, lines),
        ContainerFormat::Enum(variants) => {
            for variant in variants.values() {
                let prefix = format!("{name}::{}", variant.name);
                match &variant.value {
                    VariantFormat::Variable(_) => {
                        lines.insert(prefix, "UNKNOWN".into());
                    }
                    VariantFormat::Unit => {
                        lines.insert(prefix, "UNIT".into());
                    }
                    VariantFormat::NewType(inner) => {
                        lines.insert(prefix, render(inner));
                    }
                    VariantFormat::Tuple(items) => tuple(&prefix, items, lines),
                    VariantFormat::Struct(named) => fields(&prefix, named, lines),
                }
            }
        }
    }
}

/// How two shapes differ, path by path.
pub fn diff(old: &Shape, new: &Shape) -> Vec<String> {
    let mut changes = Vec::new();
    for (path, ty) in &old.lines {
        match new.lines.get(path) {
            None => changes.push(format!("{path}: {ty} removed")),
            Some(now) if now != ty => changes.push(format!("{path}: {ty} changed to {now}")),
            Some(_) => {}
        }
    }
    for (path, ty) in &new.lines {
        if !old.lines.contains_key(path) {
            changes.push(format!("{path}: {ty} added"));
        }
    }
    changes
}

#[cfg(test)]
// The types below exist to be traced, never read.
#[allow(dead_code)]
mod tests {
    use std::collections::{BTreeMap, HashMap, HashSet};

    use serde::{Deserialize, Serialize};

    use super::*;
    use crate::operator::{state_signature, ListState, MapState, StateDescriptor, ValueState};

    fn sig<T: DeserializeOwned>() -> String {
        Shape::of::<T>("$").unwrap().signature()
    }

    fn op(states: Vec<StateDescriptor>) -> String {
        state_signature(&states)
    }

    mod before {
        use serde::Deserialize;
        #[derive(Deserialize)]
        pub(super) struct Profile {
            pub user: User,
        }
        #[derive(Deserialize)]
        pub(super) struct User {
            pub address: Address,
        }
        #[derive(Deserialize)]
        pub(super) struct Address {
            pub street: String,
        }
        #[derive(Deserialize)]
        pub(super) struct Person {
            pub name: String,
            pub age: u32,
        }
        #[derive(Deserialize)]
        pub(super) enum Status {
            Active,
            Banned { reason: String },
        }
        #[derive(Deserialize)]
        pub(super) struct Wrapper<T> {
            pub inner: T,
        }
        #[derive(Deserialize)]
        pub(super) struct Counter {
            pub count: u64,
            pub seen: Vec<String>,
        }
    }

    mod after {
        use serde::Deserialize;
        #[derive(Deserialize)]
        pub(super) struct Profile {
            pub user: User,
        }
        #[derive(Deserialize)]
        pub(super) struct User {
            pub address: Address,
        }
        #[derive(Deserialize)]
        pub(super) struct Address {
            pub street: String,
            pub zip: Option<String>,
        }
        #[derive(Deserialize)]
        pub(super) struct Population {
            pub name: String,
            pub age: u32,
        }
        #[derive(Deserialize)]
        pub(super) enum Status {
            Active,
            Banned { reason: String },
            Suspended,
        }
        #[derive(Deserialize)]
        pub(super) struct Wrapper<T> {
            pub inner: T,
        }
        #[derive(Deserialize)]
        pub(super) struct Counter {
            pub total: u64,
            pub seen: Vec<String>,
        }
    }

    mod documented {
        use serde::Deserialize;
        /// The same counter as `before::Counter`, documented and with methods.
        #[derive(Deserialize)]
        pub(super) struct Counter {
            /// How many.
            pub count: u64,
            /// Who was seen.
            pub seen: Vec<String>,
        }
        impl Counter {
            #[allow(dead_code)]
            pub(super) fn total(&self) -> u64 {
                self.count
            }
        }
    }

    #[test]
    fn a_field_added_two_levels_down_changes_the_signature_and_names_the_path() {
        let (old, new) = (
            Shape::of::<before::Profile>("$").unwrap(),
            Shape::of::<after::Profile>("$").unwrap(),
        );
        assert_ne!(old.signature(), new.signature());
        assert_eq!(diff(&old, &new), ["Address.zip: OPTION<STR> added"]);
    }

    #[test]
    fn a_list_of_person_is_not_a_list_of_population() {
        assert_ne!(
            sig::<Vec<before::Person>>(),
            sig::<Vec<after::Population>>()
        );
    }

    #[test]
    fn a_value_holding_a_list_is_not_a_list_state() {
        const AS_VALUE: ValueState<Vec<u64>> = ValueState::new("numbers");
        const AS_LIST: ListState<u64> = ListState::new("numbers");
        assert_ne!(
            op(vec![AS_VALUE.descriptor()]),
            op(vec![AS_LIST.descriptor()])
        );
    }

    #[test]
    fn renaming_or_retyping_a_field_changes_the_signature() {
        assert_ne!(
            sig::<before::Counter>(),
            sig::<after::Counter>(),
            "count renamed to total"
        );
        let renamed = diff(
            &Shape::of::<before::Counter>("$").unwrap(),
            &Shape::of::<after::Counter>("$").unwrap(),
        );
        assert_eq!(
            renamed,
            ["Counter.count: U64 removed", "Counter.total: U64 added"]
        );
        assert_ne!(sig::<u64>(), sig::<i64>());
        assert_ne!(sig::<Option<u64>>(), sig::<u64>());
    }

    #[test]
    fn an_enum_variant_added_changes_the_signature() {
        let (old, new) = (
            Shape::of::<before::Status>("$").unwrap(),
            Shape::of::<after::Status>("$").unwrap(),
        );
        assert_eq!(diff(&old, &new), ["Status::Suspended: UNIT added"]);
    }

    #[test]
    fn a_change_inside_a_generic_parameter_changes_the_signature() {
        assert_ne!(
            sig::<before::Wrapper<u64>>(),
            sig::<before::Wrapper<String>>()
        );
        assert_ne!(sig::<Vec<(String, u8)>>(), sig::<Vec<(String, u16)>>());
        assert_ne!(sig::<BTreeMap<String, u8>>(), sig::<BTreeMap<u8, String>>());
    }

    #[test]
    fn the_kind_and_the_key_type_of_a_map_state_count() {
        const BY_NAME: MapState<String, u64> = MapState::new("m");
        const BY_ID: MapState<u64, u64> = MapState::new("m");
        assert_ne!(op(vec![BY_NAME.descriptor()]), op(vec![BY_ID.descriptor()]));
    }

    #[test]
    fn doc_comments_methods_and_the_order_of_states_do_not_change_it() {
        assert_eq!(sig::<before::Counter>(), sig::<documented::Counter>());
        assert_eq!(
            Shape::of::<before::Wrapper<u8>>("$"),
            Shape::of::<after::Wrapper<u8>>("$")
        );
        const A: ValueState<u64> = ValueState::new("a");
        const B: ListState<String> = ListState::new("b");
        assert_eq!(
            op(vec![A.descriptor(), B.descriptor()]),
            op(vec![B.descriptor(), A.descriptor()])
        );
    }

    #[test]
    fn sets_maps_tuples_and_options_are_traced() {
        let shape =
            Shape::of::<(HashSet<String>, HashMap<String, Option<(u8, bool)>>)>("$").unwrap();
        assert_eq!(
            shape.text(),
            "$: TUPLE<SEQ<STR>,MAP<STR,OPTION<TUPLE<U8,BOOL>>>>"
        );
    }

    #[test]
    fn a_type_that_cannot_be_traced_says_so_and_can_give_its_shape() {
        const DYNAMIC: ValueState<serde_json::Value> = ValueState::new("doc");
        assert!(DYNAMIC.descriptor().shape.is_err());
        const GIVEN: ValueState<serde_json::Value> = ValueState::with_shape("doc", "json-v1");
        assert_eq!(
            GIVEN.descriptor().shape.unwrap().text(),
            "$: CUSTOM<json-v1>"
        );
    }

    /// Pinned: signatures name stored state, so they must not drift between releases.
    #[test]
    fn a_signature_is_the_same_on_every_build() {
        #[derive(Serialize, Deserialize)]
        struct Pinned {
            id: String,
            values: Vec<u32>,
        }
        assert_eq!(
            Shape::of::<Pinned>("$").unwrap().text(),
            "$: Pinned\nPinned.id: STR\nPinned.values: SEQ<U32>"
        );
        assert_eq!(
            sig::<Pinned>(),
            sha256_hex(
                &["$: Pinned\nPinned.id: STR\nPinned.values: SEQ<U32>".as_bytes()],
                16
            )
        );
    }
}
