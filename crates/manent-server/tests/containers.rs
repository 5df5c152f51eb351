//! The `container` plugin on real sshd targets (docs/containers.md): images built here from
//! a busybox root filesystem (`podman import`, `podman save`; no registry), loaded on two
//! targets over SSH, each switched by its HAProxy while a load generator sends requests
//! through every deploy, failed deploy and rollback: none fails. A worker killed with
//! `kill -9` between a container's start and the switch leaves a deploy that another worker
//! finishes without a second container of that version.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use common::Site;
use manent_testkit::{Db, on_both_backends, signal, sshd::SshHosts};
use serde_json::Value;

on_both_backends!(
    container_deploys_failed_deploys_and_rollbacks_switch_without_a_failed_request,
    a_worker_killed_between_start_and_switch_is_taken_over_without_a_second_container,
    drift_finds_a_stopped_container_another_one_and_a_proxy_pointing_elsewhere,
);

/// `podman args…`, its stdout; panics with its stderr when it fails.
fn podman(args: &[&str]) -> String {
    let out = Command::new("podman")
        .args(args)
        .output()
        .expect("run podman (scripts/test installs it)");
    assert!(
        out.status.success(),
        "podman {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A podman listing (`ps`, `images`), asked again while podman answers that an entry it
/// was listing went away meanwhile ("image not known", "no such container"): the other
/// backend's test, running beside this one on the same storage, removes its own. `None`
/// when it still fails.
fn podman_list(args: &[&str]) -> Option<String> {
    for _ in 0..10 {
        let out = Command::new("podman")
            .args(args)
            .output()
            .expect("run podman (scripts/test installs it)");
        if out.status.success() {
            return Some(String::from_utf8_lossy(&out.stdout).into_owned());
        }
        let err = String::from_utf8_lossy(&out.stderr).to_lowercase();
        if !(err.contains("not known") || err.contains("no such")) {
            eprintln!("podman {args:?}: {err}");
            return None;
        }
    }
    None
}

/// What one test made with podman and HAProxy, all named with its prefix, removed on drop.
struct Made {
    prefix: String,
}

impl Made {
    fn new(backend: &str) -> Made {
        Made {
            prefix: format!("manent-test-{backend}-{}", std::process::id()),
        }
    }

    /// The names of this test's containers, running ones only unless `all`.
    fn containers(&self, all: bool) -> Vec<String> {
        let mut args = vec!["ps", "--format", "{{.Names}}"];
        if all {
            args.push("-a");
        }
        let mut names: Vec<String> = podman_list(&args)
            .unwrap_or_else(|| panic!("podman {args:?} failed, see above"))
            .lines()
            .filter(|n| n.starts_with(&self.prefix))
            .map(str::to_string)
            .collect();
        names.sort();
        names
    }
}

impl Drop for Made {
    fn drop(&mut self) {
        // Never a panic here: a failed listing leaves what it lists (named with the prefix).
        let all = podman_list(&["ps", "-a", "--format", "{{.Names}}"]).unwrap_or_default();
        for name in all.lines().filter(|n| n.starts_with(&self.prefix)) {
            let _ = Command::new("podman").args(["rm", "-f", name]).output();
        }
        let images =
            podman_list(&["images", "--format", "{{.Repository}}:{{.Tag}}"]).unwrap_or_default();
        for image in images.lines().filter(|i| i.contains(&self.prefix)) {
            let _ = Command::new("podman").args(["rmi", "-f", image]).output();
        }
        let home = std::env::var("HOME").unwrap_or_default();
        // manent's copies of the archives, one per container name (the prefix's).
        let images = Path::new(&home).join(".manent/images");
        for entry in std::fs::read_dir(&images).into_iter().flatten().flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with(&self.prefix)
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let proxies = Path::new(&home).join(".manent/proxy");
        for entry in std::fs::read_dir(&proxies).into_iter().flatten().flatten() {
            if !entry
                .file_name()
                .to_string_lossy()
                .starts_with(&self.prefix)
            {
                continue;
            }
            if let Ok(pid) = std::fs::read_to_string(entry.path().join("haproxy.pid")) {
                let _ = Command::new("kill").arg(pid.trim()).output();
            }
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// An image archive of version `version`: busybox's httpd on 8080 serving `index` (and
/// `/health` when `healthy`) after printing `app <version> starting`; or, when `index` is
/// `None`, a program that says why it cannot start and exits. Returns its path and sha256.
fn image(
    site: &Site,
    made: &Made,
    version: &str,
    index: Option<&str>,
    healthy: bool,
) -> (PathBuf, String) {
    let root = site.dir.join(format!("rootfs-{version}"));
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("www")).unwrap();
    let busybox = std::env::var("MANENT_TEST_BUSYBOX").unwrap_or_else(|_| "/bin/busybox".into());
    std::fs::copy(&busybox, root.join("bin/busybox")).expect("busybox-static's /bin/busybox");
    for tool in ["sh", "httpd", "touch"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(tool)).unwrap();
    }
    std::fs::write(root.join("www/index.html"), index.unwrap_or("none")).unwrap();
    if healthy {
        std::fs::write(root.join("www/health"), "ok").unwrap();
    }
    let tar = site.dir.join(format!("rootfs-{version}.tar"));
    let status = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(status.success(), "tar of the root filesystem");
    let script = match index {
        Some(_) => format!(
            "echo app {version} starting; echo greeting=$GREETING; exec /bin/httpd -f -p 8080 -h /www"
        ),
        None => format!("echo app {version}: missing configuration, exiting >&2; exit 1"),
    };
    let cmd = serde_json::to_string(&["/bin/sh", "-c", &script]).unwrap();
    let build = format!("localhost/{}-build:{version}", made.prefix);
    podman(&[
        "import",
        "--change",
        &format!("CMD {cmd}"),
        tar.to_str().unwrap(),
        &build,
    ]);
    let archive = site.dir.join(format!("image-{version}.tar"));
    podman(&["save", "-o", archive.to_str().unwrap(), &build]);
    podman(&["rmi", &build]);
    let sum = Command::new("sha256sum").arg(&archive).output().unwrap();
    let sum = String::from_utf8_lossy(&sum.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    (archive, sum)
}

/// A descriptor deploying the image archive of `version`.
fn descriptor(site: &Site, version: &str, (archive, sum): &(PathBuf, String)) -> PathBuf {
    let path = site.dir.join(format!("deploy-{version}.yml"));
    std::fs::write(
        &path,
        format!(
            "application: acme/web\nenvironment: prod\nartifacts:\n  - {{name: app.tar, type: \
             image, version: \"{version}\", url: \"file://{}\", sha256: \"{sum}\"}}\n",
            archive.display()
        ),
    )
    .unwrap();
    path
}

/// acme/web prod: the hosts as targets, each container behind its proxy on `{host}:listen`,
/// a check that the page is not `broken`.
fn environment(site: &Site, made: &Made, hosts: &SshHosts, listen: u16) {
    let targets: String = hosts
        .hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            format!(
                "  - {{name: t{}, host: \"{}\", port: {}}}\n",
                i + 1,
                h.addr,
                h.port
            )
        })
        .collect();
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n{targets}ssh: {{user: \"{}\", key: \"{}\", known_hosts: \"{}\"}}\n\
             variables: {{GREETING: hello}}\n\
             deploy:\n  plugin: container\n  container:\n    name: \"{}-{{target}}\"\n    \
             port: 8080\n    health: {{path: /health, interval: 200ms, timeout: 60s}}\n    \
             stop_timeout: 5s\n    keep: 1\n  proxy: {{listen: \"{{host}}:{listen}\"}}\n\
             checks:\n  - {{name: not-broken, type: command, command: \"! curl -s \
             http://{{host}}:{listen}/ | grep -q broken\", expect_exit: 0, retries: 0, \
             interval: 1s, timeout: 10s}}\n",
            hosts.user,
            hosts.client_key.display(),
            hosts.known_hosts.display(),
            made.prefix,
        ),
    );
}

/// Requests sent to every proxy in a loop until stopped: how many answered 200, how many
/// did not (each failure kept, to be shown).
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Load {
    fn start(urls: Vec<String>) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (s, o, f) = (stop.clone(), ok.clone(), failures.clone());
        let task = tokio::spawn(async move {
            // Connections kept alive, as browsers and clients do: a switch must not break them.
            let client = reqwest::Client::new();
            while !s.load(Ordering::Relaxed) {
                for url in &urls {
                    match client.get(url).send().await {
                        Ok(r) if r.status() == 200 => match r.text().await {
                            Ok(_) => {
                                o.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(e) => f.lock().unwrap().push(format!("{url}: body: {e:?}")),
                        },
                        Ok(r) => f.lock().unwrap().push(format!("{url}: {}", r.status())),
                        Err(e) => f.lock().unwrap().push(format!("{url}: {e:?}")),
                    }
                }
            }
        });
        Load {
            stop,
            ok,
            failures,
            task,
        }
    }

    /// Stops it; returns (answered, failures).
    async fn finish(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        let failures = self.failures.lock().unwrap().clone();
        let answered = self.ok.load(Ordering::Relaxed);
        eprintln!(
            "load: {answered} requests answered, {} failed",
            failures.len()
        );
        (answered, failures)
    }
}

/// What the proxy at `url` serves now.
async fn served(url: &str) -> String {
    reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .text()
        .await
        .unwrap()
}

/// `manent deploy -f <path> --wait`: the exit code and the status.
fn deploy(site: &Site, token: &str, path: &Path) -> (i32, Value) {
    site.cli(token, &["deploy", "--wait", "-f", path.to_str().unwrap()])
}

/// Each target's detail in a status, by name.
fn details(status: &Value) -> String {
    status["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| format!("{}={}: {}", t["name"], t["status"], t["detail"]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Starts the sshd targets, the site, its API and a worker.
async fn setup(db: Db, made: &Made) -> (SshHosts, Site, String, u16) {
    let hosts = SshHosts::start(2).await;
    let mut site = Site::new(db, &["true"]).await;
    let listen = common::free_port();
    environment(&site, made, &hosts, listen);
    let token = site.token();
    site.start("api", "api");
    site.start_with("worker", "w1", &[("MANENT__RECOVERY__AUTOMATIC", "true")]);
    site.wait_api().await;
    (hosts, site, token, listen)
}

/// `manent status` of a deploy that switched t1 and t2 to `<p>-t*-2`: the container, its
/// image's digest and the proxy (`listen`, t1's) as fields in JSON and as a table.
fn shows_containers(site: &Site, token: &str, second: &Value, p: &str, listen: &str) {
    let c = &second["targets"][0]["container"];
    assert!(
        c["name"] == format!("{p}-t1-2")
            && c["image"]
                .as_str()
                .is_some_and(|i| i.starts_with("localhost/manent/"))
            && c["image_digest"]
                .as_str()
                .is_some_and(|d| d.starts_with("sha256:") && d.len() == 71)
            && c["proxy"]["listen"] == listen
            && c["proxy"]["server"] == c["name"]
            && c["proxy"]["upstream"] == c["address"],
        "status --output json has t1's container, image digest and proxy as fields: {c}"
    );
    let (_, text) = site.cli_text(token, &["status", second["id"].as_str().unwrap()]);
    assert!(
        text.contains("IMAGE_DIGEST") && text.contains(&format!("-> {p}-t2-2")),
        "manent status shows a containers table with the proxy's server: {text}"
    );
}

/// Waits until deploy `id`'s prunes, which run after its result in a workflow of their own,
/// have ended on both targets: its status then.
async fn pruned(site: &Site, token: &str, id: &str) -> Value {
    site.wait_until(token, id, "its prunes end on t1 and t2", |s| {
        let steps = s["steps"].as_array().cloned().unwrap_or_default();
        ["t1", "t2"].iter().all(|t| {
            steps.iter().any(|step| {
                step["name"] == format!("{t}: prune containers") && step["status"] == "SUCCESS"
            })
        })
    })
    .await
}

/// Version 2 runs, 1 and 4 are stopped: the deploy of 5 stops 2, then its prune (after the
/// deploy's result) keeps 2 with `keep: 1` and removes 1 and 4; `manent apps` shows 5 live.
async fn deploy_then_prune(
    site: &Site,
    token: &str,
    made: &Made,
    url: &str,
    v5: &(PathBuf, String),
) {
    let p = &made.prefix;
    let (code, fifth) = deploy(site, token, &descriptor(site, "5", v5));
    assert_eq!(code, 0, "version 5 is deployed: {}", details(&fifth));
    assert_eq!(served(url).await, "v5", "the proxy serves version 5");
    let id = fifth["id"].as_str().expect("the deploy's id");
    let after = pruned(site, token, id).await;
    assert_eq!(
        after["status"], "SUCCESS",
        "the deploy's result is its own, whatever its prunes do: {after}"
    );
    let (_, logs) = site.cli_text(token, &["logs", id]);
    assert!(
        logs.contains("t1: prune containers SUCCESS")
            && logs.contains(&format!(
                "1 version(s) kept for a rollback, removed: {p}-t1-"
            )),
        "manent logs of the deploy shows its prunes and what they removed: {logs}"
    );
    let on_t1: Vec<String> = made
        .containers(true)
        .into_iter()
        .filter(|c| c.starts_with(&format!("{p}-t1-")))
        .collect();
    assert_eq!(
        on_t1,
        [format!("{p}-t1-2"), format!("{p}-t1-5")],
        "version 5 runs, 2 (stopped by the deploy) is kept, 1 and 4 are removed: {}",
        details(&fifth)
    );
    let (code, apps) = site.cli(token, &["apps"]);
    let live = apps
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["application"] == "acme/web")
        .map(|a| a["live"]["prod"].clone());
    assert!(
        code == 0
            && live.as_ref().is_some_and(|l| {
                l["version"] == "5" && l["container"] == format!("{p}-{{target}}-5")
            }),
        "manent apps shows version 5 live in prod, and its container: {apps}"
    );
}

async fn container_deploys_failed_deploys_and_rollbacks_switch_without_a_failed_request(db: Db) {
    let made = Made::new(&format!("{db:?}").to_lowercase());
    let (hosts, site, token, listen) = setup(db, &made).await;
    let urls: Vec<String> = hosts
        .hosts
        .iter()
        .map(|h| format!("http://{}:{listen}/", h.addr))
        .collect();
    let v1 = image(&site, &made, "1", Some("v1"), true);
    let v2 = image(&site, &made, "2", Some("v2"), true);
    let v3 = image(&site, &made, "3", None, false);
    let v4 = image(&site, &made, "4", Some("broken"), true);
    let v5 = image(&site, &made, "5", Some("v5"), true);

    let (code, first) = deploy(&site, &token, &descriptor(&site, "1", &v1));
    assert_eq!(code, 0, "version 1 is deployed: {}", details(&first));
    let load = Load::start(urls.clone());
    assert_eq!(served(&urls[0]).await, "v1", "the proxy serves version 1");

    let (code, second) = deploy(&site, &token, &descriptor(&site, "2", &v2));
    assert_eq!(code, 0, "version 2 is deployed: {}", details(&second));
    for url in &urls {
        assert_eq!(served(url).await, "v2", "{url} serves version 2");
    }
    let p = &made.prefix;
    assert_eq!(
        made.containers(false),
        [format!("{p}-t1-2"), format!("{p}-t2-2")],
        "only version 2's containers run, one a target, each behind its proxy"
    );
    assert!(
        made.containers(true).contains(&format!("{p}-t1-1")),
        "version 1's container is kept, stopped, for a rollback: {:?}",
        made.containers(true)
    );
    let detail = details(&second);
    assert!(
        detail.contains(&format!("container {p}-t1-2 on 127.0.0.1:"))
            && detail.contains("image localhost/manent/")
            && detail.contains("sha256:")
            && detail.contains(&format!(
                "proxy {}:{listen} -> {p}-t1-2",
                hosts.hosts[0].addr
            )),
        "status shows per target the container, its image's digest and the proxy: {detail}"
    );
    shows_containers(
        &site,
        &token,
        &second,
        p,
        &format!("{}:{listen}", hosts.hosts[0].addr),
    );
    let (_, logs) = site.cli_text(&token, &["logs", second["id"].as_str().unwrap()]);
    assert!(
        logs.contains("app 2 starting") && logs.contains("greeting=hello"),
        "manent logs shows the container's start-up output, with the environment's variables: {logs}"
    );
    assert!(
        !logs.contains("stdout F app 2"),
        "the lines read from podman's log file are shown without its time and stream: {logs}"
    );

    let (code, third) = deploy(&site, &token, &descriptor(&site, "3", &v3));
    let detail = details(&third);
    assert!(
        code != 0 && detail.contains("missing configuration, exiting"),
        "a container that never becomes healthy fails its target, the tail of its log in \
         the step's output: {code} {detail}"
    );
    let (_, logs) = site.cli_text(&token, &["logs", third["id"].as_str().unwrap()]);
    assert!(
        logs.contains("app 3: missing configuration, exiting"),
        "manent logs of a failed start shows the container's last lines: {logs}"
    );
    assert!(
        third["targets"][0]["container"].is_null(),
        "a target never switched runs no new container: {}",
        third["targets"][0]
    );
    assert!(
        !made.containers(true).iter().any(|c| c.ends_with("-3")),
        "the unhealthy container is removed: {:?}",
        made.containers(true)
    );
    assert_eq!(served(&urls[0]).await, "v2", "traffic stays on version 2");

    let (code, fourth) = deploy(&site, &token, &descriptor(&site, "4", &v4));
    let detail = details(&fourth);
    assert!(
        code != 0 && detail.contains("rolled_back") && detail.contains("re-activated 2"),
        "a failed check rolls the targets back to version 2's container: {code} {detail}"
    );
    for url in &urls {
        assert_eq!(served(url).await, "v2", "{url} serves version 2 again");
    }
    assert_eq!(
        fourth["targets"][0]["container"]["name"],
        format!("{p}-t1-2"),
        "after the rollback the status names version 2's container again: {}",
        fourth["targets"][0]
    );
    assert_eq!(
        made.containers(false),
        [format!("{p}-t1-2"), format!("{p}-t2-2")],
        "after the automatic rollback only version 2's containers run"
    );

    let (code, back) = site.cli(&token, &["rollback", "acme/web", "prod", "--wait"]);
    assert!(
        code == 0 && back["version"] == "1",
        "manent rollback returns to version 1: {back}"
    );
    assert_eq!(
        served(&urls[1]).await,
        "v1",
        "the kept container of version 1 serves again"
    );
    let (code, fast) = site.cli(
        &token,
        &["rollback", "acme/web", "prod", "--fast", "--wait"],
    );
    assert!(
        code == 0 && fast["version"] == "2",
        "manent rollback --fast returns to version 2: {fast}"
    );
    assert!(
        details(&fast).contains("already on the target"),
        "the fast rollback found the image on the targets: {}",
        details(&fast)
    );
    assert_eq!(served(&urls[1]).await, "v2", "version 2 serves again");

    deploy_then_prune(&site, &token, &made, &urls[0], &v5).await;

    let (answered, failures) = load.finish().await;
    assert!(
        failures.is_empty() && answered > 0,
        "no request failed through 5 deploys and 3 rollbacks ({answered} answered): {failures:?}"
    );
    drop(hosts);
}

async fn a_worker_killed_between_start_and_switch_is_taken_over_without_a_second_container(db: Db) {
    let made = Made::new(&format!("kill-{db:?}").to_lowercase());
    let (hosts, mut site, token, listen) = setup(db, &made).await;
    let urls: Vec<String> = hosts
        .hosts
        .iter()
        .map(|h| format!("http://{}:{listen}/", h.addr))
        .collect();
    let v1 = image(&site, &made, "1", Some("v1"), true);
    // Version 2 answers on /health only once the test writes it: the deploy waits there.
    let v2 = image(&site, &made, "2", Some("v2"), false);
    let (code, first) = deploy(&site, &token, &descriptor(&site, "1", &v1));
    assert_eq!(code, 0, "version 1 is deployed: {}", details(&first));
    let load = Load::start(urls.clone());

    let path = descriptor(&site, "2", &v2);
    let (code, submitted) = site.cli(&token, &["deploy", "-f", path.to_str().unwrap()]);
    assert_eq!(code, 0, "version 2 is submitted: {submitted}");
    let id = submitted["id"].as_str().unwrap().to_string();
    let p = made.prefix.clone();
    let new = [format!("{p}-t1-2"), format!("{p}-t2-2")];
    // Between start and switch: each target's start recorded, its health awaited.
    site.wait_until(
        &token,
        &id,
        "awaits the health of both new containers",
        |s| {
            let steps = s["steps"].as_array().cloned().unwrap_or_default();
            ["t1", "t2"].iter().all(|t| {
                steps.iter().any(|step| {
                    step["name"] == format!("{t}: health {p}-{t}-2") && step["status"] == "RUNNING"
                })
            })
        },
    )
    .await;
    let running = made.containers(false);
    assert!(
        new.iter().all(|c| running.contains(c)),
        "version 2's containers run, beside version 1's: {running:?}"
    );
    signal(site.child(1), "KILL");
    site.child(1).wait().unwrap();
    site.start_with("worker", "w2", &[("MANENT__RECOVERY__AUTOMATIC", "true")]);
    assert_eq!(
        served(&urls[0]).await,
        "v1",
        "the proxy still serves version 1"
    );
    for c in &new {
        podman(&["exec", c, "touch", "/www/health"]);
    }
    let done = site
        .wait_until(&token, &id, "ends", |s| {
            matches!(s["status"].as_str(), Some("SUCCESS" | "ERROR"))
        })
        .await;
    assert_eq!(
        done["status"],
        "SUCCESS",
        "w2 finishes the deploy: {}",
        details(&done)
    );
    let steps = done["steps"].as_array().expect("the deploy's steps");
    let start = steps
        .iter()
        .find(|s| s["name"] == format!("t1: start {p}-t1-2"))
        .unwrap_or_else(|| panic!("t1's start step: {done}"));
    assert_eq!(
        (start["executor_id"].as_str(), start["attempts"].as_i64()),
        (Some("w1"), Some(1)),
        "the container was started once, by w1: {start}"
    );
    assert_eq!(
        made.containers(true)
            .iter()
            .filter(|c| c.ends_with("-2"))
            .count(),
        2,
        "one container of version 2 a target, never a second: {:?}",
        made.containers(true)
    );
    assert_eq!(
        made.containers(false),
        new,
        "only the containers the proxies point at run"
    );
    let (answered, failures) = load.finish().await;
    assert!(
        failures.is_empty() && answered > 0,
        "no request failed across the kill and the take-over ({answered} answered): {failures:?}"
    );
    drop(hosts);
}

/// `manent drift acme/web prod`: its exit code, and each target's state with its
/// differences (`path expected found`).
fn drift(site: &Site, token: &str) -> (i32, Vec<String>) {
    let (code, report) = site.cli(token, &["drift", "acme/web", "prod"]);
    let shown = report["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let differences: Vec<String> = t["differences"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| format!("{} {} {}", d["path"], d["expected"], d["found"]))
                .collect();
            format!(
                "{} {} [{}] {}",
                t["name"],
                t["state"],
                differences.join("; "),
                t["detail"]
            )
        })
        .collect();
    (code, shown)
}

/// The proxy of `base`'s runtime API on this machine (the targets are loopback sshd hosts
/// of this user): `command`'s answer.
fn proxy_api(base: &str, command: &str) -> String {
    let home = std::env::var("HOME").expect("HOME");
    let out = Command::new("socat")
        .args([
            "-t",
            "5",
            "stdio",
            &format!("unix-connect:{home}/.manent/proxy/{base}/admin.sock"),
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("socat's stdin")
                .write_all(format!("{command}\n").as_bytes())?;
            child.wait_with_output()
        })
        .expect("run socat");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn drift_finds_a_stopped_container_another_one_and_a_proxy_pointing_elsewhere(db: Db) {
    let made = Made::new(&format!("drift-{db:?}").to_lowercase());
    let (hosts, site, token, listen) = setup(db, &made).await;
    let v1 = image(&site, &made, "1", Some("v1"), true);
    let (code, first) = deploy(&site, &token, &descriptor(&site, "1", &v1));
    assert_eq!(code, 0, "version 1 is deployed: {}", details(&first));
    assert!(
        details(&first).contains("manifest: container "),
        "each target's detail says its manifest records the container: {}",
        details(&first)
    );
    let p = &made.prefix;
    let in_sync = ["\"t1\" \"in_sync\" [] null", "\"t2\" \"in_sync\" [] null"];
    assert_eq!(
        drift(&site, &token),
        (0, in_sync.map(String::from).to_vec()),
        "the containers as deployed are in sync"
    );

    let t1 = format!("{p}-t1-1");
    podman(&["stop", "-t", "1", &t1]);
    let (code, found) = drift(&site, &token);
    assert!(
        code == 1
            && found[0].contains(&format!("\"container {t1}\" \"running\" \"stopped\""))
            && found[1] == in_sync[1],
        "the recorded container stopped by hand is drifted on t1 only: {found:?}"
    );
    podman(&["start", &t1]);
    assert_eq!(
        drift(&site, &token).0,
        0,
        "the container started again is in sync"
    );

    let other = format!("{p}-t2-by-hand");
    podman(&[
        "run",
        "-d",
        "--name",
        &other,
        "--label",
        &format!("manent.owner={p}-t2"),
        &format!("localhost/manent/{p}-t2:1"),
    ]);
    let (code, found) = drift(&site, &token);
    assert!(
        code == 1
            && found[1].contains(&format!("\"container {other}\" null \"running\""))
            && found[0] == in_sync[0],
        "a second container of the application running on t2 is drifted: {found:?}"
    );
    podman(&["rm", "-f", &other]);
    assert_eq!(
        drift(&site, &token).0,
        0,
        "the container removed, t2 is in sync again"
    );

    proxy_api(
        &format!("{p}-t1"),
        &format!("set server live/{t1} state drain"),
    );
    let (code, found) = drift(&site, &token);
    let proxy = format!("proxy {}:{listen}", hosts.hosts[0].addr);
    assert!(
        code == 1 && found[0].contains(&format!("\"{proxy}\" \"-> {t1} (127.0.0.1:")),
        "a proxy that no longer sends new requests to the recorded container is drifted: {found:?}"
    );
    proxy_api(
        &format!("{p}-t1"),
        &format!("set server live/{t1} state ready"),
    );
    assert_eq!(
        drift(&site, &token),
        (0, in_sync.map(String::from).to_vec()),
        "the proxy back on the recorded container is in sync"
    );
    drop(hosts);
}
