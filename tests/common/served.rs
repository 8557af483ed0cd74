//! A running `ondo serve` for the integration tests that talk to it over
//! plain HTTP/1.1 on loopback. Included with `#[path]` by the tests that
//! use it, so the others do not carry it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

pub struct Served {
    child: Child,
    pub url: String,
    /// What it printed on stderr so far (a line per request).
    log: Arc<Mutex<String>>,
}

impl Served {
    /// Starts `ondo` (a command with its environment set) as `serve` on a
    /// free port, and waits for the address it prints.
    #[allow(dead_code)] // Not every test binary that shares this module calls it.
    pub fn start(ondo: Command) -> Self {
        Self::start_with(ondo, &[])
    }

    /// `start`, with more of `serve`'s arguments.
    pub fn start_with(mut ondo: Command, args: &[&std::ffi::OsStr]) -> Self {
        let mut child = ondo
            .args(["serve", "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let heard = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = heard.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let url = first
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {first:?}; it said {}", log.lock().unwrap()))
            .trim_end_matches('/')
            .to_owned();
        Self { child, url, log }
    }

    /// What it has printed on stderr so far.
    #[allow(dead_code)]
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// POSTs `body` and returns the status and the JSON answer.
    pub fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let address = self.url.trim_start_matches("http://");
        let mut stream = TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(120)))
            .unwrap();
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nConnection: close\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).unwrap();
        let mut raw = Vec::new();
        let _ = stream.read_to_end(&mut raw);
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, rest) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let rest = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest)
        } else {
            rest.to_owned()
        };
        let value = serde_json::from_str(&rest).unwrap_or_else(|e| panic!("{e}: {rest}"));
        (status, value)
    }

    /// Stops it as Ctrl-C or a polite kill does, and waits for it to end.
    #[allow(dead_code)]
    pub fn stop(mut self) -> ExitStatus {
        // SAFETY: a plain signal to a child this test started.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the server did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn dechunk(mut raw: &str) -> String {
    let mut body = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        body.push_str(&rest[..size]);
        raw = &rest[size + 2..];
    }
    body
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
