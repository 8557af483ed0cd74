//! A model split over several machines, run for the app by an `ondo serve
//! MODEL --hostfile FILE` child process: that child is rank 0 (it starts
//! the other ranks over ssh, or as processes for this machine), and the app
//! chats with it over its OpenAI API on loopback. The app's own process
//! cannot be rank 0: MLX's ring backend reads its rank and hostfile from
//! the environment as a rank joins, and a running app has threads that
//! read the environment while it would be set. The child records every
//! answer in the same history, so its runs (with how the model was split)
//! reach the Runs window like any other; stopping it gives every rank's
//! memory back.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};

use crate::ErrorKind;
use crate::engine::chat_template::ChatMessage;
use crate::engine::distributed::SplitKind;
use crate::session::chat::{ChatEvent, GenerationSettings};

/// The most lines of what the ranks said that the status keeps.
const KEPT_LINES: usize = 40;

/// How long stopping waits for rank 0 to end the other ranks and itself
/// before it is killed (the others then end with it).
const STOP_LIMIT: Duration = Duration::from_secs(30);

/// The client the split's rank 0 records for the app's chat turns.
pub const APP_CHAT_AGENT: &str = concat!("Ondo app ", env!("CARGO_PKG_VERSION"), " (chat)");

/// What a split run is asked for: the model as the app names it (a repo
/// id in the cache or a folder), the machines (this one first), and how
/// the model is divided among them.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct SplitAsk {
    pub model: String,
    /// One host name a rank, rank 0 (this Mac: `localhost` or its name)
    /// first.
    pub hosts: Vec<String>,
    pub split: SplitKind,
}

impl SplitAsk {
    /// The hosts trimmed, blanks left out; an error that says what to
    /// write when fewer than two remain.
    fn hosts(&self) -> Result<Vec<String>, String> {
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .collect();
        if hosts.len() < 2 {
            return Err(
                "list two machines or more, one a line, this one first (localhost), then \
                 the others as ssh reaches them (studio-2.local)"
                    .into(),
            );
        }
        Ok(hosts)
    }
}

/// Where a split run is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SplitState {
    /// The ranks are starting, joining, fetching or loading their shares.
    Starting,
    /// Rank 0 answers at `url`.
    Serving { url: String },
    /// A rank stopped or a link dropped: the split model cannot answer,
    /// though rank 0 still runs; stopping gives its memory back.
    Lost { reason: String },
    /// Rank 0 ended: stopped, or it could not start the split (`reason`).
    Ended { reason: String },
}

/// A split run as the app shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct SplitStatus {
    pub ask: SplitAsk,
    pub state: SplitState,
    /// What the ranks said, oldest first: who holds what and whether it
    /// fits, each rank's load, errors (the last `KEPT_LINES`).
    pub lines: Vec<String>,
}

/// Why a chat with the split model did not answer.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitChatError {
    pub kind: ErrorKind,
    pub message: String,
}

impl std::fmt::Display for SplitChatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A split run under way: the child that is rank 0, and what it said.
pub struct ServedSplit {
    child: Arc<Mutex<Child>>,
    status: Arc<Mutex<SplitStatus>>,
    /// The model's name as the child's clients name it.
    client_name: String,
}

/// The hosts file of the app's split, in Ondo's data folder: one split at
/// a time, so each start overwrites it, and nothing is left behind by an
/// app that was killed. It also serves as-is for `ondo serve --hostfile`.
pub const HOSTS_FILE_NAME: &str = "split-hosts.json";

