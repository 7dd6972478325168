//! The fingerprint of the code and configuration this process runs. Notes of what went out of a
//! record's outputs (`SentNotes`) hold only under the build that made them: a function deployed
//! again, with new code or new settings, may compute a record's outputs in another order.

use std::sync::OnceLock;

static FINGERPRINT: OnceLock<u64> = OnceLock::new();

/// Starts hashing beside whatever the process does next (a function's cold start), so that the
/// batch that first needs the fingerprint, near its deadline, does not read the executable then.
pub(crate) fn prepare() {
    if FINGERPRINT.get().is_none() {
        // A process that can start no thread hashes when it first needs the fingerprint.
        let _ = std::thread::Builder::new()
            .name("keyway-build".into())
            .spawn(fingerprint);
    }
}

/// The executable's bytes and the process's own environment, hashed once a process.
pub(crate) fn fingerprint() -> u64 {
    *FINGERPRINT.get_or_init(|| {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        // An executable that cannot be read (on Lambda it always can) leaves the environment to
        // tell builds apart. Read a piece at a time: a function of 128 MB has no room for a
        // copy of its binary.
        if let Ok(mut file) = std::env::current_exe().and_then(std::fs::File::open) {
            let mut piece = vec![0u8; 64 * 1024];
            while let Ok(n @ 1..) = std::io::Read::read(&mut file, &mut piece) {
                hasher.update(&piece[..n]);
            }
        }
        let mut vars: Vec<(String, String)> = std::env::vars_os()
            .map(|(k, v)| {
                (
                    k.to_string_lossy().into_owned(),
                    v.to_string_lossy().into_owned(),
                )
            })
            .filter(|(k, _)| !volatile(k))
            .collect();
        vars.sort();
        for (name, value) in vars {
            for part in [name.as_bytes(), b"=", value.as_bytes(), b"\n"] {
                hasher.update(part);
            }
        }
        hasher.digest()
    })
}

/// Variables the platform sets for each execution environment or invocation (credentials, the
/// trace id, the handler's paths, the log stream), and those it sets the same for every function:
/// they change while the function stays the same, or tell nothing of it.
fn volatile(name: &str) -> bool {
    name.starts_with("AWS_")
        || name.starts_with('_')
        || name.starts_with("LAMBDA_")
        || matches!(
            name,
            "TZ" | "LANG"
                | "PATH"
                | "LD_LIBRARY_PATH"
                | "PWD"
                | "OLDPWD"
                | "SHLVL"
                | "HOME"
                | "HOSTNAME"
                | "TERM"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_has_one_fingerprint_and_the_platforms_own_variables_are_not_in_it() {
        assert_eq!(fingerprint(), fingerprint());
        assert!(volatile("AWS_SESSION_TOKEN") && volatile("_X_AMZN_TRACE_ID"));
        assert!(!volatile("JOIN") && !volatile("STATE_TABLE"));
    }
}
