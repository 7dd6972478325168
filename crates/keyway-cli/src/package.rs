//! `keyway bench package`: what a function ships to Lambda. Builds the function twice in one run,
//! with the plain release profile (symbols stripped, as a deployment would) as the baseline and
//! with the `lambda-release` profile (link-time optimisation, one codegen unit, no symbols), zips
//! each binary as `bootstrap` the way Lambda's provided.al2023 runtime takes it, and reports the
//! sizes, their ratio, and whether the embedded runtime was left out of the function.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

use crate::error::CliError;

/// The zipped size a function should stay under: small zips deploy and cold-start faster.
const TARGET_ZIP_BYTES: u64 = 4 * 1024 * 1024;
/// The profile functions are packaged with (Cargo.toml).
const LAMBDA_PROFILE: &str = "lambda-release";

#[derive(Serialize)]
struct PackageBench {
    function: String,
    baseline: Package,
    lambda: Package,
    /// lambda / baseline, zipped.
    zip_ratio: f64,
    /// The function's build leaves out the embedded runtime (`keyway` without its `local`
    /// feature), as `cargo tree` resolves it.
    embedded_runtime_left_out: bool,
    target_zip_bytes: u64,
    target_met: bool,
}

#[derive(Serialize)]
struct Package {
    profile: String,
    binary_bytes: u64,
    zip_bytes: u64,
    zip_path: PathBuf,
}

pub fn run(function: &str, json: bool) -> Result<(), CliError> {
    let root = workspace_root()?;
    let left_out = embedded_runtime_left_out(&root, function)?;
    let baseline = package(&root, function, "release")?;
    let lambda = package(&root, function, LAMBDA_PROFILE)?;
    let result = PackageBench {
        function: function.to_owned(),
        zip_ratio: lambda.zip_bytes as f64 / baseline.zip_bytes as f64,
        target_met: lambda.zip_bytes <= TARGET_ZIP_BYTES && left_out,
        embedded_runtime_left_out: left_out,
        target_zip_bytes: TARGET_ZIP_BYTES,
        baseline,
        lambda,
    };
    crate::bench::report(&result, json, print_table);
    Ok(())
}

fn print_table(r: &PackageBench) {
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    println!("keyway bench package: {}", r.function);
    println!();
    println!(
        "{:<16} {:>14} {:>12}",
        "profile", "binary (MiB)", "zip (MiB)"
    );
    for p in [&r.baseline, &r.lambda] {
        println!(
            "{:<16} {:>14.2} {:>12.2}",
            p.profile,
            mb(p.binary_bytes),
            mb(p.zip_bytes)
        );
    }
    println!();
    println!("zip ratio {}/release: {:.3}", LAMBDA_PROFILE, r.zip_ratio);
    println!(
        "embedded runtime left out of the function: {}",
        r.embedded_runtime_left_out
    );
    println!(
        "target: zip <= {:.1} MiB: {}",
        mb(r.target_zip_bytes),
        if r.target_met { "met" } else { "missed" }
    );
    println!("zip: {}", r.lambda.zip_path.display());
}

/// The workspace the command was built from, or the current directory's if run elsewhere.
fn workspace_root() -> Result<PathBuf, CliError> {
    let built_in = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let root = if built_in.join("Cargo.toml").is_file() {
        built_in
    } else {
        std::env::current_dir().map_err(|e| CliError::from(format!("current directory: {e}")))?
    };
    root.canonicalize()
        .map_err(|e| format!("workspace {}: {e}", root.display()).into())
}

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// Builds `function` with `profile`, strips it (the release profile keeps line tables) and zips it.
fn package(root: &Path, function: &str, profile: &str) -> Result<Package, CliError> {
    eprintln!("building {function} with the {profile} profile");
    let status = cargo()
        .current_dir(root)
        .args(["build", "--profile", profile, "-p", function])
        .status()
        .map_err(|e| format!("cargo build: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build --profile {profile} -p {function}: {status}").into());
    }
    let dir = root.join("target").join(profile);
    let built = dir.join(function);
    let stripped = dir.join(format!("{function}.bootstrap"));
    let status = Command::new("strip")
        .arg("-o")
        .arg(&stripped)
        .arg(&built)
        .status()
        .map_err(|e| format!("strip {}: {e}", built.display()))?;
    if !status.success() {
        return Err(format!("strip {}: {status}", built.display()).into());
    }
    let binary = std::fs::read(&stripped).map_err(|e| format!("{}: {e}", stripped.display()))?;
    let zip = zip_bootstrap(&binary)?;
    let zip_path = dir.join(format!("{function}.zip"));
    std::fs::write(&zip_path, &zip).map_err(|e| format!("{}: {e}", zip_path.display()))?;
    Ok(Package {
        profile: profile.to_owned(),
        binary_bytes: binary.len() as u64,
        zip_bytes: zip.len() as u64,
        zip_path,
    })
}

