//! The README's quickstart, run as written, so the README cannot drift from the product:
//! the `<!-- quickstart:server -->` and `<!-- quickstart:client -->` blocks are run by bash
//! from a fresh temporary copy of `examples/`, with this build's binaries on `PATH` in place
//! of the `<!-- quickstart:install -->` block. Only the environment differs from a user's
//! shell: a free port instead of 8080 (`MANENT__API__LISTEN`, `MANENT_SERVER`) and a state
//! directory of the test's own (`XDG_STATE_HOME`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use manent_testkit::eventually;

const SERVER: &str = env!("CARGO_BIN_EXE_manent-server");
const README: &str = include_str!("../../../README.md");
const WAIT: Duration = Duration::from_secs(120);

/// The shell block that follows `<!-- quickstart:NAME -->` in the README.
fn quickstart_block(name: &str) -> String {
    let marker = format!("<!-- quickstart:{name} -->");
    let after = README
        .split_once(&marker)
        .unwrap_or_else(|| panic!("README.md has no `{marker}` block"))
        .1;
    let body = after
        .trim_start()
        .strip_prefix("```sh\n")
        .unwrap_or_else(|| panic!("`{marker}` must be followed by a ```sh block"));
    body.split_once("\n```")
        .unwrap_or_else(|| panic!("the `{marker}` block is not closed"))
        .0
        .to_string()
}

/// Copies `from` into `to`, leaving out what running the quickstart creates (the
/// database, its lock files, the demo artifact and descriptor).
fn copy_examples(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("manent.db") || name == "releases" || name == "hello-deploy.yml" {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_examples(&entry.path(), &to.join(&name));
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// The server's shell and everything it started, signalled as one process group.
struct Group(Child);

impl Group {
    fn signal(&self, signal: &str) {
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), "--", &format!("-{}", self.0.id())])
            .status();
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal("KILL");
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A shell of the user's: this build's binaries first on PATH, no manent variable
/// inherited from the test's environment.
fn shell(script: &str, dir: &Path, bin_dir: &Path, port: u16, state: &Path) -> Command {
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(dir)
        .env_clear()
        .env(
            "PATH",
            format!(
                "{}:{}",
                bin_dir.display(),
                std::env::var("PATH").unwrap_or_default()
            ),
        )
        .env(
            "HOME",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into()),
        )
        .env("XDG_STATE_HOME", state)
        .env("MANENT__API__LISTEN", format!("127.0.0.1:{port}"))
        .env("MANENT_SERVER", format!("http://127.0.0.1:{port}"));
    command
}

#[tokio::test]
async fn the_readme_quickstart_deploys_the_demo_from_a_fresh_copy_of_examples() {
    let install = quickstart_block("install");
    assert!(
        install.contains("--bin manent-server --bin manent") && install.contains("PATH"),
        "the install block builds both binaries and puts them on PATH; this test stands in \
         for it, so it must not do more:\n{install}"
    );
    let server_script = quickstart_block("server");
    let client_script = quickstart_block("client");
    // The second block goes on in the same terminal as the first: in examples/, with a
    // token in MANENT_TOKEN.
    let second_script = format!(
        "export MANENT_TOKEN=$(manent-server -c manent.yml admin token create --name later \
         --role admin)\n{}",
        quickstart_block("second")
    );

    let root = tempfile::tempdir().unwrap();
    let checkout = root.path().join("checkout");
    let state = root.path().join("state");
    copy_examples(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples"),
        &checkout.join("examples"),
    );
    let bin_dir: PathBuf = Path::new(SERVER).parent().unwrap().to_path_buf();
    assert!(
        bin_dir.join("manent").exists(),
        "the manent CLI is not built in {}: run `cargo build -p manent-cli` (./scripts/test does)",
        bin_dir.display()
    );
    let port = free_port();

    let log_path = root.path().join("server.log");
    let server = Group(
        shell(&server_script, &checkout, &bin_dir, port, &state)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log_path).unwrap())
            .process_group(0)
            .spawn()
            .expect("start the server block"),
    );
    eventually(
        "the quickstart's API accepts connections",
        WAIT,
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;

    let out = shell(&client_script, &checkout, &bin_dir, port, &state)
        .output()
        .expect("run the client block");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let server_log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        out.status.success(),
        "the README's client block must succeed (deploy --wait exits 0 only on SUCCESS)\n\
         stdout:\n{stdout}\nstderr:\n{stderr}\nserver log:\n{server_log}"
    );
    assert!(
        stdout.contains("SUCCESS"),
        "the deploy's final status is shown: {stdout}"
    );
    let executor = hostname();
    assert!(
        stdout.contains(&executor),
        "`manent workers` lists the serve process's worker ({executor}): {stdout}"
    );
    for target in ["local-1", "local-2"] {
        let deployed = Path::new("/tmp/manent-demo")
            .join(target)
            .join("hello-1.0.txt");
        assert_eq!(
            std::fs::read_to_string(&deployed).ok().as_deref(),
            Some("hello\n"),
            "the demo's command copied the artifact to {}",
            deployed.display()
        );
    }

    let out = shell(
        &second_script,
        &checkout.join("examples"),
        &bin_dir,
        port,
        &state,
    )
    .output()
    .expect("run the second block");
    the_second_block_rolled_back_as_written(&out);
    nothing_lands_outside_examples_and_no_work_directory_is_left(&checkout, &state, &executor);

    // SIGTERM to the block's process group, as Ctrl-C in the user's terminal would do.
    server.signal("TERM");
    let log = eventually("the server drains and stops on SIGTERM", WAIT, || {
        let log_path = log_path.clone();
        async move {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            log.contains("worker stopped").then_some(log)
        }
    })
    .await;
    drop(server);
    assert!(
        !log.contains('\x1b'),
        "a log written to a file carries no colour codes:\n{log}"
    );
}

