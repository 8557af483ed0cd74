//! The test hub over real HTTP, checked the way a hub client reads it.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use ondo_testhub::{TestHub, git_blob_id};
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tempfile::TempDir;

const REPO: &str = "mlx-community/Tiny-4bit";
const WEIGHTS_BYTES: usize = 100_000;

/// A small model folder: two regular files (one nested) and one LFS file.
fn model_folder() -> TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), br#"{"model_type":"llama"}"#).unwrap();
    std::fs::create_dir(dir.path().join("nested")).unwrap();
    std::fs::write(dir.path().join("nested/notes.txt"), b"hello").unwrap();
    let weights: Vec<u8> = (0..WEIGHTS_BYTES).map(|i| (i % 251) as u8).collect();
    std::fs::write(dir.path().join("model.safetensors"), weights).unwrap();
    dir
}

fn hub_with_model() -> (TestHub, TempDir) {
    let hub = TestHub::start().unwrap();
    let folder = model_folder();
    hub.add_repo(REPO, folder.path()).unwrap();
    (hub, folder)
}

fn sha256_of(path: &Path) -> String {
    Sha256::digest(std::fs::read(path).unwrap())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A GET over a plain socket: no client library, no runtime, no path clean-up.
fn raw_get(address: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

/// GETs `url` with a `Range` header.
async fn get_range(client: &reqwest::Client, url: &str, range: &str) -> reqwest::Response {
    client.get(url).header("Range", range).send().await.unwrap()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("missing header {name}"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn info_lists_files_and_blobs_on_request() {
    let (hub, folder) = hub_with_model();
    let commit = hub.commit_of(REPO).unwrap();
    assert_eq!(commit.len(), 40);

    let url = format!("{}/api/models/{REPO}", hub.url());
    let info: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(info["id"], REPO);
    assert_eq!(info["modelId"], REPO);
    assert_eq!(info["sha"], commit.as_str());
    assert_eq!(info["gated"], false);
    assert_eq!(info["library_name"], "mlx");
    let names: Vec<&str> = info["siblings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["rfilename"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["config.json", "model.safetensors", "nested/notes.txt"]
    );
    assert!(info["siblings"][0].get("size").is_none());

    let url = format!("{}/api/models/{REPO}/revision/main?blobs=true", hub.url());
    let info: Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    let siblings = info["siblings"].as_array().unwrap();
    let config = &siblings[0];
    assert_eq!(config["size"], 22);
    // A small file's blob id is git's name for its bytes.
    let config_bytes = std::fs::read(folder.path().join("config.json")).unwrap();
    assert_eq!(config["blobId"], git_blob_id(&config_bytes).as_str());
    assert!(config.get("lfs").is_none());
    let weights = &siblings[1];
    assert_eq!(weights["size"], WEIGHTS_BYTES);
    assert_eq!(weights["lfs"]["size"], WEIGHTS_BYTES);
    let weights_sha256 = sha256_of(&folder.path().join("model.safetensors"));
    assert_eq!(weights["lfs"]["sha256"], weights_sha256.as_str());
    // An LFS file's blob id is git's name for its pointer file.
    let pointer = format!(
        "version https://git-lfs.github.com/spec/v1\noid sha256:{weights_sha256}\nsize {WEIGHTS_BYTES}\n"
    );
    assert_eq!(weights["lfs"]["pointerSize"], pointer.len());
    assert_eq!(weights["blobId"], git_blob_id(pointer.as_bytes()).as_str());

    // The commit sha is a revision too.
    let url = format!("{}/api/models/{REPO}/revision/{commit}", hub.url());
    assert_eq!(reqwest::get(&url).await.unwrap().status(), StatusCode::OK);
}

#[tokio::test]
async fn small_file_redirects_relatively_to_the_resolve_cache() {
    let (hub, folder) = hub_with_model();
    let commit = hub.commit_of(REPO).unwrap();
    let url = format!("{}/{REPO}/resolve/main/config.json", hub.url());
    let config_bytes = std::fs::read(folder.path().join("config.json")).unwrap();
    let blob_id = git_blob_id(&config_bytes);

    // Like the hub: a 307 to a path on the same host, by commit, with the
    // file's identity in the headers.
    for method in [reqwest::Method::HEAD, reqwest::Method::GET] {
        let response = no_redirects().request(method, &url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
        let headers = response.headers();
        let location = header(headers, "location");
        assert!(
            location.starts_with(&format!(
                "/api/resolve-cache/models/{REPO}/{commit}/config.json?"
            )),
            "{location}"
        );
        assert!(
            location.ends_with(&format!("etag=%22{blob_id}%22")),
            "{location}"
        );
        assert_eq!(header(headers, "x-repo-commit"), commit);
        assert_eq!(header(headers, "etag"), format!("\"{blob_id}\""));
        assert!(headers.get("x-linked-etag").is_none());
    }

    // Followed (relative to the URL asked), it gives the bytes.
    let response = reqwest::get(&url).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.url().path().starts_with("/api/resolve-cache/"));
    let headers = response.headers().clone();
    assert_eq!(header(&headers, "x-repo-commit"), commit);
    assert_eq!(header(&headers, "etag"), format!("\"{blob_id}\""));
    assert_eq!(header(&headers, "accept-ranges"), "bytes");
    assert_eq!(header(&headers, "content-length"), "22");
    assert_eq!(response.bytes().await.unwrap().as_ref(), config_bytes);

    let nested = format!("{}/{REPO}/resolve/{commit}/nested/notes.txt", hub.url());
    let body = reqwest::get(&nested).await.unwrap().text().await.unwrap();
    assert_eq!(body, "hello");

    // The Range travels with the redirect.
    let range = get_range(&reqwest::Client::new(), &url, "bytes=2-5").await;
    assert_eq!(range.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(header(range.headers(), "content-range"), "bytes 2-5/22");
    assert_eq!(range.text().await.unwrap(), "mode");
}

#[tokio::test]
async fn lfs_file_redirects_to_storage_with_ranges() {
    let (hub, folder) = hub_with_model();
    let commit = hub.commit_of(REPO).unwrap();
    let weights = std::fs::read(folder.path().join("model.safetensors")).unwrap();
    let sha256 = sha256_of(&folder.path().join("model.safetensors"));
    let url = format!("{}/{REPO}/resolve/main/model.safetensors", hub.url());

    for method in [reqwest::Method::HEAD, reqwest::Method::GET] {
        let response = no_redirects().request(method, &url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::FOUND);
        let headers = response.headers();
        // Another host, as the hub's CDN is, with a signed expiry.
        let location = header(headers, "location");
        assert!(
            location.starts_with(&format!(
                "{}/storage/{sha256}?expires=",
                hub.url().replace("127.0.0.1", "localhost")
            )),
            "{location}"
        );
        assert_eq!(header(headers, "x-repo-commit"), commit);
        assert_eq!(header(headers, "x-linked-etag"), format!("\"{sha256}\""));
        assert_eq!(header(headers, "x-linked-size"), WEIGHTS_BYTES.to_string());
        assert_eq!(header(headers, "etag"), format!("\"{sha256}\""));
    }

    let followed = reqwest::get(&url).await.unwrap();
    assert_eq!(followed.status(), StatusCode::OK);
    assert_eq!(header(followed.headers(), "etag"), format!("\"{sha256}\""));
    assert_eq!(followed.bytes().await.unwrap().as_ref(), weights);

    let client = reqwest::Client::new();
    let part = get_range(&client, &url, "bytes=1000-1999").await;
    assert_eq!(part.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(
        header(part.headers(), "content-range"),
        format!("bytes 1000-1999/{WEIGHTS_BYTES}")
    );
    assert_eq!(part.bytes().await.unwrap().as_ref(), &weights[1000..2000]);

    let tail = get_range(&client, &url, "bytes=99990-").await;
    assert_eq!(tail.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(tail.bytes().await.unwrap().as_ref(), &weights[99990..]);

    let past_end = get_range(&client, &url, &format!("bytes={WEIGHTS_BYTES}-")).await;
    assert_eq!(past_end.status(), StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(
        header(past_end.headers(), "content-range"),
        format!("bytes */{WEIGHTS_BYTES}")
    );

    let malformed = get_range(&client, &url, "bytes=oops").await;
    assert_eq!(malformed.status(), StatusCode::OK);
    assert_eq!(malformed.bytes().await.unwrap().len(), WEIGHTS_BYTES);
}

#[tokio::test]
async fn errors_carry_the_hubs_codes() {
    let (hub, _folder) = hub_with_model();
    let base = hub.url();
    let cases = [
        // Without a token, an unknown repo is 401: it might be a private one.
        (
            format!("{base}/api/models/nobody/nothing"),
            401,
            Some("RepoNotFound"),
        ),
        (
            format!("{base}/nobody/nothing/resolve/main/config.json"),
            401,
            Some("RepoNotFound"),
        ),
        (
            format!("{base}/api/models/{REPO}/revision/v9"),
            404,
            Some("RevisionNotFound"),
        ),
        (
            format!("{base}/{REPO}/resolve/v9/config.json"),
            404,
            Some("RevisionNotFound"),
        ),
        (
            format!("{base}/{REPO}/resolve/main/missing.json"),
            404,
            Some("EntryNotFound"),
        ),
        (format!("{base}/api/models/org/bad..name"), 400, None),
    ];
    for (url, status, code) in cases {
        let response = reqwest::get(&url).await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{url}");
        let got_code = response
            .headers()
            .get("x-error-code")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(got_code.as_deref(), code, "{url}");
        let message = header(response.headers(), "x-error-message").to_string();
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"].as_str(), Some(message.as_str()), "{url}");
    }
    // With a token, the hub can say it does not exist: 404.
    let with_token = reqwest::Client::new()
        .get(format!("{base}/api/models/nobody/nothing"))
        .bearer_auth("hf_someone")
        .send()
        .await
        .unwrap();
    assert_eq!(with_token.status(), StatusCode::NOT_FOUND);
    assert_eq!(header(with_token.headers(), "x-error-code"), "RepoNotFound");
    let body: Value = reqwest::get(format!("{base}/api/models/nobody/nothing"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .starts_with("Repository Not Found for url: ")
    );

    // reqwest normalises `..` away, so send it raw.
    let address = base.trim_start_matches("http://");
    let response = raw_get(
        address,
        &format!("/{REPO}/resolve/main/nested/../config.json"),
    );
    assert!(response.starts_with("HTTP/1.1 400"), "{response}");
}

#[tokio::test]
async fn gated_repo_shows_its_info_to_anyone_and_its_files_only_with_the_token() {
    let (hub, _folder) = hub_with_model();
    hub.set_gated(REPO, Some("hf_secret"));
    let client = no_redirects();
    let info_url = format!("{}/api/models/{REPO}?blobs=true", hub.url());
    let small_url = format!("{}/{REPO}/resolve/main/config.json", hub.url());
    let lfs_url = format!("{}/{REPO}/resolve/main/model.safetensors", hub.url());

    // The info is public, and says the repo is gated.
    let info: Value = client
        .get(&info_url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["gated"], "manual");
    assert_eq!(info["siblings"].as_array().unwrap().len(), 3);

    for url in [&small_url, &lfs_url] {
        let anonymous = client.get(url).send().await.unwrap();
        assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED, "{url}");
        assert_eq!(header(anonymous.headers(), "x-error-code"), "GatedRepo");

        let wrong = client
            .get(url)
            .bearer_auth("hf_other")
            .send()
            .await
            .unwrap();
        assert_eq!(wrong.status(), StatusCode::FORBIDDEN, "{url}");
        assert_eq!(header(wrong.headers(), "x-error-code"), "GatedRepo");
        let body: Value = wrong.json().await.unwrap();
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("not in the authorized list")
        );
    }

    // The resolve cache a small file redirects to is gated too.
    let redirect = client
        .get(&small_url)
        .bearer_auth("hf_secret")
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), StatusCode::TEMPORARY_REDIRECT);
    let cached = format!("{}{}", hub.url(), header(redirect.headers(), "location"));
    assert_eq!(
        client.get(&cached).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    let body = client
        .get(&cached)
        .bearer_auth("hf_secret")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(body, r#"{"model_type":"llama"}"#);

    let redirect = client
        .get(&lfs_url)
        .bearer_auth("hf_secret")
        .send()
        .await
        .unwrap();
    assert_eq!(redirect.status(), StatusCode::FOUND);
    // Storage needs no token, like a signed CDN url.
    let location = header(redirect.headers(), "location").to_string();
    assert_eq!(
        client.get(&location).send().await.unwrap().status(),
        StatusCode::OK
    );

    hub.set_gated(REPO, None);
    assert_eq!(
        client.get(&lfs_url).send().await.unwrap().status(),
        StatusCode::FOUND
    );
}

#[tokio::test]
async fn storage_links_expire_and_refuse_a_token() {
    let (hub, _folder) = hub_with_model();
    hub.set_link_lifetime(Duration::from_millis(300));
    let client = no_redirects();
    let url = format!("{}/{REPO}/resolve/main/model.safetensors", hub.url());
    let link = |response: reqwest::Response| header(response.headers(), "location").to_string();

    let first = link(client.get(&url).send().await.unwrap());
    assert_eq!(
        client.get(&first).send().await.unwrap().status(),
        StatusCode::OK
    );
    // A token beside the link's own signature is refused, as S3 does.
    let with_token = client.get(&first).bearer_auth("hf_x").send().await.unwrap();
    assert_eq!(with_token.status(), StatusCode::BAD_REQUEST);
    assert!(
        with_token
            .text()
            .await
            .unwrap()
            .contains("Only one auth mechanism allowed")
    );

    std::thread::sleep(Duration::from_millis(400));
    let expired = client.get(&first).send().await.unwrap();
    assert_eq!(expired.status(), StatusCode::FORBIDDEN);
    assert!(
        expired
            .text()
            .await
            .unwrap()
            .contains("Request has expired")
    );
    // A link without its expiry is no link.
    let unsigned = first.split('?').next().unwrap();
    assert_eq!(
        client.get(unsigned).send().await.unwrap().status(),
        StatusCode::FORBIDDEN
    );

    // The hub hands out a fresh one.
    let fresh = link(client.get(&url).send().await.unwrap());
    assert_ne!(fresh, first);
    let body = client
        .get(&fresh)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(body.len(), WEIGHTS_BYTES);
}

#[tokio::test]
async fn busy_answers_come_first_with_their_retry_after() {
    let (hub, _folder) = hub_with_model();
    hub.answer_busy("", 1, 503, Some("1"));
    hub.answer_busy("/resolve/", 2, 429, Some("Wed, 21 Oct 2026 07:28:00 GMT"));
    hub.answer_busy("/storage/", 1, 502, None);
    let client = no_redirects();
    let info_url = format!("{}/api/models/{REPO}", hub.url());
    let file_url = format!("{}/{REPO}/resolve/main/model.safetensors", hub.url());

    // The first request of any kind gets the 503.
    let first = client.get(&info_url).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(first.headers(), "retry-after"), "1");
    // Info is not a file: the 429s wait for one.
    assert_eq!(
        client.get(&info_url).send().await.unwrap().status(),
        StatusCode::OK
    );
    for _ in 0..2 {
        let busy = client.get(&file_url).send().await.unwrap();
        assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            header(busy.headers(), "retry-after"),
            "Wed, 21 Oct 2026 07:28:00 GMT"
        );
        let body: Value = busy.json().await.unwrap();
        assert!(body["error"].as_str().unwrap().contains("rate-limited"));
    }
    let redirect = client.get(&file_url).send().await.unwrap();
    assert_eq!(redirect.status(), StatusCode::FOUND);
    let location = header(redirect.headers(), "location").to_string();
    let storage = client.get(&location).send().await.unwrap();
    assert_eq!(storage.status(), StatusCode::BAD_GATEWAY);
    assert!(storage.headers().get("retry-after").is_none());
    assert_eq!(
        client.get(&location).send().await.unwrap().status(),
        StatusCode::OK
    );
    // Every busy answer is in the log like any other.
    let statuses: Vec<u16> = hub.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [503, 200, 429, 429, 302, 502, 200]);
}

#[tokio::test]
async fn a_refused_token_gets_401_even_for_a_public_repo() {
    let (hub, _folder) = hub_with_model();
    hub.refuse_token("hf_revoked");
    let client = no_redirects();
    for url in [
        format!("{}/api/models/{REPO}", hub.url()),
        format!("{}/{REPO}/resolve/main/config.json", hub.url()),
        format!("{}/api/models/nobody/nothing", hub.url()),
    ] {
        let refused = client
            .get(&url)
            .bearer_auth("hf_revoked")
            .send()
            .await
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{url}");
        // What the real hub sends: a misleading code, a telling message.
        assert_eq!(header(refused.headers(), "x-error-code"), "RepoNotFound");
        assert_eq!(
            header(refused.headers(), "x-error-message"),
            "Invalid credentials in Authorization header"
        );
    }
    // Without it, or with another, the public repo is there.
    let url = format!("{}/api/models/{REPO}", hub.url());
    assert_eq!(
        client.get(&url).send().await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        client
            .get(&url)
            .bearer_auth("hf_good")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    let tokens: Vec<Option<String>> = hub.requests().into_iter().map(|r| r.token).collect();
    assert_eq!(tokens[0].as_deref(), Some("hf_revoked"));
    assert_eq!(tokens[3], None);
}

#[tokio::test]
async fn main_moves_after_the_asked_number_of_file_requests() {
    let (hub, folder) = hub_with_model();
    let first = hub.commit_of(REPO).unwrap();
    let pushed = tempfile::tempdir().unwrap();
    std::fs::write(
        pushed.path().join("config.json"),
        br#"{"model_type":"qwen2"}"#,
    )
    .unwrap();
    std::fs::copy(
        folder.path().join("model.safetensors"),
        pushed.path().join("model.safetensors"),
    )
    .unwrap();
    let second = hub.move_main_after(REPO, 2, pushed.path()).unwrap();
    assert_ne!(second.commit, first);
    // Nothing moves before the file requests.
    assert_eq!(hub.commit_of(REPO).unwrap(), first);

    let config_at = |revision: String| {
        let url = format!("{}/{REPO}/resolve/{revision}/config.json", hub.url());
        async move {
            let response = reqwest::get(&url).await.unwrap();
            let commit = header(response.headers(), "x-repo-commit").to_string();
            (commit, response.text().await.unwrap())
        }
    };
    // Each followed request is one file request (the resolve cache is not).
    assert_eq!(config_at("main".into()).await.0, first);
    assert_eq!(config_at("main".into()).await.0, first);
    let (commit, body) = config_at("main".into()).await;
    assert_eq!(commit, second.commit);
    assert_eq!(body, r#"{"model_type":"qwen2"}"#);
    assert_eq!(hub.commit_of(REPO).unwrap(), second.commit);

    // The commit it left is still there by its sha, files and info alike.
    let (commit, body) = config_at(first.clone()).await;
    assert_eq!(commit, first);
    assert_eq!(body, r#"{"model_type":"llama"}"#);
    let info: Value = reqwest::get(format!("{}/api/models/{REPO}/revision/{first}", hub.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["sha"], first.as_str());
    let info: Value = reqwest::get(format!("{}/api/models/{REPO}", hub.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["sha"], second.commit.as_str());
    // The pushed commit has no nested/notes.txt.
    assert_eq!(info["siblings"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn search_filters_by_text_tag_and_limit() {
    let hub = TestHub::start().unwrap();
    let folder = model_folder();
    for id in [
        "mlx-community/Qwen3-0.6B",
        "mlx-community/Llama-1B",
        "other/qwen-tiny",
    ] {
        hub.add_repo(id, folder.path()).unwrap();
    }
    let search = |query: &str| {
        let url = format!("{}/api/models?{query}", hub.url());
        async move {
            let found: Vec<Value> = reqwest::get(url).await.unwrap().json().await.unwrap();
            found
        }
    };
    let ids = |found: &[Value]| -> Vec<String> {
        let mut ids: Vec<String> = found
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect();
        ids.sort();
        ids
    };

    let found = search("search=QWEN&filter=mlx").await;
    assert_eq!(ids(&found), ["mlx-community/Qwen3-0.6B", "other/qwen-tiny"]);
    assert_eq!(found[0]["pipeline_tag"], "text-generation");
    assert_eq!(found[0]["library_name"], "mlx");
    assert!(found[0]["downloads"].is_u64());

    assert_eq!(search("").await.len(), 3);
    assert_eq!(search("filter=gguf").await.len(), 0);
    assert_eq!(search("search=nothing-like-this").await.len(), 0);

    let sorted = search("filter=mlx&sort=downloads&direction=-1&limit=2").await;
    assert_eq!(sorted.len(), 2);
    let all = search("sort=downloads&direction=-1").await;
    let downloads: Vec<u64> = all
        .iter()
        .map(|m| m["downloads"].as_u64().unwrap())
        .collect();
    assert!(downloads.windows(2).all(|pair| pair[0] >= pair[1]));
    assert_eq!(sorted[..], all[..2]);

    // The config's type only when asked for, as the hub's `config=true`.
    assert!(found[0].get("config").is_none());
    let with_config = search("search=QWEN&config=true").await;
    assert_eq!(with_config.len(), 2);
    for hit in &with_config {
        assert_eq!(
            hit["config"],
            serde_json::json!({ "model_type": "llama" }),
            "{hit}"
        );
    }
}

#[tokio::test]
async fn dropped_transfer_fails_the_body_read() {
    let (hub, _folder) = hub_with_model();
    hub.drop_next_transfers(1, 1000);
    let url = format!("{}/{REPO}/resolve/main/model.safetensors", hub.url());
    let client = reqwest::Client::new();

    // A one-byte probe is shorter than the cut and does not use up the drop.
    let probe = get_range(&client, &url, "bytes=0-0").await;
    assert_eq!(probe.bytes().await.unwrap().len(), 1);

    let served_before = hub.body_bytes_served();
    let mut response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        header(response.headers(), "content-length"),
        WEIGHTS_BYTES.to_string()
    );
    let mut received = 0;
    let error = loop {
        match response.chunk().await {
            Ok(Some(chunk)) => received += chunk.len(),
            Ok(None) => panic!("the body ended cleanly after {received} bytes"),
            Err(error) => break error,
        }
    };
    assert!(error.is_body() || error.is_decode(), "{error:?}");
    assert_eq!(received, 1000);
    assert_eq!(hub.body_bytes_served() - served_before, 1000);

    let again = client.get(&url).send().await.unwrap();
    assert_eq!(again.bytes().await.unwrap().len(), WEIGHTS_BYTES);
}

#[tokio::test]
async fn corrupted_file_has_one_byte_flipped_and_true_headers() {
    let (hub, folder) = hub_with_model();
    let weights = std::fs::read(folder.path().join("model.safetensors")).unwrap();
    let sha256 = sha256_of(&folder.path().join("model.safetensors"));
    assert!(hub.corrupt(REPO, "model.safetensors"));
    assert!(!hub.corrupt(REPO, "missing.bin"));

    let url = format!("{}/{REPO}/resolve/main/model.safetensors", hub.url());
    let response = reqwest::get(&url).await.unwrap();
    assert_eq!(header(response.headers(), "etag"), format!("\"{sha256}\""));
    let served = response.bytes().await.unwrap();
    assert_eq!(served.len(), weights.len());
    let differing: Vec<usize> = (0..weights.len())
        .filter(|&i| served[i] != weights[i])
        .collect();
    assert_eq!(differing, [WEIGHTS_BYTES / 2]);

    let info: Value = reqwest::get(format!("{}/api/models/{REPO}?blobs=true", hub.url()))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(info["siblings"][1]["lfs"]["sha256"], sha256.as_str());
}

#[tokio::test]
async fn throttle_slows_file_bodies() {
    let (hub, _folder) = hub_with_model();
    hub.set_bytes_per_second(Some(200_000));
    let url = format!("{}/{REPO}/resolve/main/model.safetensors", hub.url());
    let started = Instant::now();
    let body = reqwest::get(&url).await.unwrap().bytes().await.unwrap();
    assert_eq!(body.len(), WEIGHTS_BYTES);
    // 100 kB at 200 kB/s is half a second; allow for timer slack below that.
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test]
async fn dropping_the_hub_cuts_slow_transfers() {
    let (hub, _folder) = hub_with_model();
    hub.set_bytes_per_second(Some(1000));
    let url = format!("{}/{REPO}/resolve/main/model.safetensors", hub.url());
    let response = reqwest::get(&url).await.unwrap();
    let started = Instant::now();
    drop(hub);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(response.bytes().await.is_err());
}

#[tokio::test]
async fn request_log_records_ranges_and_bytes_served() {
    let (hub, _folder) = hub_with_model();
    let url = format!("{}/{REPO}/resolve/main/config.json", hub.url());
    let client = no_redirects();
    let redirect = get_range(&client, &url, "bytes=10-").await;
    let cached = format!("{}{}", hub.url(), header(redirect.headers(), "location"));
    get_range(&client, &cached, "bytes=10-")
        .await
        .bytes()
        .await
        .unwrap();
    reqwest::get(format!("{}/api/models/{REPO}?blobs=true", hub.url()))
        .await
        .unwrap();

    let requests = hub.requests();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(
        requests[0].path,
        format!("/{REPO}/resolve/main/config.json")
    );
    assert_eq!(requests[0].range.as_deref(), Some("bytes=10-"));
    assert_eq!(requests[0].status, 307);
    assert!(requests[1].path.starts_with("/api/resolve-cache/"));
    assert_eq!(requests[1].status, 206);
    assert_eq!(requests[2].path, format!("/api/models/{REPO}"));
    assert_eq!(requests[2].query.as_deref(), Some("blobs=true"));
    assert_eq!(requests[2].range, None);
    assert_eq!(requests[2].token, None);
    assert_eq!(hub.body_bytes_served(), 12);
}

#[tokio::test]
async fn adding_a_repo_again_replaces_it() {
    let (hub, folder) = hub_with_model();
    let first = hub.commit_of(REPO).unwrap();
    std::fs::write(folder.path().join("config.json"), b"{}").unwrap();
    let served = hub.add_repo(REPO, folder.path()).unwrap();
    assert_ne!(served.commit, first);
    assert_eq!(hub.commit_of(REPO), Some(served.commit.clone()));

    let old = reqwest::get(format!("{}/{REPO}/resolve/{first}/config.json", hub.url()))
        .await
        .unwrap();
    assert_eq!(old.status(), StatusCode::NOT_FOUND);
    let new = reqwest::get(format!("{}/{REPO}/resolve/main/config.json", hub.url()))
        .await
        .unwrap();
    assert_eq!(new.text().await.unwrap(), "{}");
}

/// Sync callers need no runtime of their own.
#[test]
fn serves_sync_callers() {
    let (hub, _folder) = hub_with_model();
    let url = hub.url();
    let address = url.trim_start_matches("http://");
    let redirect = raw_get(address, &format!("/{REPO}/resolve/main/nested/notes.txt"));
    assert!(redirect.starts_with("HTTP/1.1 307"), "{redirect}");
    let location = redirect
        .lines()
        .find_map(|line| line.strip_prefix("location: "))
        .unwrap();
    let response = raw_get(address, location);
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.ends_with("\r\n\r\nhello"));
}

#[test]
fn binary_prints_its_url_and_serves() {
    let folder = model_folder();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ondo-testhub"))
        .arg("--repo")
        .arg(format!("{REPO}={}", folder.path().display()))
        .args(["--gated", "org/private=hf_secret"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line
        .trim_end()
        .strip_prefix("ondo-testhub listening on ")
        .unwrap()
        .to_string();
    assert!(url.starts_with("http://127.0.0.1:"));

    let response = raw_get(
        url.trim_start_matches("http://"),
        &format!("/api/models/{REPO}"),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
    assert!(response.contains(REPO));
}