impl ServedSplit {
    /// Starts `program` (Ondo's command) as `ondo serve MODEL --hostfile
    /// FILE --split HOW --port 0` and returns at once; `status` says when
    /// it serves. The child stops when this process's end closes its stdin.
    /// The hosts file goes in `data_dir` (Ondo's data folder).
    pub fn start(ask: SplitAsk, program: &Path, data_dir: &Path) -> Result<Self, String> {
        let hosts = ask.hosts()?;
        if ask.model.trim().is_empty() {
            return Err("pick the model to split".into());
        }
        let hostfile = data_dir.join(HOSTS_FILE_NAME);
        std::fs::create_dir_all(data_dir)
            .and_then(|()| {
                crate::whole_file::write_atomically(&hostfile, json!(hosts).to_string().as_bytes())
            })
            .map_err(|e| format!("could not write {}: {e}", hostfile.display()))?;
        let mut command = Command::new(program);
        command
            .arg("serve")
            .arg(ask.model.trim())
            .arg("--hostfile")
            .arg(&hostfile)
            .args(["--split", ask.split.name(), "--port", "0"])
            .arg("--until-stdin-closes")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // A group of its own: a Ctrl-C meant for the app's terminal does
        // not reach the ranks; stopping is this module's to do.
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command.spawn().map_err(|e| {
            format!(
                "could not start {} to run the split: {e}",
                program.display()
            )
        })?;
        let status = Arc::new(Mutex::new(SplitStatus {
            ask: SplitAsk {
                hosts,
                model: ask.model.trim().to_owned(),
                ..ask
            },
            state: SplitState::Starting,
            lines: Vec::new(),
        }));
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let child = Arc::new(Mutex::new(child));
        if let Some(stdout) = stdout {
            let status = Arc::clone(&status);
            std::thread::spawn(move || read_stdout(stdout, &status));
        }
        if let Some(stderr) = stderr {
            let (status, child) = (Arc::clone(&status), Arc::clone(&child));
            std::thread::spawn(move || read_stderr(stderr, &status, &child));
        }
        let client_name = client_name(&locked(&status).ask.model);
        Ok(Self {
            child,
            status,
            client_name,
        })
    }

    pub fn status(&self) -> SplitStatus {
        locked(&self.status).clone()
    }

    /// Whether this run splits `model` (as the app names it).
    pub fn runs(&self, model: &str) -> bool {
        locked(&self.status).ask.model == model.trim()
    }

    /// Stops the split: rank 0 finishes the answer in flight, tells the
    /// other ranks to end, and ends; killed if that takes longer than
    /// `STOP_LIMIT` (the other ranks end when it is gone). Blocks until it
    /// has ended.
    pub fn stop(&self) {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(child.try_wait(), Ok(None)) {
            // Closing its stdin is its signal to stop serving.
            drop(child.stdin.take());
            let until = Instant::now() + STOP_LIMIT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let mut status = locked(&self.status);
        if !matches!(status.state, SplitState::Ended { .. }) {
            status.state = SplitState::Ended {
                reason: "stopped".into(),
            };
        }
    }

    /// Answers the last user message of `messages` through the split
    /// model, streaming its text to `on_event`; returns the run's id in
    /// the history. Dropping the future (a stopped answer) closes the
    /// connection, which cancels the run.
    pub async fn chat(
        &self,
        system_prompt: Option<String>,
        messages: Vec<ChatMessage>,
        settings: &GenerationSettings,
        think: Option<bool>,
        mut on_event: impl FnMut(ChatEvent),
    ) -> Result<String, SplitChatError> {
        let url = match &locked(&self.status).state {
            SplitState::Serving { url } => url.clone(),
            SplitState::Starting => {
                return Err(SplitChatError {
                    kind: ErrorKind::Busy,
                    message: "the split is still starting: its ranks are loading their shares"
                        .into(),
                });
            }
            SplitState::Lost { reason } | SplitState::Ended { reason } => {
                return Err(SplitChatError {
                    kind: ErrorKind::Distributed,
                    message: format!(
                        "the split model cannot answer: {reason}; stop the split and start it \
                         again"
                    ),
                });
            }
        };
        let body = request_body(&self.client_name, system_prompt, messages, settings, think);
        let failed = |message: String| SplitChatError {
            kind: ErrorKind::Distributed,
            message,
        };
        let response = reqwest::Client::new()
            .post(format!("{url}/v1/chat/completions"))
            // Names the client in the run's record, which rank 0 writes.
            .header(reqwest::header::USER_AGENT, APP_CHAT_AGENT)
            .json(&body)
            .send()
            .await
            .map_err(|e| failed(format!("the split's server did not answer: {e}")))?;
        if !response.status().is_success() {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_owned))
                .unwrap_or(text);
            return Err(SplitChatError {
                kind: if status.is_client_error() {
                    ErrorKind::InvalidInput
                } else {
                    ErrorKind::Distributed
                },
                message,
            });
        }
        let mut reader = EventLines::default();
        let mut bytes = response.bytes_stream();
        while let Some(piece) = bytes.next().await {
            let piece = piece.map_err(|e| failed(format!("the split's answer broke off: {e}")))?;
            for event in reader.push(&piece) {
                match event.map_err(failed)? {
                    Streamed::Delta(event) => on_event(event),
                    Streamed::Done(run_id) => return Ok(run_id),
                }
            }
        }
        Err(failed(
            "the split's answer ended without its record: rank 0 stopped mid-answer".into(),
        ))
    }
}

