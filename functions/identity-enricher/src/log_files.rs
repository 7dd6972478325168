//! The CloudTrail records `keyway enrich` reads, one at a time: log files as CloudTrail delivers
//! them (`{"Records": [...]}`, gzipped or not), JSON Lines of records or of log files, single
//! records (either shape), and directories of any of these, walked in name order. A JSON Lines
//! file is read line by line, so a file of ten million records takes no more memory than one; a
//! log file is read whole, as CloudTrail keeps each to a few megabytes.
//!
//! A line that is not JSON is not dropped: it comes out as `Entry::Unreadable`, with where it
//! was, for the enricher to dead-letter with its problem.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A file or directory that could not be read, and why.
#[derive(Debug, thiserror::Error)]
#[error("{place}: {source}")]
pub struct ReadError {
    /// The path as given.
    pub place: String,
    /// What went wrong reading it.
    #[source]
    pub source: std::io::Error,
}

impl ReadError {
    fn at(place: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> Self {
        let place = place.to_string();
        move |source| Self { place, source }
    }
}

/// One entry of the input, with where it is: `file:line` for JSON Lines, `file#index` for a
/// record of a log file read whole (both for a log file on one line).
#[derive(Debug)]
pub enum Entry {
    /// One CloudTrail record, of either shape, read as JSON.
    Record {
        /// Where it is: `file:line`, or `file#index` for a record of a log file read whole.
        place: String,
        /// The record as read.
        value: Value,
    },
    /// Text that is not JSON.
    Unreadable {
        /// Where it is: `file:line`, or the file alone for a file that is no JSON at all.
        place: String,
        /// The text as read.
        text: String,
    },
}

impl Entry {
    /// Where the entry is in the input.
    pub fn place(&self) -> &str {
        match self {
            Entry::Record { place, .. } | Entry::Unreadable { place, .. } => place,
        }
    }
}

/// Every record under `paths`, in order.
pub struct Trail {
    files: VecDeque<PathBuf>,
    current: Option<FileEntries>,
}

impl Trail {
    /// The files under `paths` (each a file or a directory); an error names a path that does not
    /// exist.
    pub fn open(paths: &[PathBuf]) -> Result<Self, ReadError> {
        let mut files = VecDeque::new();
        for path in paths {
            collect(path, &mut files)?;
        }
        Ok(Self {
            files,
            current: None,
        })
    }
}

fn collect(path: &Path, files: &mut VecDeque<PathBuf>) -> Result<(), ReadError> {
    let meta = std::fs::metadata(path).map_err(ReadError::at(path.display()))?;
    if !meta.is_dir() {
        files.push_back(path.to_owned());
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(ReadError::at(path.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(ReadError::at(path.display()))?;
    entries.sort();
    for entry in entries {
        let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // Hidden files (editor swap files, .DS_Store) are not records.
        if !name.starts_with('.') {
            collect(&entry, files)?;
        }
    }
    Ok(())
}

impl Iterator for Trail {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(entries) = &mut self.current {
                match entries.next() {
                    Some(entry) => return Some(entry),
                    None => self.current = None,
                }
            }
            let path = self.files.pop_front()?;
            match FileEntries::open(&path) {
                Ok(entries) => self.current = Some(entries),
                Err(err) => return Some(Err(err)),
            }
        }
    }
}

/// The entries of one file.
struct FileEntries {
    name: String,
    lines: Option<std::io::Lines<Box<dyn BufRead>>>,
    line: usize,
    /// Records of the value last read (a log file's `Records`), still to hand out, with where
    /// they are.
    ready: VecDeque<(String, Value)>,
    /// The whole file, when it is no JSON at all.
    unreadable: Option<String>,
}

impl FileEntries {
    /// Opens `path`; a whole-file JSON value (a pretty-printed log file, one record) is read at
    /// once, JSON Lines line by line.
    fn open(path: &Path) -> Result<Self, ReadError> {
        let name = path.display().to_string();
        let mut reader = reader(path)?;
        let mut first = String::new();
        let mut skipped = 0;
        while first.trim().is_empty() {
            first.clear();
            if reader.read_line(&mut first).map_err(ReadError::at(&name))? == 0 {
                break;
            }
            skipped += 1;
        }
        let mut entries = Self {
            name,
            lines: None,
            line: skipped,
            ready: VecDeque::new(),
            unreadable: None,
        };
        if first.trim().is_empty() {
            return Ok(entries);
        }
        match serde_json::from_str::<Value>(&first) {
            Ok(value) => {
                let place = format!("{}:{}", entries.name, entries.line);
                entries.ready.extend(places(&place, records_of(value)));
                entries.lines = Some(reader.lines());
            }
            Err(_) => {
                // Not one JSON value a line: the whole file is one value.
                let mut rest = first;
                reader
                    .read_to_string(&mut rest)
                    .map_err(ReadError::at(&entries.name))?;
                match serde_json::from_str::<Value>(&rest) {
                    Ok(value) => entries
                        .ready
                        .extend(places(&entries.name, records_of(value))),
                    // Neither JSON Lines nor one JSON document: one unreadable entry, which the
                    // enricher dead-letters saying why.
                    Err(_) => entries.unreadable = Some(rest),
                }
            }
        }
        Ok(entries)
    }
}

impl Iterator for FileEntries {
    type Item = Result<Entry, ReadError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((place, value)) = self.ready.pop_front() {
                return Some(Ok(Entry::Record { place, value }));
            }
            if let Some(text) = self.unreadable.take() {
                let place = self.name.clone();
                return Some(Ok(Entry::Unreadable { place, text }));
            }
            let line = match self.lines.as_mut()?.next()? {
                Ok(line) => line,
                Err(e) => return Some(Err(ReadError::at(&self.name)(e))),
            };
            self.line += 1;
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(&line) {
                Ok(value) => {
                    let place = format!("{}:{}", self.name, self.line);
                    self.ready.extend(places(&place, records_of(value)));
                }
                Err(_) => {
                    return Some(Ok(Entry::Unreadable {
                        place: format!("{}:{}", self.name, self.line),
                        text: line,
                    }))
                }
            }
        }
    }
}

