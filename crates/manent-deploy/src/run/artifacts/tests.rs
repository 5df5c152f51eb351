//! Tests of artifact fetching: sources, redirects, sha256, size limits, the kept copies
//! a retry or rollback reuses, and what a plugin may have planted in their place.

use super::*;
use crate::http::{
    NoClient,
    canned::{Answer, Canned},
};

/// The application of the deploys of the tests.
const APP: &str = "acme/web";

/// The `.part` files in `dir`.
fn parts(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|name| name.ends_with(".part"))
                .collect()
        })
        .unwrap_or_default()
}

fn artifact(url: String, sha256: &str) -> Artifact {
    Artifact {
        name: "app.tar".into(),
        artifact_type: "tarball".into(),
        version: "1".into(),
        url,
        sha256: sha256.into(),
        reference: None,
    }
}

/// Sources admitting everything under `dir`.
fn sources_of(dir: &Path) -> ArtifactSources {
    let root = std::fs::canonicalize(dir).unwrap();
    ArtifactSources::parse(&[format!("file://{}/", root.display())]).unwrap()
}

#[test]
fn what_was_verified_is_forgotten_with_its_work_directory_and_stays_bounded() {
    let root = tempfile::tempdir().unwrap();
    let file = |dir: &str| {
        let path = root.path().join(dir).join("app.tar");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, dir).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        (path, meta)
    };
    let (ended, ended_meta) = file("deploy-ended");
    let (running, running_meta) = file("deploy-running");
    remember(&ended, &ended_meta, "aa");
    remember(&running, &running_meta, "bb");
    forget_dir(&root.path().join("deploy-ended"));
    assert_eq!(
        known_sha256(&ended, &ended_meta),
        None,
        "forgotten with its directory"
    );
    assert_eq!(
        known_sha256(&running, &running_meta).as_deref(),
        Some("bb"),
        "another deploy's file is still known"
    );
    // Past the bound, files that are gone go first.
    for i in 0..MAX_VERIFIED {
        remember(&root.path().join(format!("gone-{i}")), &running_meta, "cc");
    }
    assert!(
        verified().lock().unwrap().len() <= MAX_VERIFIED,
        "the cache never holds more than {MAX_VERIFIED} files"
    );
}

#[tokio::test]
async fn a_verified_artifact_is_fetched_once_and_a_mismatch_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let sources = sources_of(dir.path());
    let src = dir.path().join("src.tar");
    std::fs::write(&src, b"hello").unwrap();
    let good = hex::encode(Sha256::digest(b"hello"));
    let work = dir.path().join("work");
    let a = artifact(format!("file://{}", src.display()), &good);
    let local = ensure_local(&a, APP, &work, &sources, &NoClient)
        .await
        .expect("fetch");
    assert_eq!(
        std::fs::read(&local.path).unwrap(),
        b"hello",
        "the fetched artifact holds the source's bytes"
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&work).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the work directory is its owner's only");
    }
    std::fs::remove_file(&src).unwrap();
    let again = ensure_local(&a, APP, &work, &sources, &NoClient)
        .await
        .expect("present and verified: no fetch needed");
    assert_eq!(again, local, "a second fetch finds the first's file");

    let bad = artifact(
        format!("file://{}", dir.path().join("src.tar").display()),
        &"0".repeat(64),
    );
    std::fs::write(&src, b"tampered").unwrap();
    let other = dir.path().join("other");
    let err = ensure_local(&bad, APP, &other, &sources, &NoClient)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ArtifactError::Mismatch { .. }) && !err.is_transient(),
        "a wrong sha256 is a mismatch, not retried: {err}"
    );
    let tampered = hex::encode(Sha256::digest(b"tampered"));
    assert!(
        !err.to_string().contains(&tampered),
        "a mismatch never tells the fetched file's digest (an oracle for any file a source serves): {err}"
    );
    assert!(
        !other.join("app.tar").exists(),
        "nothing under the artifact's name after a mismatch"
    );
    assert_eq!(parts(&other), Vec::<String>::new(), "no partial file left");
}