impl Drop for ServedSplit {
    fn drop(&mut self) {
        self.stop();
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The model's name for the child's clients: a folder is named by its
/// folder's name (clients may not name paths), a repo id as it is.
fn client_name(model: &str) -> String {
    let path = Path::new(model);
    if path.is_dir() {
        let folder = path.canonicalize().unwrap_or_else(|_| path.to_owned());
        if let Some(name) = folder.file_name() {
            return name.to_string_lossy().into_owned();
        }
    }
    model.to_owned()
}

/// Rank 0's stdout says one thing: the address it serves at.
fn read_stdout(stdout: impl std::io::Read, status: &Mutex<SplitStatus>) {
    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(url) = line
            .strip_prefix("Ondo is serving at ")
            .and_then(|rest| rest.split_whitespace().next())
        {
            let mut status = locked(status);
            if status.state == SplitState::Starting {
                status.state = SplitState::Serving {
                    url: url.to_owned(),
                };
            }
        }
    }
}

/// Keeps what rank 0 (and, through it, every rank) says; an error once it
/// serves means the split was lost; the end of its words is its end.
fn read_stderr(stderr: impl std::io::Read, status: &Mutex<SplitStatus>, child: &Mutex<Child>) {
    let mut last_error = None;
    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
        let error = line.strip_prefix("error: ").map(str::to_owned);
        let mut status = locked(status);
        if let Some(error) = &error
            && matches!(status.state, SplitState::Serving { .. })
        {
            status.state = SplitState::Lost {
                reason: error.clone(),
            };
        }
        last_error = error.or(last_error);
        status.lines.push(line);
        let extra = status.lines.len().saturating_sub(KEPT_LINES);
        status.lines.drain(..extra);
    }
    // Its stderr closes as it ends; wait for the end to read how.
    let ended = {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let code = locked(child).try_wait();
            match code {
                Ok(Some(code)) => break Some(code),
                Ok(None) if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => break None,
            }
        }
    };
    let mut status = locked(status);
    if matches!(status.state, SplitState::Ended { .. }) {
        return;
    }
    let reason = match (last_error, ended) {
        (Some(error), _) => error,
        (None, Some(code)) if code.success() => "stopped".into(),
        (None, Some(code)) => format!("rank 0 ended ({code}); its words are above"),
        (None, None) => "rank 0 closed its output".into(),
    };
    status.state = SplitState::Ended { reason };
}

/// An OpenAI chat request for the split's server with the chat's settings,
/// its engine knobs included (under Ondo's `ondo` field).
fn request_body(
    model: &str,
    system_prompt: Option<String>,
    messages: Vec<ChatMessage>,
    settings: &GenerationSettings,
    think: Option<bool>,
) -> Value {
    let mut sent: Vec<Value> = Vec::new();
    if let Some(system) = system_prompt.filter(|s| !s.trim().is_empty()) {
        sent.push(json!({"role": "system", "content": system}));
    }
    for message in messages {
        let content = if message.images.is_empty() {
            Value::String(message.content)
        } else {
            let mut parts: Vec<Value> = message
                .images
                .iter()
                .map(|image| {
                    json!({"type": "image_url", "image_url": {"url": format!("data:{};base64,{image}", image_type(image))}})
                })
                .collect();
            parts.push(json!({"type": "text", "text": message.content}));
            Value::Array(parts)
        };
        sent.push(json!({"role": message.role, "content": content}));
    }
    let mut body = json!({
        "model": model,
        "messages": sent,
        "stream": true,
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
        "top_p": settings.top_p,
        "top_k": settings.top_k,
        "min_p": settings.min_p,
    });
    if let Some(penalty) = settings.repetition_penalty {
        body["repetition_penalty"] = penalty.into();
    }
    if let Some(seed) = settings.seed {
        body["seed"] = seed.into();
    }
    if let Some(think) = think {
        body["chat_template_kwargs"] = json!({"enable_thinking": think});
    }
    // The chat's engine knobs, not the ones rank 0 started with (a null
    // is an unset knob).
    body["ondo"] = json!({
        "prefill_step_size": settings.prefill_step_size,
        "loop": settings.loop_shape,
        "max_kv_size": settings.max_kv_size,
        "kv_bits": settings.kv_bits,
    });
    body
}

/// An image's media type from the first bytes of its base64 (the server
/// reads the bytes either way; the type is for the URL's sake).
fn image_type(base64: &str) -> &'static str {
    match base64.get(..4).unwrap_or("") {
        "/9j/" => "image/jpeg",
        "R0lG" => "image/gif",
        "UklG" => "image/webp",
        _ => "image/png",
    }
}

