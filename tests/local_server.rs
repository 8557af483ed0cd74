//! The local server as the app will hold it (`ondo::api::LocalServer`):
//! started from inside an async runtime, it says what it serves (requests
//! served, the client in flight), cancels what is in flight when asked, and
//! its port can be taken again right after it stops.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ondo::api::{LocalServer, RequestLog, ServerConfig};
use ondo::run_kinds::StopReason;
use ondo::session::{PoolSettings, SessionPool};
use ondo::store::Store;
use ondo_os::PressureLevel;

#[test]
fn the_server_says_what_it_serves_and_cancels_when_asked() {
    let home = tempfile::tempdir().unwrap();
    // SAFETY: the only test of this binary sets these before any thread of
    // its own reads the environment.
    unsafe {
        std::env::set_var("ONDO_HOME", home.path().join("ondo"));
        std::env::set_var("HF_HOME", home.path().join("hf"));
        std::env::set_var("HF_HUB_OFFLINE", "1");
    }
    let store = Store::open_default(&home.path().join("ondo")).unwrap();
    let pool = Arc::new(
        SessionPool::start_with_pressure_source(
            PoolSettings::default(),
            Some(store),
            Box::new(|| PressureLevel::Normal),
        )
        .unwrap(),
    );
    let logged: Arc<Mutex<Vec<RequestLog>>> = Arc::default();
    let config = ServerConfig {
        port: 0,
        ..ServerConfig::default()
    };
    // The app's commands run on an async runtime; starting there must work.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let server = runtime
        .block_on(async {
            let logged = logged.clone();
            LocalServer::start(
                pool.clone(),
                config.clone(),
                Arc::new(move |log: &RequestLog| logged.lock().unwrap().push(log.clone())),
            )
        })
        .unwrap();
    assert!(
        server.url().starts_with("http://127.0.0.1:"),
        "{}",
        server.url()
    );
    let status = server.status();
    assert_eq!((status.requests_served, status.waiting), (0, 0));
    assert_eq!(status.in_flight, None);

    // A long answer in flight: the status names its client.
    let address = server.address();
    let mut stream = TcpStream::connect(address).unwrap();
    let body = serde_json::json!({
        "model": "tiny", "stream": true, "max_tokens": 30000, "ignore_eos": true,
        "messages": [{"role": "user", "content": "Tell me a long story."}],
    })
    .to_string();
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {address}\r\nUser-Agent: test-client/1.0\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let in_flight = loop {
        if let Some(client) = server.status().in_flight {
            break client;
        }
        assert!(Instant::now() < deadline, "never in flight");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(in_flight.model, "tiny");
    assert_eq!(in_flight.route, "POST /v1/chat/completions");
    assert_eq!(in_flight.user_agent.as_deref(), Some("test-client/1.0"));

    // Cancelled, it ends at once rather than after 30 000 tokens.
    let cancelled_at = Instant::now();
    server.cancel_in_flight();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    assert!(cancelled_at.elapsed() < Duration::from_secs(10));
    assert!(answer.contains("\"finish_reason\":\"stop\""), "{answer}");
    assert!(answer.contains("data: [DONE]"));
    let status = server.status();
    assert_eq!(status.requests_served, 1);
    assert_eq!(status.in_flight, None);
    let log = logged.lock().unwrap().clone();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0].stop_reason, Some(StopReason::Cancelled));
    assert_eq!(log[0].model.as_deref(), Some("tiny"));

    // Stopped, its port can be taken again at once (a restart).
    let port = address.port();
    server.stop();
    let again = LocalServer::start(
        pool,
        ServerConfig { port, ..config },
        Arc::new(|_: &RequestLog| {}),
    )
    .unwrap();
    assert_eq!(again.address().port(), port);
    again.stop();
}