/// What a plugin or a local command may leave where an earlier attempt kept its copy:
/// each is replaced by a verified fetch, and nothing is written through a link.
#[tokio::test]
async fn a_retry_replaces_links_and_directories_left_in_place_of_a_copy_and_writes_nothing_outside()
{
    let dir = tempfile::tempdir().unwrap();
    let sources = sources_of(dir.path());
    let src = dir.path().join("src.tar");
    std::fs::write(&src, b"release").unwrap();
    let a = artifact(
        format!("file://{}", src.display()),
        &hex::encode(Sha256::digest(b"release")),
    );
    // Acme's environment file (with the artifact's very bytes: a link to it would pass
    // a check of content alone) and a directory outside.
    let acme = dir.path().join("prod.yml");
    std::fs::write(&acme, b"release").unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let untouched = |step: &str| {
        assert_eq!(
            std::fs::read(&acme).unwrap(),
            b"release",
            "{step}: acme's file is untouched"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "{step}: nothing is written in the directory outside"
        );
    };
    let work = dir.path().join("deploy/artifacts");
    let path = work.join("app.tar");
    let plants: [(&str, &dyn Fn()); 4] = [
        ("a link in place of the copy", &|| {
            std::fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink(&acme, &path).unwrap();
        }),
        ("the copy gone, its .part a link", &|| {
            std::fs::remove_file(&path).unwrap();
            std::os::unix::fs::symlink(&acme, work.join("app.tar.part")).unwrap();
        }),
        ("a directory in place of the copy", &|| {
            std::fs::remove_file(&path).unwrap();
            std::fs::create_dir(&path).unwrap();
            std::os::unix::fs::symlink(&outside, path.join("escape")).unwrap();
        }),
        ("the artifacts directory a link", &|| {
            std::fs::remove_dir_all(&work).unwrap();
            std::os::unix::fs::symlink(&outside, &work).unwrap();
        }),
    ];
    ensure_local(&a, APP, &work, &sources, &NoClient)
        .await
        .expect("fetch");
    for (step, plant) in plants {
        plant();
        let again = ensure_local(&a, APP, &work, &sources, &NoClient)
            .await
            .unwrap_or_else(|e| panic!("{step}: fetched again: {e}"));
        let meta = std::fs::symlink_metadata(&again.path).unwrap();
        assert!(
            meta.is_file() && std::fs::symlink_metadata(&work).unwrap().is_dir(),
            "{step}: the copy is a regular file in a real directory: {meta:?}"
        );
        assert_eq!(
            std::fs::read(&again.path).unwrap(),
            b"release",
            "{step}: the copy has the artifact's bytes"
        );
        untouched(step);
    }
}

#[tokio::test]
async fn a_local_copy_changed_after_its_verification_is_verified_and_fetched_again() {
    let dir = tempfile::tempdir().unwrap();
    let sources = sources_of(dir.path());
    let src = dir.path().join("src.tar");
    std::fs::write(&src, b"hello").unwrap();
    let a = artifact(
        format!("file://{}", src.display()),
        &hex::encode(Sha256::digest(b"hello")),
    );
    let work = dir.path().join("work");
    let local = ensure_local(&a, APP, &work, &sources, &NoClient)
        .await
        .expect("fetch");
    // Same size, other bytes: only a re-hash can tell.
    std::fs::write(&local.path, b"jello").unwrap();
    let again = ensure_local(&a, APP, &work, &sources, &NoClient)
        .await
        .expect("fetched again");
    assert_eq!(
        std::fs::read(&again.path).unwrap(),
        b"hello",
        "the changed copy is not trusted from memory: it is replaced by a verified fetch"
    );
}

mod source_tests {
    use super::*;