/// Records with where they are: `place` for the only one, `place#index` for several.
fn places(place: &str, records: Vec<Value>) -> impl Iterator<Item = (String, Value)> + '_ {
    let several = records.len() > 1;
    records.into_iter().enumerate().map(move |(i, value)| {
        let at = if several {
            format!("{place}#{i}")
        } else {
            place.to_owned()
        };
        (at, value)
    })
}

/// The records of a value: a log file's `Records`, the elements of an array, or the value itself.
fn records_of(value: Value) -> Vec<Value> {
    match value {
        Value::Array(records) => records,
        Value::Object(mut object) if object.get("Records").is_some_and(Value::is_array) => {
            match object.remove("Records") {
                Some(Value::Array(records)) => records,
                _ => unreachable!("checked to be an array"),
            }
        }
        other => vec![other],
    }
}

/// The file's text, decompressed when it is gzip (CloudTrail delivers `.json.gz`; concatenated
/// gzip members read as one).
fn reader(path: &Path) -> Result<Box<dyn BufRead>, ReadError> {
    let name = path.display();
    let mut file = BufReader::new(File::open(path).map_err(ReadError::at(&name))?);
    let gzip = file
        .fill_buf()
        .map_err(ReadError::at(&name))?
        .starts_with(&[0x1f, 0x8b]);
    Ok(if gzip {
        Box::new(BufReader::new(flate2::bufread::MultiGzDecoder::new(file)))
    } else {
        Box::new(file)
    })
}

/// Entries in an order shuffled within a window of `window`: arrival order randomised as a
/// stream of many partitions randomises it, in bounded memory. The same seed, the same order.
pub struct Shuffled<I: Iterator> {
    inner: I,
    window: Vec<I::Item>,
    size: usize,
    rng: rand::rngs::StdRng,
}

impl<I: Iterator> Shuffled<I> {
    /// `inner`'s entries shuffled within a window of `size` (at least one), in the order `seed`
    /// draws.
    pub fn new(inner: I, seed: u64, size: usize) -> Self {
        use rand::SeedableRng;
        Self {
            inner,
            window: Vec::with_capacity(size),
            size: size.max(1),
            rng: rand::rngs::StdRng::seed_from_u64(seed),
        }
    }
}