/// The README's second block succeeded, showed the new version's output and the rollback,
/// and left 1.0 live in dev with 1.1 on the targets from before.
fn the_second_block_rolled_back_as_written(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the README's second block must succeed as written (rollback --wait exits 0 only on \
         SUCCESS)\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    for shown in [
        "local-1: command 3 | deployed 1.1 to local-1",
        "rollback of",
    ] {
        assert!(
            stdout.contains(shown) || stderr.contains(shown),
            "the second block shows {shown:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
        );
    }
    let live_in_dev = stdout.lines().rev().find_map(|l| {
        let cells: Vec<&str> = l.split_whitespace().collect();
        (cells.first() == Some(&"demo/hello") && cells.get(1) == Some(&"dev"))
            .then(|| cells.get(2).map(|v| v.to_string()))
    });
    assert_eq!(
        live_in_dev,
        Some(Some("1.0".to_string())),
        "`manent apps`, last, shows 1.0 live in dev after the rollback\n{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string("/tmp/manent-demo/local-2/hello-1.1.txt")
            .ok()
            .as_deref(),
        Some("hello again\n"),
        "1.1 reached the targets before the rollback"
    );
}

/// Paths are relative to manent.yml and the deploy's work directory under `state` is gone.
fn nothing_lands_outside_examples_and_no_work_directory_is_left(
    checkout: &Path,
    state: &Path,
    executor: &str,
) {
    // Paths are relative to manent.yml: the server (run from the checkout) and the token
    // command (run from examples/) share examples/manent.db, and nothing lands in the
    // shell's working directory; the liveness locks live beside the database.
    let examples = checkout.join("examples");
    let in_checkout: Vec<String> = std::fs::read_dir(checkout)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        in_checkout,
        ["examples"],
        "nothing but examples/ in the directory the server was started from"
    );
    assert!(
        examples.join("manent.db").is_file(),
        "the database is beside manent.yml"
    );
    assert!(
        examples.join("manent.db.executors").is_dir(),
        "the liveness lock files are beside the database"
    );
    // The deploy's work directory is removed before its outcome is recorded.
    let workdir = state.join("manent/work").join(executor);
    let left: Vec<_> = std::fs::read_dir(&workdir)
        .map(|dir| dir.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "the work directory {} keeps nothing once the deploy ended: {left:?}",
        workdir.display()
    );
}

/// The executor id of a worker with no `dbos.executor_id`: the host name.
fn hostname() -> String {
    let out = Command::new(SERVER)
        .args(["admin", "check-config"])
        .env_clear()
        .output()
        .expect("run manent-server admin check-config");
    let text = String::from_utf8(out.stdout).unwrap();
    text.trim_end()
        .rsplit_once("executor id ")
        .and_then(|(_, id)| id.strip_suffix(')'))
        .unwrap_or_else(|| panic!("check-config names the executor id: {text}"))
        .to_string()
}