    #[tokio::test]
    async fn a_symlink_out_of_the_source_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let releases = dir.path().join("releases");
        std::fs::create_dir(&releases).unwrap();
        let secret = dir.path().join("id_ed25519");
        std::fs::write(&secret, b"private key").unwrap();
        std::os::unix::fs::symlink(&secret, releases.join("app.tar")).unwrap();
        let root = std::fs::canonicalize(&releases).unwrap();
        let sources = ArtifactSources::parse(&[format!("file://{}/", root.display())]).unwrap();
        let artifact = Artifact {
            name: "app.tar".into(),
            artifact_type: "tarball".into(),
            version: "1".into(),
            url: format!("file://{}/app.tar", root.display()),
            sha256: hex::encode(Sha256::digest(b"private key")),
            reference: None,
        };
        let work = dir.path().join("work");
        let err = ensure_local(&artifact, APP, &work, &sources, &NoClient)
            .await
            .expect_err("a symlink leading out of the source is refused");
        assert!(
            matches!(err, ArtifactError::ResolvesOutside { .. }) && !err.is_transient(),
            "a symlink out of the sources is refused for good: {err}"
        );
        assert!(
            !work.join("app.tar").exists(),
            "nothing of the linked file reaches the work directory"
        );
    }

    /// The base URL of the artifact servers of these tests (answered in-process, by
    /// [`Canned`]: this crate holds no HTTP client).
    const BASE: &str = "http://artifacts.test";

    /// `/builds/moved` redirects within the source, `/builds/app.tar` redirects out of it
    /// (to an "internal" endpoint), and `/builds/current` and `/internal/secret` answer
    /// bodies.
    fn redirecting_server() -> Canned {
        Canned::new(|url| match url.strip_prefix(BASE).unwrap_or(url) {
            "/builds/moved" => Answer::redirect(format!("{BASE}/builds/current")),
            "/builds/app.tar" => Answer::redirect("/internal/secret"),
            "/builds/current" => Answer::ok("release"),
            "/internal/secret" => Answer::ok("secret"),
            _ => Answer::status(404),
        })
    }

    #[tokio::test]
    async fn a_redirect_is_followed_within_the_sources_and_refused_out_of_them() {
        let http = redirecting_server();
        let sources = ArtifactSources::parse(&[format!("{BASE}/builds/")]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let fetch = |path: &str, body: &[u8]| artifact_at(format!("{BASE}{path}"), body);

        let within = ensure_local(
            &fetch("/builds/moved", b"release"),
            APP,
            &dir.path().join("a"),
            &sources,
            &http,
        )
        .await
        .expect("a redirect to another URL under the source is followed");
        assert_eq!(
            std::fs::read(&within.path).unwrap(),
            b"release",
            "the artifact within the size limit is fetched whole"
        );

        let work = dir.path().join("b");
        let err = ensure_local(
            &fetch("/builds/app.tar", b"secret"),
            APP,
            &work,
            &sources,
            &http,
        )
        .await
        .expect_err("a redirect to an internal endpoint outside the sources is refused");
        assert!(
            err.to_string().contains(&format!(
                "redirected to {BASE}/internal/secret, which is under none of artifacts.sources"
            )),
            "the error says where the redirect went and that it left the sources: {err}"
        );
        assert!(
            !err.is_transient(),
            "a refused redirect is not retried: {err}"
        );
        assert!(
            !work.join("app.tar").exists(),
            "nothing of the internal endpoint reaches the work directory"
        );
        assert!(
            !http.urls().iter().any(|u| u.contains("/internal/")),
            "the endpoint outside the sources is never asked: {:?}",
            http.urls()
        );
    }

    #[tokio::test]
    async fn a_failed_answer_or_a_redirect_loop_fails_the_fetch_saying_which() {
        let http = Canned::new(|url| match url.strip_prefix(BASE).unwrap_or(url) {
            "/builds/busy.tar" => Answer::status(503),
            "/builds/loop" => Answer::redirect("/builds/loop"),
            "/builds/nowhere" => Answer::status(302),
            _ => Answer::status(404),
        });
        let sources = ArtifactSources::parse(&[format!("{BASE}/builds/")]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("/builds/busy.tar", "HTTP 503 Service Unavailable", true),
            ("/builds/gone.tar", "HTTP 404 Not Found", false),
            ("/builds/loop", "more than 10 redirects", false),
            (
                "/builds/nowhere",
                "HTTP 302 Found without a Location",
                false,
            ),
        ];
        for (path, said, transient) in cases {
            let err = ensure_local(
                &artifact_at(format!("{BASE}{path}"), b"x"),
                APP,
                &dir.path().join("work"),
                &sources,
                &http,
            )
            .await
            .expect_err("no artifact");
            assert!(
                err.to_string() == format!("cannot fetch {BASE}{path}: {said}")
                    && err.is_transient() == transient,
                "{path}: `{said}`, retried: {transient}; got `{err}`, retried: {}",
                err.is_transient()
            );
        }
        let err = ensure_local(
            &artifact_at(format!("{BASE}/builds/app.tar"), b"x"),
            APP,
            &dir.path().join("work"),
            &sources,
            &NoClient,
        )
        .await
        .expect_err("no client");
        assert!(
            err.to_string()
                == format!("cannot fetch {BASE}/builds/app.tar: this worker has no HTTP client")
                && !err.is_transient(),
            "a request the client refuses is not retried: {err}"
        );
    }

    fn artifact_at(url: String, body: &[u8]) -> Artifact {
        Artifact {
            name: "app.tar".into(),
            artifact_type: "tarball".into(),
            version: "1".into(),
            url,
            sha256: hex::encode(Sha256::digest(body)),
            reference: None,
        }
    }

    #[tokio::test]
    async fn credentials_reach_only_their_own_source_even_across_a_redirect() {
        // Credentials go over https:// only (or to a loopback address).
        const HTTPS: &str = "https://artifacts.test";
        let http = Canned::new(|url| match url.strip_prefix(HTTPS).unwrap_or(url) {
            "/private/moved" => Answer::redirect(format!("{HTTPS}/public/app.tar")),
            _ => Answer::ok("release"),
        });
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret\n").unwrap();
        let password = dir.path().join("password");
        std::fs::write(&password, "hunter2\n").unwrap();
        let file = dir.path().join("manent.yml");
        std::fs::write(
            &file,
            format!(
                "artifacts:\n  sources:\n    - url: {HTTPS}/private/\n      applications: \
                 [\"acme/*\"]\n      bearer_token_file: token\n    - {HTTPS}/public/\n\
                 \x20   - url: {HTTPS}/basic/\n      basic_auth: {{username: ci, password_file: \
                 password}}\n"
            ),
        )
        .unwrap();
        let sources = manent_config::Config::load(&file, std::iter::empty())
            .expect("a valid configuration")
            .artifact_sources();
        for (i, path) in [
            "/private/app.tar",
            "/private/moved",
            "/public/app.tar",
            "/basic/app.tar",
        ]
        .into_iter()
        .enumerate()
        {
            ensure_local(
                &artifact_at(format!("{HTTPS}{path}"), b"release"),
                APP,
                &dir.path().join(i.to_string()),
                &sources,
                &http,
            )
            .await
            .unwrap_or_else(|e| panic!("{path} is fetched: {e}"));
        }
        let seen: Vec<(String, Option<HttpAuth>)> = http
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.url.trim_start_matches(HTTPS).to_string(), r.auth.clone()))
            .collect();
        let bearer = Some(HttpAuth::Bearer("s3cret".into()));
        let basic = Some(HttpAuth::Basic {
            username: "ci".into(),
            password: "hunter2".into(),
        });
        assert_eq!(
            seen,
            [
                ("/private/app.tar".to_string(), bearer.clone()),
                ("/private/moved".to_string(), bearer),
                ("/public/app.tar".to_string(), None),
                ("/public/app.tar".to_string(), None),
                ("/basic/app.tar".to_string(), basic),
            ],
            "the token goes to its source only: not along a redirect to another, nor to \
             another source directly; each secret is read without its final newline"
        );
    }

    #[tokio::test]
    async fn a_download_over_the_size_limit_stops_there_and_leaves_no_part_file() {
        // 64 KiB, announced or not: the limit holds on the stream either way.
        let body = vec![7u8; 64 * 1024];
        let served = body.clone();
        let http = Canned::new(move |url| {
            if url.ends_with("/builds/announced.tar") {
                Answer::ok(served.clone())
            } else {
                Answer::status(200).body(served.clone())
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let local = std::fs::canonicalize(dir.path()).unwrap().join("releases");
        std::fs::create_dir(&local).unwrap();
        std::fs::write(local.join("big.tar"), &body).unwrap();
        let sources = ArtifactSources::parse(&[
            format!("{BASE}/builds/"),
            format!("file://{}/", local.display()),
        ])
        .unwrap()
        .with_max_bytes(10_000);
        for url in [
            format!("{BASE}/builds/announced.tar"),
            format!("{BASE}/builds/streamed.tar"),
            format!("file://{}/big.tar", local.display()),
        ] {
            let work = dir.path().join("work");
            let err = ensure_local(
                &artifact_at(url.clone(), &body),
                APP,
                &work,
                &sources,
                &http,
            )
            .await
            .expect_err("an artifact over max_bytes is refused");
            assert!(
                matches!(err, ArtifactError::TooLarge { limit: 10_000, .. }) && !err.is_transient(),
                "{url}: over the limit, for good: {err}"
            );
            let message = err.to_string();
            assert!(
                message.contains("artifact `app.tar`")
                    && message.contains("artifacts.max_bytes (10000 bytes)"),
                "{url}: the error names the artifact and the limit: {message}"
            );
            assert!(
                parts(&work).is_empty() && !work.join("app.tar").exists(),
                "{url}: nothing of the download is left behind"
            );
        }
        let within = sources.clone().with_max_bytes(body.len() as u64);
        ensure_local(
            &artifact_at(format!("{BASE}/builds/streamed.tar"), &body),
            APP,
            &dir.path().join("ok"),
            &within,
            &http,
        )
        .await
        .expect("an artifact of exactly max_bytes is fetched");
    }
}