/// What one server-sent event of the answer carried.
enum Streamed {
    Delta(ChatEvent),
    /// The last chunk: the run's id in the history.
    Done(String),
}

/// The answer's server-sent events, line by line as bytes arrive.
#[derive(Default)]
struct EventLines {
    pending: Vec<u8>,
}

impl EventLines {
    fn push(&mut self, bytes: &[u8]) -> Vec<Result<Streamed, String>> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(event) = line.trim().strip_prefix("data:").map(str::trim) {
                out.extend(event_of(event));
            }
        }
        out
    }
}

fn event_of(data: &str) -> Option<Result<Streamed, String>> {
    if data == "[DONE]" {
        return None;
    }
    let chunk: Value = match serde_json::from_str(data) {
        Ok(chunk) => chunk,
        Err(e) => {
            return Some(Err(format!(
                "the split's server sent something unreadable: {e}"
            )));
        }
    };
    if let Some(message) = chunk["error"]["message"].as_str() {
        return Some(Err(message.to_owned()));
    }
    if let Some(run_id) = chunk["ondo"]["run_id"].as_str() {
        return Some(Ok(Streamed::Done(run_id.to_owned())));
    }
    let delta = &chunk["choices"][0]["delta"];
    let text = delta["content"].as_str().unwrap_or_default();
    let reasoning = delta["reasoning_content"].as_str().unwrap_or_default();
    (!text.is_empty() || !reasoning.is_empty()).then(|| {
        Ok(Streamed::Delta(ChatEvent::Delta {
            text: text.to_owned(),
            reasoning: reasoning.to_owned(),
        }))
    })
}

/// Ondo's command beside `app_exe` (the app's bundle carries it next to
/// the app; a build tree has it one folder up from a test binary), or
/// `ONDO_CLI` where set.
pub fn ondo_command(app_exe: &Path) -> Result<PathBuf, String> {
    if let Some(set) = crate::environment::CLI.os_value() {
        return Ok(PathBuf::from(set));
    }
    let name = format!("ondo{}", std::env::consts::EXE_SUFFIX);
    let dir = app_exe.parent().unwrap_or(Path::new("."));
    [dir.join(&name), dir.join("..").join(&name)]
        .into_iter()
        .find(|path| path.is_file())
        .ok_or_else(|| {
            format!(
                "Ondo's command ({name}) is not beside the app in {}: reinstall Ondo, or set \
                 {} to where it is",
                dir.display(),
                crate::environment::CLI.name
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_answer_streams_text_and_ends_with_its_run() {
        let mut lines = EventLines::default();
        let mut events = lines.push(b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\ndata: {\"choices\":[{\"de");
        events.extend(lines.push(b"lta\":{\"content\":\"Hi\"}}]}\n\n"));
        events.extend(lines.push(
            b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}],\"ondo\":{\"run_id\":\"r-7\"}}\n\ndata: [DONE]\n\n",
        ));
        let seen: Vec<String> = events
            .into_iter()
            .map(|e| match e.unwrap() {
                Streamed::Delta(ChatEvent::Delta { text, reasoning }) => {
                    format!("{reasoning}|{text}")
                }
                Streamed::Delta(other) => format!("{other:?}"),
                Streamed::Done(run) => run,
            })
            .collect();
        assert_eq!(seen, ["hm|", "|Hi", "r-7"]);
        let error = lines
            .push(b"data: {\"error\":{\"message\":\"rank 1 lost\"}}\n")
            .pop()
            .unwrap();
        assert_eq!(error.err().as_deref(), Some("rank 1 lost"));
    }

    #[test]
    fn fewer_than_two_machines_are_refused_with_what_to_write() {
        let ask = SplitAsk {
            model: "m".into(),
            hosts: vec!["localhost".into(), "  ".into()],
            split: SplitKind::Pipeline,
        };
        assert!(ask.hosts().unwrap_err().contains("this one first"));
    }

    #[test]
    fn images_go_as_data_urls_before_the_text() {
        let message = ChatMessage {
            images: vec!["/9j/4AAQ".into()],
            ..ChatMessage::user("what is this?")
        };
        let body = request_body(
            "m",
            Some("be brief".into()),
            vec![message],
            &GenerationSettings::default(),
            Some(false),
        );
        assert_eq!(body["messages"][0]["role"], "system");
        let parts = &body["messages"][1]["content"];
        assert_eq!(
            parts[0]["image_url"]["url"],
            "data:image/jpeg;base64,/9j/4AAQ"
        );
        assert_eq!(parts[1]["text"], "what is this?");
        assert_eq!(body["chat_template_kwargs"]["enable_thinking"], false);
    }
}