impl<I: Iterator> Iterator for Shuffled<I> {
    type Item = I::Item;

    fn next(&mut self) -> Option<Self::Item> {
        use rand::Rng;
        while self.window.len() < self.size {
            match self.inner.next() {
                Some(entry) => self.window.push(entry),
                None => break,
            }
        }
        if self.window.is_empty() {
            return None;
        }
        let at = self.rng.random_range(0..self.window.len());
        Some(self.window.swap_remove(at))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "keyway-trail-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn ids(trail: Trail) -> Vec<String> {
        trail
            .map(|e| match e.unwrap() {
                Entry::Record { value, place } => {
                    let file = place.rsplit('/').next().unwrap().to_owned();
                    format!("{} {file}", value["eventID"].as_str().unwrap())
                }
                Entry::Unreadable { place, .. } => {
                    format!("unreadable {}", place.rsplit('/').next().unwrap())
                }
            })
            .collect()
    }

    #[test]
    fn log_files_gzipped_or_not_json_lines_and_single_records_read_in_name_order() {
        let dir = dir();
        let log = r#"{"Records": [{"eventID": "a1"}, {"eventID": "a2"}]}"#;
        std::fs::write(dir.join("1-log.json"), format!("{log}\n")).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(b"{\n  \"Records\": [\n    {\"eventID\": \"b1\"}\n  ]\n}\n")
            .unwrap();
        std::fs::write(dir.join("2-log.json.gz"), gz.finish().unwrap()).unwrap();
        std::fs::write(
            dir.join("3-lines.jsonl"),
            "{\"eventID\": \"c1\"}\n\n{\"eventID\": \"c2\"}\nnot json\n",
        )
        .unwrap();
        std::fs::write(dir.join("4-one.json"), "{\n \"eventID\": \"d1\"\n}").unwrap();
        std::fs::write(dir.join(".hidden"), "x").unwrap();
        let read = ids(Trail::open(std::slice::from_ref(&dir)).unwrap());
        assert_eq!(
            read,
            [
                "a1 1-log.json:1#0",
                "a2 1-log.json:1#1",
                "b1 2-log.json.gz",
                "c1 3-lines.jsonl:1",
                "c2 3-lines.jsonl:3",
                "unreadable 3-lines.jsonl:4",
                "d1 4-one.json"
            ]
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_missing_path_is_named_and_a_file_that_is_no_json_is_one_unreadable_entry() {
        let err = Trail::open(&[PathBuf::from("/nonexistent/trail")])
            .err()
            .unwrap();
        assert!(err.to_string().starts_with("/nonexistent/trail: "), "{err}");
        let dir = dir();
        let path = dir.join("bad.json");
        std::fs::write(&path, "{\"Records\": [\n oops").unwrap();
        let entries: Vec<Entry> = Trail::open(std::slice::from_ref(&path))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(entries.len(), 1);
        match &entries[0] {
            Entry::Unreadable { place, text } => {
                assert_eq!(place, &path.display().to_string());
                assert_eq!(text, "{\"Records\": [\n oops");
            }
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_shuffle_keeps_every_entry_and_the_same_seed_gives_the_same_order() {
        let entries = |n: usize| {
            (0..n).map(|i| {
                Ok::<_, ReadError>(Entry::Record {
                    place: String::new(),
                    value: serde_json::json!(i),
                })
            })
        };
        let order = |seed| -> Vec<Value> {
            Shuffled::new(entries(100), seed, 10)
                .map(|e| match e.unwrap() {
                    Entry::Record { value, .. } => value,
                    Entry::Unreadable { .. } => unreachable!(),
                })
                .collect()
        };
        let a = order(1);
        assert_eq!(a, order(1));
        assert_ne!(a, order(2));
        let mut sorted: Vec<u64> = a.iter().map(|v| v.as_u64().unwrap()).collect();
        assert_ne!(sorted, (0..100).collect::<Vec<_>>(), "shuffled");
        sorted.sort();
        assert_eq!(sorted, (0..100).collect::<Vec<_>>());
    }
}
