//! The state signature lock at the repository root matches the stack's operators, and a change
//! is reported by operator, state and type path.

use std::path::PathBuf;
use std::process::Command;

fn lock() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../state-signatures.lock")
}

#[test]
fn the_lock_file_matches_every_operators_state_signature() {
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["signatures", "--check", "--lock"])
        .arg(lock())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "state-signatures.lock is out of date; if the change is intended run `cargo run -- signatures --update`:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_changed_signature_fails_the_check_naming_the_operator_and_the_type_path() {
    let text = std::fs::read_to_string(lock()).unwrap();
    assert!(
        text.contains("    $: U64\n"),
        "the keyed counter's count is a u64:\n{text}"
    );
    let tampered = std::env::temp_dir().join(format!("keyway-lock-{}.lock", std::process::id()));
    std::fs::write(&tampered, text.replace("    $: U64\n", "    $: I64\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keyway"))
        .args(["signatures", "--check", "--lock"])
        .arg(&tampered)
        .output()
        .unwrap();
    std::fs::remove_file(&tampered).unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("operator keyed-counter")
            && stderr.contains("state count: $: I64 changed to U64"),
        "{stderr}"
    );
    assert!(stderr.contains("signatures --update"), "{stderr}");
}