/// Whether the function's dependency on keyway leaves the `local` feature (the embedded runtime
/// and its YAML reader) off, as Cargo resolves the function on its own.
fn embedded_runtime_left_out(root: &Path, function: &str) -> Result<bool, CliError> {
    let out = cargo()
        .current_dir(root)
        .args(["tree", "-p", function, "-e", "features", "-i", "keyway"])
        .output()
        .map_err(|e| format!("cargo tree: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo tree -p {function}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(!String::from_utf8_lossy(&out.stdout).contains("keyway feature \"local\""))
}

/// A zip archive holding `binary` as an executable `bootstrap`, deflated: what Lambda's
/// provided.al2023 runtime runs (PKWARE APPNOTE 6.3: one local header, the data, one central
/// directory entry, the end record).
fn zip_bootstrap(binary: &[u8]) -> Result<Vec<u8>, CliError> {
    let name = b"bootstrap";
    let mut deflate = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
    deflate
        .write_all(binary)
        .map_err(|e| format!("deflate: {e}"))?;
    let data = deflate.finish().map_err(|e| format!("deflate: {e}"))?;
    let crc = crc32fast::hash(binary);
    let size = u32::try_from(binary.len()).map_err(|_| "a binary over 4 GiB")?;
    let packed = u32::try_from(data.len()).map_err(|_| "a zip over 4 GiB")?;
    let u16s = |out: &mut Vec<u8>, values: &[u16]| {
        values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()))
    };
    let u32s = |out: &mut Vec<u8>, values: &[u32]| {
        values
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes()))
    };
    // What the local header and the directory entry share: version 2.0, no flags, deflate,
    // 1980-01-01 00:00 (a fixed time: the same binary gives the same zip), sizes, name length,
    // no extra field.
    let common = |out: &mut Vec<u8>| {
        u16s(out, &[20, 0, 8, 0, 0x21]);
        u32s(out, &[crc, packed, size]);
        u16s(out, &[name.len() as u16, 0]);
    };
    let mut zip = Vec::with_capacity(data.len() + 128);
    u32s(&mut zip, &[0x0403_4b50]);
    common(&mut zip);
    zip.extend_from_slice(name);
    zip.extend_from_slice(&data);
    let directory = zip.len() as u32;
    u32s(&mut zip, &[0x0201_4b50]);
    // Made by Unix (3), so that the external attributes carry the file mode.
    u16s(&mut zip, &[(3 << 8) | 20]);
    common(&mut zip);
    // No comment, disk 0, no internal attributes; a regular file, mode 755; at offset 0.
    u16s(&mut zip, &[0, 0, 0]);
    u32s(&mut zip, &[0o100_755 << 16, 0]);
    zip.extend_from_slice(name);
    let directory_len = zip.len() as u32 - directory;
    // The end record: disk 0, directory on disk 0, one entry of one, its size and offset.
    u32s(&mut zip, &[0x0605_4b50]);
    u16s(&mut zip, &[0, 0, 1, 1]);
    u32s(&mut zip, &[directory_len, directory]);
    u16s(&mut zip, &[0]);
    Ok(zip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_zip_holds_the_binary_as_an_executable_bootstrap_that_unzip_restores() {
        let binary: Vec<u8> = (0..100_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        let zip = zip_bootstrap(&binary).unwrap();
        assert!(
            zip.len() < binary.len() / 2,
            "deflated: {} bytes",
            zip.len()
        );
        let dir = std::env::temp_dir().join(format!("keyway-zip-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("function.zip");
        std::fs::write(&path, &zip).unwrap();
        // Python's zipfile reads the archive as Lambda's unzip would, mode bits included.
        let script = "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); i = z.getinfo('bootstrap'); \
                      sys.stdout.buffer.write(b'%o\\n' % (i.external_attr >> 16)); sys.stdout.buffer.write(z.read(i))";
        let out = Command::new("python3")
            .args(["-c", script])
            .arg(&path)
            .output()
            .expect("python3 runs");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let split = out.stdout.iter().position(|&b| b == b'\n').unwrap();
        assert_eq!(&out.stdout[..split], b"100755");
        assert!(
            out.stdout[split + 1..] == binary[..],
            "the binary comes back unchanged"
        );
    }
}
