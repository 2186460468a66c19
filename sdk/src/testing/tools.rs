//! External tools a test needs (`go tool pprof`, graphviz's `dot`, Spark).

use std::process::Command;

/// Whether `tool probe_arg` runs and succeeds (e.g. `go version`).
pub fn have(tool: &str, probe_arg: &str) -> bool {
    Command::new(tool)
        .arg(probe_arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Whether `tool` is usable for the check `what`. When it is not, print a
/// loud notice on the real stderr (libtest captures `eprintln!` of passing
/// tests) and return `false` so the caller can skip, except under
/// `CPT_REQUIRE_PPROF=1` (set by `.ci/run`), where it panics: in CI the
/// check must run.
///
/// # Panics
///
/// When the tool is missing and `CPT_REQUIRE_PPROF=1`.
pub fn require(tool: &str, probe_arg: &str, what: &str) -> bool {
    if have(tool, probe_arg) {
        return true;
    }
    let msg = format!(
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         !!! `{tool}` NOT FOUND: {what} NOT RUN.\n\
         !!! Install it: apt-get install -y golang-go graphviz\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
    if std::env::var("CPT_REQUIRE_PPROF").as_deref() == Ok("1") {
        panic!("{msg}CPT_REQUIRE_PPROF=1: this test must run");
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr(), msg.as_bytes());
    false
}

/// Whether the Spark agreement checks can run: `python` imports `pyspark`
/// and `java` runs. When they cannot, print a loud notice and return `false`
/// so the caller can skip, except under `CPT_REQUIRE_SPARK=1` (set by
/// `.ci/run`, which installs both), where it panics: in CI the check must run.
///
/// # Panics
///
/// When Spark is missing and `CPT_REQUIRE_SPARK=1`.
pub fn require_spark(python: &std::path::Path, what: &str) -> bool {
    let pyspark = Command::new(python)
        .args(["-c", "import pyspark"])
        .output()
        .is_ok_and(|o| o.status.success());
    let java = have("java", "-version");
    if pyspark && java {
        return true;
    }
    let missing = match (pyspark, java) {
        (false, false) => format!("`java` and pyspark (for {})", python.display()),
        (false, true) => format!("pyspark (for {})", python.display()),
        _ => "`java`".to_owned(),
    };
    let msg = format!(
        "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
         !!! {missing} NOT FOUND: {what} NOT RUN.\n\
         !!! Install them: apt-get install -y openjdk-17-jre-headless;\n\
         !!! python3 -m venv .venv-spark && .venv-spark/bin/pip install pyspark==3.5.3\n\
         !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
    );
    if std::env::var("CPT_REQUIRE_SPARK").as_deref() == Ok("1") {
        panic!("{msg}CPT_REQUIRE_SPARK=1: this test must run");
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr(), msg.as_bytes());
    false
}
