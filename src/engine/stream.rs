//! One request on a resident model: the prompt's tokens (chat template or
//! not), reuse of the conversation's cache, the steps, the text stream with
//! its stops, and the run's timings (time to first token, prefill and
//! decode). The engine thread times the load before it; the token steps
//! time only their own anatomy.

use std::time::{Duration, Instant};

use super::anatomy::StepAnatomy;
use super::cache::{CacheSnapshot, KvQuantization, LayerCache};
use super::chat_template::{ChatMessage, ChatTemplate};
use super::constrain::TokenConstraint;
use super::detokenize::StreamingDetokenizer;
use super::disk_cache::DiskPromptCache;
use super::generate::TokenSteps;
use super::load::LoadedModel;
use super::reply::{ReplyFormat, ReplySegment, ReplySplitter, ToolCall};
use super::request::{CancelToken, GenerateRequest, Prompt, RunError, RunEvent};
use super::sample::Sampler;
use super::stats::{BatchShare, RunStats, per_second};
use super::vision::{ImageShape, ImageTokens, PromptImages};
use crate::run_kinds::{LoadKind, PrefixSource, StopReason};

/// Snapshots of a model's state layers a conversation keeps: the two
/// latest turns' boundaries (the end of a prompt's prefill and the end of
/// a reply). A state layer cannot drop positions, so these are the only
/// places a later prompt can branch from without starting over; each costs
/// the state layers' bytes once (LFM2-1.2B in bfloat16: 10 layers x 2
/// inputs x 2048 channels x 2 bytes = 80 KiB), whatever the context.
pub const KEPT_SNAPSHOTS: usize = 4;

/// A model's cache and the token ids it holds, kept between the turns of a
/// conversation, with snapshots of its state layers at turn boundaries.
pub struct Conversation {
    pub tokens: Vec<u32>,
    pub cache: Vec<LayerCache>,
    pub max_kv_size: Option<usize>,
    /// Whether its cache may go to the disk when it leaves memory (its
    /// latest request allowed the disk cache).
    pub save_to_disk: bool,
    /// How its growing layers are quantized once long enough (`None`:
    /// never); a request asking for other settings starts over.
    pub kv_quantization: Option<KvQuantization>,
    /// Oldest first, each at a position `tokens` reaches; empty for a
    /// model without state layers.
    snapshots: Vec<CacheSnapshot>,
    /// The images `tokens` show: every image token has the same id, so a
    /// later prompt reuses the cache past an image only where it shows the
    /// same file at the same place.
    pub images: Vec<ImageMark>,
}

/// Where an image's tokens start in a prompt, how they lie, and a digest
/// of its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageMark {
    pub start: usize,
    pub shape: ImageShape,
    pub digest: [u8; 32],
}

impl Conversation {
    pub fn new(
        model: &LoadedModel,
        max_kv_size: Option<usize>,
        kv_quantization: Option<KvQuantization>,
    ) -> Self {
        Self::with_cache(
            model.model.make_cache(max_kv_size, kv_quantization),
            max_kv_size,
        )
        .quantized_by(kv_quantization)
    }

    /// A conversation over an empty `cache`.
    pub fn with_cache(cache: Vec<LayerCache>, max_kv_size: Option<usize>) -> Self {
        Self {
            tokens: Vec::new(),
            cache,
            max_kv_size,
            save_to_disk: true,
            kv_quantization: None,
            snapshots: Vec::new(),
            images: Vec::new(),
        }
    }

    /// Records how the cache's growing layers are quantized (the cache
    /// must have been made with the same settings).
    pub fn quantized_by(mut self, kv_quantization: Option<KvQuantization>) -> Self {
        self.kv_quantization = kv_quantization;
        self
    }

    /// Bytes the cache holds, its kept snapshots included.
    pub fn kv_cache_bytes(&self) -> usize {
        self.cache.iter().map(LayerCache::nbytes).sum::<usize>() + self.snapshot_bytes()
    }

    /// Bytes the kept snapshots hold.
    pub fn snapshot_bytes(&self) -> usize {
        self.snapshots.iter().map(CacheSnapshot::nbytes).sum()
    }

    /// Positions of the kept snapshots, oldest first.
    pub fn snapshot_positions(&self) -> Vec<usize> {
        self.snapshots.iter().map(|s| s.position).collect()
    }

    /// Keeps `snapshot` (replacing one at the same position), dropping the
    /// oldest beyond `KEPT_SNAPSHOTS`.
    pub fn keep_snapshot(&mut self, snapshot: CacheSnapshot) {
        if snapshot.position == 0 || snapshot.position > self.tokens.len() {
            return;
        }
        self.snapshots.retain(|s| s.position != snapshot.position);
        self.snapshots.push(snapshot);
        let excess = self.snapshots.len().saturating_sub(KEPT_SNAPSHOTS);
        self.snapshots.drain(..excess);
    }

    /// Tokens the cache would lose if `prompt` reused it (those after the
    /// common prefix).
    pub fn would_drop(&self, prompt: &[u32]) -> usize {
        let common = reusable_prefix(&self.tokens, prompt);
        self.tokens.len().saturating_sub(common)
    }

    /// Replaces the cache with `cache` holding `tokens` (read back from the
    /// disk); returns how many tokens it holds.
    pub fn restore_from(&mut self, tokens: Vec<u32>, cache: Vec<LayerCache>) -> usize {
        self.cache = cache;
        self.snapshots.clear();
        self.images.clear();
        self.tokens = tokens;
        self.tokens.len()
    }

    /// Keeps the longest prefix of the cached tokens that `prompt` starts
    /// with (at most all but its last token, which must run to give the
    /// first logits); returns how many prompt tokens are cached. KV layers
    /// are trimmed to it; a model with state layers goes back to the latest
    /// snapshot within it instead (the state cannot be trimmed), and a
    /// cache that can do neither (no such snapshot, a wrapped rotating
    /// cache) starts over from `empty`.
    fn reuse_prefix(&mut self, prompt: &[u32], empty: impl FnOnce() -> Vec<LayerCache>) -> usize {
        let common = reusable_prefix(&self.tokens, prompt);
        let cached = self.cache.first().map_or(0, |c| c.offset()) as usize;
        let reused = if common == 0 {
            None
        } else if cached <= common {
            Some(cached)
        } else if self.cache.iter().all(LayerCache::can_trim) {
            let drop = (cached - common) as i32;
            let trimmed = self.cache.iter_mut().all(|layer| layer.trim(drop).is_ok());
            trimmed.then_some(common)
        } else {
            self.snapshots
                .iter()
                .rev()
                .filter(|s| s.position <= common)
                .max_by_key(|s| s.position)
                .filter(|s| s.restore(&mut self.cache).is_ok())
                .map(|s| s.position)
        };
        let Some(reused) = reused else {
            *self = Conversation::with_cache(empty(), self.max_kv_size)
                .quantized_by(self.kv_quantization);
            return 0;
        };
        self.tokens.truncate(reused);
        self.snapshots.retain(|s| s.position <= reused);
        reused
    }
}

/// A prompt as the model reads it.
pub struct PromptTokens {
    pub ids: Vec<u32>,
    /// Whether the chat template made them.
    pub templated: bool,
    /// The text they encode, where there is one (not for `Prompt::Tokens`).
    pub text: Option<String>,
}

/// The prompt's token ids, whether the chat template made them, and its
/// text; a prompt's images expanded into their tokens where the model has
/// a vision tower, refused by name where it has none.
pub fn prompt_ids(model: &LoadedModel, prompt: &Prompt) -> Result<PromptTokens, RunError> {
    let files = image_files(prompt)?;
    prompt_ids_of(model, prompt, &files, crate::vision::ImageLimits::default())
        .map(|(tokens, _)| tokens)
}

/// `prompt_ids` for a prompt whose images are `files`, with how each
/// image's tokens lie.
fn prompt_ids_of(
    model: &LoadedModel,
    prompt: &Prompt,
    files: &[Vec<u8>],
    limits: crate::vision::ImageLimits,
) -> Result<(PromptTokens, Vec<ImageShape>), RunError> {
    if files.is_empty() {
        return prompt_ids_with(
            &model.tokenizer,
            model.chat_template.as_ref(),
            prompt,
            &|t, _| Ok(t.to_owned()),
        )
        .map(|tokens| (tokens, Vec::new()));
    }
    let Some(vision) = &model.vision else {
        return Err(RunError::InvalidSettings(format!(
            "{} reads text only (it has no vision tower); send the message without its image, \
             or choose a model that sees images (Gemma 3 4B and larger, or Qwen3-VL)",
            model.dir.display()
        )));
    };
    if model.chat_template.is_none() {
        return Err(RunError::InvalidSettings(format!(
            "{} has no chat template to place images with; add one to its tokenizer_config.json",
            model.dir.display()
        )));
    }
    let shapes = vision
        .tokens
        .shapes(&files.iter().map(Vec::as_slice).collect::<Vec<_>>(), limits)?;
    let tokens = prompt_ids_with(
        &model.tokenizer,
        model.chat_template.as_ref(),
        prompt,
        &|text, _| {
            vision
                .tokens
                .expand_markers(&model.tokenizer, text, &shapes)
        },
    )?;
    Ok((tokens, shapes))
}

/// The images of a prompt's messages, in order, each a whole file in
/// base64.
pub fn prompt_images(prompt: &Prompt) -> Vec<&str> {
    match prompt {
        Prompt::Chat { messages, .. } => messages
            .iter()
            .flat_map(|m| m.images.iter().map(String::as_str))
            .collect(),
        Prompt::Raw { .. } | Prompt::Tokens { .. } => Vec::new(),
    }
}

/// The tokens of `prompt` for the model in `dir`, read from its tokenizer
/// and chat template alone: counting a prompt needs no weights, so a model
/// not loaded stays so, and the engine is not asked.
pub fn count_prompt_tokens(dir: &std::path::Path, prompt: &Prompt) -> Result<usize, RunError> {
    let path = dir.join("tokenizer.json");
    let tokenizer = tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| RunError::Load(format!("could not read {}: {e}", path.display())))?;
    let template = ChatTemplate::from_model_dir(dir).map_err(|e| RunError::Load(e.to_string()))?;
    // An image counts as the tokens it fills, read from config.json (and,
    // where that follows the image's size, from its header).
    let files = image_files(prompt)?;
    let image_tokens = match files.is_empty() {
        true => None,
        false => std::fs::read(dir.join("config.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|config| ImageTokens::of_config(&config, dir).ok().flatten()),
    };
    let shapes = match &image_tokens {
        Some(tokens) => tokens.shapes(
            &files.iter().map(Vec::as_slice).collect::<Vec<_>>(),
            crate::vision::ImageLimits::default(),
        )?,
        None => Vec::new(),
    };
    let expand = |text: &str, _: usize| match &image_tokens {
        Some(tokens) => tokens.expand_markers(&tokenizer, text, &shapes),
        None => Err(RunError::InvalidSettings(format!(
            "{} reads text only (it has no vision tower); count the message without its image",
            dir.display()
        ))),
    };
    Ok(
        prompt_ids_with(&tokenizer, template.as_ref(), prompt, &expand)?
            .ids
            .len(),
    )
}

/// `expand` turns the rendered text's image markers (for that many images)
/// into the tokens the images fill.
fn prompt_ids_with(
    tokenizer: &tokenizers::Tokenizer,
    chat_template: Option<&ChatTemplate>,
    prompt: &Prompt,
    expand: &dyn Fn(&str, usize) -> Result<String, RunError>,
) -> Result<PromptTokens, RunError> {
    let encode = |text: &str, add_special: bool| -> Result<Vec<u32>, RunError> {
        tokenizer
            .encode(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| RunError::Tokenizer(e.to_string()))
    };
    match prompt {
        Prompt::Tokens { ids } => Ok(PromptTokens {
            ids: ids.clone(),
            templated: false,
            text: None,
        }),
        Prompt::Raw { text } => Ok(PromptTokens {
            ids: encode(text, true)?,
            templated: false,
            text: Some(text.clone()),
        }),
        Prompt::Chat {
            system_prompt,
            messages,
            tools,
            template_options,
        } => {
            let mut all: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
            if let Some(system) = system_prompt.as_ref().filter(|s| !s.trim().is_empty()) {
                all.push(ChatMessage::system(system.clone()));
            }
            all.extend(messages.iter().cloned());
            match chat_template {
                // The template writes the special tokens itself (BOS
                // included), as transformers' apply_chat_template does.
                Some(template) => {
                    let text =
                        template.render_with(&all, tools.as_deref(), template_options, true)?;
                    let images = all.iter().map(|m| m.images.len()).sum();
                    let text = if images > 0 {
                        expand(&text, images)?
                    } else {
                        text
                    };
                    Ok(PromptTokens {
                        ids: encode(&text, false)?,
                        templated: true,
                        text: Some(text),
                    })
                }
                // No template: the messages' text as it is, like mlx-lm.
                None => {
                    let text: Vec<&str> = all.iter().map(|m| m.content.as_str()).collect();
                    let text = text.join("\n");
                    Ok(PromptTokens {
                        ids: encode(&text, true)?,
                        templated: false,
                        text: Some(text),
                    })
                }
            }
        }
    }
}

/// How this model marks the parts of its reply to this prompt. Only a chat
/// has a reply to split: text or tokens sent as they are (`ondo run --raw`,
/// the API's completions, benchmarks) are continued as they are, and the
/// whole continuation is the answer, markers included, as mlx-lm prints it.
pub fn reply_format(
    model: &LoadedModel,
    prompt: &Prompt,
    prompt_text: Option<&str>,
) -> ReplyFormat {
    if !matches!(prompt, Prompt::Chat { .. }) {
        return ReplyFormat::PLAIN;
    }
    let tools_offered = matches!(prompt, Prompt::Chat { tools: Some(_), .. });
    let template = model
        .chat_template
        .as_ref()
        .map(|t| t.source_for(tools_offered));
    ReplyFormat::detect(&model.model_type, template, prompt_text, tools_offered)
}

/// Whether a prompt has any text in it.
fn is_empty(prompt: &Prompt) -> bool {
    match prompt {
        Prompt::Tokens { ids } => ids.is_empty(),
        Prompt::Raw { text } => text.trim().is_empty(),
        Prompt::Chat { messages, .. } => messages.iter().all(ChatMessage::is_blank),
    }
}

/// Text held back because it might be the start of a stop string.
fn held_back(text: &str, stops: &[String]) -> usize {
    stops
        .iter()
        .flat_map(|stop| {
            (1..stop.len())
                .rev()
                .filter(|&n| stop.is_char_boundary(n) && text.ends_with(&stop[..n]))
                .take(1)
        })
        .max()
        .unwrap_or(0)
}

/// How many generated tokens were reasoning and their share of the decode
/// time: each reasoning token's time since the token before it (the first
/// token's time is prefill's, so it adds nothing).
fn reasoning_share(is_reasoning: &[bool], token_times: &[Instant]) -> (usize, f64) {
    let mut count = 0;
    // Summed as whole nanoseconds and converted once: a sum of per-token
    // milliseconds in floating point can exceed the decode time it is a
    // part of (every token reasoning: 8.033070000000002 of 8.03307 ms).
    let mut spent = Duration::ZERO;
    for (at, _) in is_reasoning.iter().enumerate().filter(|(_, r)| **r) {
        count += 1;
        if let (Some(before), Some(now)) = (
            at.checked_sub(1).and_then(|b| token_times.get(b)),
            token_times.get(at),
        ) {
            spent += *now - *before;
        }
    }
    (count, spent.as_secs_f64() * 1e3)
}

/// Deltas after the first are merged over this long (one display frame).
const DELTA_INTERVAL: Duration = Duration::from_millis(16);

/// How a run went, for the caller that records it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    /// The answer: what the model said minus reasoning and tool calls.
    pub text: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    /// Everything the model said, as decoded, before the split (what mlx-lm
    /// would print).
    pub raw_text: String,
    pub token_ids: Vec<u32>,
    pub stats: RunStats,
    pub anatomy: StepAnatomy,
}

impl RunOutcome {
    /// The assistant turn this reply adds to a conversation, so the next
    /// request renders it the way the template expects (reasoning and tool
    /// calls in their own fields).
    pub fn to_message(&self) -> ChatMessage {
        ChatMessage {
            reasoning_content: (!self.reasoning.is_empty()).then(|| self.reasoning.clone()),
            tool_calls: (!self.tool_calls.is_empty()).then(|| self.tool_calls.clone()),
            ..ChatMessage::assistant(self.text.clone())
        }
    }
}

/// What one `RunEvent::Delta` carries besides its token ids.
#[derive(Debug, Default, Clone, PartialEq)]
struct DeltaParts {
    reasoning: String,
    text: String,
    tool_calls: Vec<ToolCall>,
}

impl DeltaParts {
    fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.text.is_empty() && self.tool_calls.is_empty()
    }

    /// Where in a delta's order (reasoning, text, calls) its last part is.
    fn last_rank(&self) -> u8 {
        if !self.tool_calls.is_empty() {
            2
        } else if !self.text.is_empty() {
            1
        } else {
            0
        }
    }
}

/// The text side of a run: turns token ids into text, stops at stop strings,
/// splits the reply into its parts and gathers them into deltas. Stop
/// strings are looked for in the raw text (as mlx-lm does), and only text
/// that cannot be the start of one is split.
pub struct ReplyStream {
    detokenizer: StreamingDetokenizer,
    splitter: ReplySplitter,
    stop_strings: Vec<String>,
    /// Everything decoded so far.
    raw: String,
    /// Where in `raw` each token's text starts, in the order they came.
    token_starts: Vec<usize>,
    /// Bytes of `raw` handed to the splitter.
    split_upto: usize,
    answer: String,
    reasoning: String,
    tool_calls: Vec<ToolCall>,
    /// The last part the model said was a tool call.
    ends_with_call: bool,
    /// The stop string the text reached, once it has.
    stopped_at: Option<String>,
    /// Deltas complete and waiting (a part came out of a delta's order).
    queued: Vec<DeltaParts>,
    /// The delta being gathered.
    pending: DeltaParts,
}

/// The whole reply once the stream is finished.
pub struct FinishedReply {
    pub answer: String,
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    pub raw_text: String,
    /// The reply ended with tool calls (nothing after the last one).
    pub ends_with_call: bool,
    /// The stop string that ended it, if one did.
    pub stop_string: Option<String>,
    /// For each token pushed, in order: whether it was part of the
    /// reasoning (its text starts inside it, markers included).
    pub reasoning_tokens: Vec<bool>,
}

impl ReplyStream {
    pub fn new(
        tokenizer: &std::sync::Arc<tokenizers::Tokenizer>,
        format: ReplyFormat,
        stop_strings: &[String],
    ) -> Self {
        let detokenizer = if format.needs_special_tokens() {
            StreamingDetokenizer::keeping_special_tokens(tokenizer.clone())
        } else {
            StreamingDetokenizer::new(tokenizer.clone())
        };
        Self {
            detokenizer,
            splitter: ReplySplitter::new(format),
            stop_strings: stop_strings
                .iter()
                .filter(|s| !s.is_empty())
                .cloned()
                .collect(),
            raw: String::new(),
            token_starts: Vec::new(),
            split_upto: 0,
            answer: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            ends_with_call: false,
            stopped_at: None,
            queued: Vec::new(),
            pending: DeltaParts::default(),
        }
    }

    /// Adds a generated token; true when the text reached a stop string (the
    /// text is cut where it starts, and the stream is over).
    pub fn push(&mut self, id: u32) -> Result<bool, RunError> {
        let text = self
            .detokenizer
            .push(id)
            .map_err(|e| RunError::Tokenizer(e.to_string()))?;
        self.token_starts.push(self.raw.len());
        self.raw.push_str(&text);
        let unsplit = &self.raw[self.split_upto..];
        // The earliest match wins; among those at one place, the first given.
        if let Some((at, stop)) = self
            .stop_strings
            .iter()
            .filter_map(|s| unsplit.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|(at, _)| *at)
        {
            self.stopped_at = Some(stop.clone());
            self.raw.truncate(self.split_upto + at);
            self.split(self.raw.len());
            self.finish_split();
            return Ok(true);
        }
        let ready = self.raw.len() - held_back(&self.raw, &self.stop_strings);
        self.split(ready);
        Ok(false)
    }

    /// Ends a stream that did not stop at a stop string: the characters the
    /// detokenizer still held, and whatever the splitter held.
    pub fn finish(&mut self) -> Result<(), RunError> {
        let rest = self
            .detokenizer
            .finish()
            .map_err(|e| RunError::Tokenizer(e.to_string()))?;
        self.raw.push_str(&rest);
        self.split(self.raw.len());
        self.finish_split();
        Ok(())
    }

    fn split(&mut self, upto: usize) {
        if upto <= self.split_upto {
            return;
        }
        let segments = self.splitter.push(&self.raw[self.split_upto..upto]);
        self.split_upto = upto;
        self.take(segments);
    }

    fn finish_split(&mut self) {
        let segments = self.splitter.finish();
        self.take(segments);
    }

    fn take(&mut self, segments: Vec<ReplySegment>) {
        for segment in segments {
            let rank = match &segment {
                ReplySegment::Reasoning(_) => 0,
                ReplySegment::Answer(_) => 1,
                ReplySegment::ToolCall(_) => 2,
            };
            // A delta's parts are read reasoning, text, calls: a part that
            // came earlier in that order starts a new delta.
            if !self.pending.is_empty() && rank < self.pending.last_rank() {
                self.queued.push(std::mem::take(&mut self.pending));
            }
            match segment {
                ReplySegment::Reasoning(text) => {
                    self.reasoning.push_str(&text);
                    self.pending.reasoning.push_str(&text);
                    self.ends_with_call = false;
                }
                ReplySegment::Answer(text) => {
                    self.answer.push_str(&text);
                    self.pending.text.push_str(&text);
                    self.ends_with_call = self.ends_with_call && text.trim().is_empty();
                }
                ReplySegment::ToolCall(call) => {
                    self.tool_calls.push(call.clone());
                    self.pending.tool_calls.push(call);
                    self.ends_with_call = true;
                }
            }
        }
    }

    /// Whether any part waits to be sent.
    pub fn has_news(&self) -> bool {
        !self.queued.is_empty() || !self.pending.is_empty()
    }

    /// The deltas to send now, the token ids going with the first (one
    /// delta, perhaps empty, when nothing else waits).
    pub fn take_deltas(&mut self, token_ids: Vec<u32>) -> Vec<RunEvent> {
        let mut parts = std::mem::take(&mut self.queued);
        if !self.pending.is_empty() || parts.is_empty() {
            parts.push(std::mem::take(&mut self.pending));
        }
        let mut token_ids = Some(token_ids);
        parts
            .into_iter()
            .map(|p| RunEvent::Delta {
                text: p.text,
                reasoning: p.reasoning,
                tool_calls: p.tool_calls,
                token_ids: token_ids.take().unwrap_or_default(),
            })
            .collect()
    }

    /// The reply, split, and the raw text.
    pub fn into_reply(self) -> FinishedReply {
        let spans = self.splitter.reasoning_spans();
        let reasoning_tokens = self
            .token_starts
            .iter()
            .map(|start| spans.iter().any(|span| span.contains(start)))
            .collect();
        FinishedReply {
            reasoning_tokens,
            answer: self.answer,
            reasoning: self.reasoning,
            tool_calls: self.tool_calls,
            raw_text: self.raw,
            ends_with_call: self.ends_with_call,
            stop_string: self.stopped_at,
        }
    }
}

/// A request checked and tokenized, its conversation's cache cut back to
/// the prefix it reuses.
pub struct PreparedRun {
    /// The whole prompt's token ids.
    pub prompt: Vec<u32>,
    /// Prompt tokens the conversation's cache already holds.
    pub cached: usize,
    /// Where those came from, and what reading them from the disk took.
    pub prefix: PrefixRead,
    templated: bool,
    /// How the reply marks reasoning and tool calls.
    pub format: ReplyFormat,
    /// The prompt's images the cache did not hold, encoded (positions in
    /// `prompt`).
    pub images: Option<PromptImages>,
    /// Every image the prompt shows, encoded now or held by the cache.
    pub image_marks: Vec<ImageMark>,
}

impl PreparedRun {
    /// The prompt tokens the cache lacks: what the run prefills.
    pub fn new_tokens(&self) -> &[u32] {
        &self.prompt[self.cached..]
    }

    /// The images' embeddings, placed among `new_tokens` (the cache holds
    /// none of an image: `prepare` keeps the reused prefix before the
    /// first).
    pub fn new_images(&self) -> Option<PromptImages> {
        self.images.as_ref().map(|images| images.after(self.cached))
    }
}

/// Where a run's cached prompt tokens came from.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefixRead {
    pub source: PrefixSource,
    pub bytes: u64,
    pub ms: f64,
}

/// Checks `request` against `model`, tokenizes its prompt and keeps the
/// part of `conversation`'s cache the prompt starts with, or, where a
/// prompt cache on disk holds more of the prompt, reads that back. A
/// conversation about to lose a long tail (another prompt reuses its
/// cache) is saved to the disk first.
pub fn prepare(
    model: &LoadedModel,
    conversation: &mut Conversation,
    request: &GenerateRequest,
    disk: Option<&mut DiskPromptCache>,
) -> Result<PreparedRun, RunError> {
    request.sampler.validate()?;
    if is_empty(&request.prompt) {
        return Err(RunError::EmptyPrompt);
    }
    if request.max_tokens == 0 {
        return Err(RunError::InvalidSettings(
            "max_tokens is 0; ask for at least one token".into(),
        ));
    }
    if let Some(path) = &request.prompt_cache_file {
        return prepare_after_cache_file(model, conversation, request, path);
    }
    let files = image_files(&request.prompt)?;
    let (
        PromptTokens {
            ids: prompt,
            templated,
            text: prompt_text,
        },
        shapes,
    ) = prompt_ids_of(model, &request.prompt, &files, request.image_limits)?;
    let format = reply_format(model, &request.prompt, prompt_text.as_deref());
    if prompt.is_empty() {
        return Err(RunError::EmptyPrompt);
    }
    let vocab = model.config.vocab_size.max(0) as u32;
    if let Some(bad) = prompt.iter().find(|&&id| id >= vocab) {
        // MLX would read past the embedding table instead of failing.
        return Err(RunError::InvalidSettings(format!(
            "token id {bad} is outside the vocabulary of {} ({vocab} ids)",
            model.dir.display()
        )));
    }
    if let (None, Some(context)) = (request.max_kv_size, model.config.max_position_embeddings)
        && prompt.len() > context
    {
        return Err(RunError::PromptTooLong(format!(
            "the prompt has {} tokens but {} reads at most {context}; shorten it, or bound \
             the KV cache to {context} tokens (a rotating cache keeps the start and the latest \
             tokens)",
            prompt.len(),
            model.dir.display(),
        )));
    }
    let image_marks = match (&model.vision, files.is_empty()) {
        (Some(vision), false) => vision
            .tokens
            .image_starts(&prompt, &shapes)?
            .into_iter()
            .zip(&files)
            .zip(&shapes)
            .map(|((start, file), shape)| ImageMark {
                start,
                shape: *shape,
                digest: <sha2::Sha256 as sha2::Digest>::digest(file).into(),
            })
            .collect(),
        _ => Vec::new(),
    };
    // A cache holds an image's tokens, not which image they showed: the
    // prefix reused from memory ends before the first image the
    // conversation did not show at the same place; on the disk each
    // image's tokens are keyed by its file (`tokens_on_disk`).
    let unknown = image_marks
        .iter()
        .find(|mark| !conversation.images.contains(mark))
        .map(|mark| mark.start);
    let matched = &prompt[..unknown.map_or(prompt.len(), |start| start + 1)];
    let kv_quantization = request.kv_quantization();
    if let Some(quantization) = kv_quantization {
        quantization
            .check(&model.model.growing_head_dims())
            .map_err(RunError::InvalidSettings)?;
        if request.max_kv_size.is_none() && model.model.growing_attention_has_sinks() {
            return Err(RunError::InvalidSettings(format!(
                "{} has attention sinks, which attention over a quantized KV cache does not \
                 take (mlx-lm refuses them too); run it without kv_bits",
                model.dir.display()
            )));
        }
    }
    if conversation.kv_quantization != kv_quantization {
        // A cache quantized otherwise (or not at all) cannot continue.
        *conversation = Conversation::with_cache(
            model
                .model
                .make_cache(conversation.max_kv_size, kv_quantization),
            conversation.max_kv_size,
        )
        .quantized_by(kv_quantization);
    }
    let max_kv_size = conversation.max_kv_size;
    let use_disk = request.disk_cache;
    conversation.save_to_disk = use_disk;
    let disk = disk.filter(|_| use_disk);
    let mut prefix = PrefixRead::default();
    // An empty cache of the model's layers (no arrays: cheap to make).
    let empty = || model.model.make_cache(max_kv_size, kv_quantization);
    let cached = match disk {
        None => conversation.reuse_prefix(matched, empty),
        Some(disk) => {
            let key = disk.key(&model.dir, max_kv_size, kv_quantization);
            if conversation.would_drop(&prompt) >= disk.min_tokens() {
                let saved = tokens_on_disk(&conversation.tokens, &conversation.images);
                disk.save(&key, &model.dir, &saved, &conversation.cache);
            }
            let in_memory = conversation.reuse_prefix(matched, empty);
            let template = empty();
            let trims = template.iter().all(LayerCache::can_trim);
            let matched_on_disk = tokens_on_disk(&prompt, &image_marks);
            match disk
                .find(&key, &model.dir, &matched_on_disk, in_memory, trims)
                .and_then(|found| disk.restore(found, &template))
            {
                Some(restored) => {
                    prefix = PrefixRead {
                        source: PrefixSource::Disk,
                        bytes: restored.bytes,
                        ms: restored.read_ms,
                    };
                    // The file's tokens are the prompt's first ones, its
                    // images keyed; the conversation keeps the real ids
                    // and the images they show whole.
                    let held = restored.tokens.len();
                    let cached = conversation.restore_from(prompt[..held].to_vec(), restored.cache);
                    conversation.images = image_marks
                        .iter()
                        .copied()
                        .filter(|mark| mark.start + mark.shape.tokens() <= held)
                        .collect();
                    cached
                }
                None => in_memory,
            }
        }
    };
    if prefix.source == PrefixSource::None && cached > 0 {
        prefix.source = PrefixSource::Memory;
    }
    // Only the images after the reused prefix are encoded.
    // Kept even when the cache holds every image: a 3-D rope's positions
    // after them depend on them.
    let images = match &model.vision {
        Some(vision) if !image_marks.is_empty() => {
            let (starts, fresh): (Vec<usize>, Vec<&[u8]>) = image_marks
                .iter()
                .zip(&files)
                .filter(|(mark, _)| mark.start >= cached)
                .map(|(mark, file)| (mark.start, file.as_slice()))
                .unzip();
            let all: Vec<(usize, ImageShape)> =
                image_marks.iter().map(|m| (m.start, m.shape)).collect();
            Some(vision.encode(&fresh, starts, &all, request.image_limits)?)
        }
        _ => None,
    };
    Ok(PreparedRun {
        prompt,
        cached,
        prefix,
        templated,
        format,
        images,
        image_marks,
    })
}

/// Tokens as the disk cache keys them: every image token has the same id,
/// so each image's tokens are replaced by ids drawn from its file's digest
/// and its position in the image, above 2^31 (no vocabulary reaches that).
/// A saved prefix then matches a prompt past an image only where the same
/// file stood at the same place, after a restart as in memory.
pub(crate) fn tokens_on_disk(tokens: &[u32], images: &[ImageMark]) -> Vec<u32> {
    let mut keyed = tokens.to_vec();
    for mark in images {
        let seed = u32::from_le_bytes([
            mark.digest[0],
            mark.digest[1],
            mark.digest[2],
            mark.digest[3],
        ]);
        let end = (mark.start + mark.shape.tokens()).min(keyed.len());
        for (n, token) in keyed.iter_mut().enumerate().take(end).skip(mark.start) {
            *token = 0x8000_0000 | ((seed.rotate_left(7) ^ (n - mark.start) as u32) & 0x7fff_ffff);
        }
    }
    keyed
}

/// The files of the prompt's images (`prompt_images`), from base64.
fn image_files(prompt: &Prompt) -> Result<Vec<Vec<u8>>, RunError> {
    use base64::Engine as _;
    let encoded = prompt_images(prompt);
    let mut files = Vec::with_capacity(encoded.len());
    for (n, text) in encoded.iter().enumerate() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|e| {
                RunError::InvalidSettings(format!(
                    "image {} is not valid base64 ({e}); send the file's bytes in standard base64",
                    n + 1
                ))
            })?;
        files.push(bytes);
    }
    Ok(files)
}

/// How many of `cached`'s tokens `prompt` can take from a cache: those
/// both start with, at most all but the prompt's last token (which must
/// run to give the first logits).
pub(super) fn reusable_prefix(cached: &[u32], prompt: &[u32]) -> usize {
    cached
        .iter()
        .zip(prompt)
        .take_while(|(a, b)| a == b)
        .count()
        .min(prompt.len().saturating_sub(1))
}

/// `prepare` for a run that starts from a prompt cache file: the file's
/// cache becomes the conversation's, and the prompt is what follows it.
fn prepare_after_cache_file(
    model: &LoadedModel,
    conversation: &mut Conversation,
    request: &GenerateRequest,
    path: &std::path::Path,
) -> Result<PreparedRun, RunError> {
    if !prompt_images(&request.prompt).is_empty() {
        return Err(RunError::InvalidSettings(
            "a run from a prompt cache file takes text only; send the images without \
             --prompt-cache-file"
                .into(),
        ));
    }
    let start = Instant::now();
    let template = model
        .model
        .make_cache(conversation.max_kv_size, conversation.kv_quantization);
    let decoded = super::cache::file::read(path, &template, false).map_err(|e| {
        RunError::InvalidSettings(format!(
            "{e}; give a prompt cache written for this model (mlx_lm.cache_prompt, or a file              of `ondo cache ls`) with the same --max-kv-size"
        ))
    })?;
    let read_ms = start.elapsed().as_secs_f64() * 1e3;
    let held = decoded.offset.max(0) as usize;
    let PromptTokens {
        ids: suffix,
        templated,
        text,
    } = tokens_after_cache_file(model, &request.prompt)?;
    let vocab = model.config.vocab_size.max(0) as u32;
    if let Some(bad) = suffix.iter().find(|&&id| id >= vocab) {
        return Err(RunError::InvalidSettings(format!(
            "token id {bad} is outside the vocabulary of {} ({vocab} ids)",
            model.dir.display()
        )));
    }
    // The ids the file holds, when Ondo wrote it; a file without them
    // (mlx-lm's) holds ids no prompt matches, and is never saved again.
    let known = decoded
        .metadata
        .get(super::disk_cache::TOKENS_KEY)
        .and_then(|t| super::disk_cache::parse_tokens(t))
        .filter(|t| t.len() == held);
    conversation.save_to_disk = request.disk_cache && known.is_some();
    let mut prompt = known.unwrap_or_else(|| vec![u32::MAX; held]);
    let cached = conversation.restore_from(prompt.clone(), decoded.layers);
    prompt.extend(suffix);
    if cached >= prompt.len() {
        return Err(RunError::EmptyPrompt);
    }
    Ok(PreparedRun {
        format: reply_format(model, &request.prompt, text.as_deref()),
        prompt,
        cached,
        prefix: PrefixRead {
            source: PrefixSource::Disk,
            bytes: decoded.bytes,
            ms: read_ms,
        },
        templated,
        images: None,
        image_marks: Vec::new(),
    })
}

/// The tokens that follow a prompt cache file's prefix, built as
/// `mlx_lm.generate --prompt-cache-file` builds them: a chat rendered
/// (generation prompt included) and cut where its last message's text
/// starts, since the file holds what comes before (`mlx_lm.cache_prompt`
/// renders the message open-ended); raw text and token ids as they are.
fn tokens_after_cache_file(model: &LoadedModel, prompt: &Prompt) -> Result<PromptTokens, RunError> {
    const MARK: &str = "<query>";
    let (
        Prompt::Chat {
            system_prompt,
            messages,
            tools,
            template_options,
        },
        Some(template),
    ) = (prompt, model.chat_template.as_ref())
    else {
        return prompt_ids(model, prompt);
    };
    let mut all: Vec<ChatMessage> = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = system_prompt.as_ref().filter(|s| !s.trim().is_empty()) {
        all.push(ChatMessage::system(system.clone()));
    }
    all.extend(messages.iter().cloned());
    let full = template.render_with(&all, tools.as_deref(), template_options, true)?;
    if let Some(last) = all.last_mut() {
        last.content = MARK.into();
    }
    let marked = template.render_with(&all, tools.as_deref(), template_options, true)?;
    let at = marked.find(MARK).ok_or_else(|| {
        RunError::InvalidSettings(
            "this chat template does not show the last message's text, so a prompt cache file              cannot be continued with a chat; give the prompt as raw text"
                .into(),
        )
    })?;
    let text = full.get(at..).unwrap_or_default().to_owned();
    let ids = model
        .tokenizer
        .encode(text.as_str(), false)
        .map(|e| e.get_ids().to_vec())
        .map_err(|e| RunError::Tokenizer(e.to_string()))?;
    Ok(PromptTokens {
        ids,
        templated: true,
        text: Some(text),
    })
}

/// The text side and the clock of one run, fed its tokens one at a time
/// (by `run`'s loop, or by a batch's steps): stop tokens and stop strings,
/// the deltas a client sees, and when each token arrived.
pub struct RunText {
    reply: ReplyStream,
    /// Tokens that end the run (the model's end-of-sequence ids, unless the
    /// request ignores them).
    stop_tokens: Vec<u32>,
    delta_every_token: bool,
    generated: Vec<u32>,
    /// When each generated token was on the host, for the reasoning's
    /// share of the decode time.
    token_times: Vec<Instant>,
    pending_ids: Vec<u32>,
    prefill_started: Instant,
    first_token_at: Option<Instant>,
    last_token_at: Instant,
    last_sent: Option<Instant>,
}

/// A run's text once its last token is in.
pub struct EndedText {
    reply: FinishedReply,
    generated: Vec<u32>,
    token_times: Vec<Instant>,
    prefill_started: Instant,
    first_token_at: Option<Instant>,
    last_token_at: Instant,
    ended_at: Instant,
    stop_reason: StopReason,
}

impl EndedText {
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }
}

impl RunText {
    /// The text of a run of `request` whose prefill starts now.
    pub fn new(model: &LoadedModel, request: &GenerateRequest, prepared: &PreparedRun) -> Self {
        let mut reply = ReplyStream::new(&model.tokenizer, prepared.format, &request.stop_strings);
        if let Prompt::Chat {
            tools: Some(tools), ..
        } = &request.prompt
        {
            reply.splitter = reply.splitter.with_tools(tools);
        }
        let now = Instant::now();
        Self {
            reply,
            stop_tokens: if request.ignore_eos {
                Vec::new()
            } else {
                model.eos_token_ids.clone()
            },
            delta_every_token: request.delta_every_token,
            generated: Vec::with_capacity(request.max_tokens),
            token_times: Vec::with_capacity(request.max_tokens),
            pending_ids: Vec::new(),
            prefill_started: now,
            first_token_at: None,
            last_token_at: now,
            last_sent: None,
        }
    }

    /// Tokens generated so far.
    pub fn generated(&self) -> usize {
        self.generated.len()
    }

    /// Takes the next token, sending the deltas that are due to `sink`;
    /// `Some` when the run ends with it (a stop token, or a stop string
    /// its text reached).
    pub fn token(
        &mut self,
        token: u32,
        sink: &mut dyn FnMut(RunEvent),
    ) -> Result<Option<StopReason>, RunError> {
        self.last_token_at = Instant::now();
        self.first_token_at.get_or_insert(self.last_token_at);
        self.generated.push(token);
        self.token_times.push(self.last_token_at);
        if self.stop_tokens.contains(&token) {
            return Ok(Some(StopReason::Eos));
        }
        self.pending_ids.push(token);
        if self.reply.push(token)? {
            return Ok(Some(StopReason::StopString));
        }
        // The first token is sent at once, even empty, so TTFT is visible;
        // later ones at most once a frame (unless the request streams every
        // token): waking the client's thread for every token costs decode
        // speed on a machine with few cores.
        let due = self
            .last_sent
            .is_none_or(|at| self.last_token_at - at >= DELTA_INTERVAL);
        if self.generated.len() == 1 || self.delta_every_token || (self.reply.has_news() && due) {
            self.last_sent = Some(self.last_token_at);
            for delta in self
                .reply
                .take_deltas(std::mem::take(&mut self.pending_ids))
            {
                sink(delta);
            }
        }
        Ok(None)
    }

    /// Ends the text for `stop_reason`: what the detokenizer and the
    /// splitter still held goes out as the last deltas.
    pub fn end(
        mut self,
        mut stop_reason: StopReason,
        sink: &mut dyn FnMut(RunEvent),
    ) -> Result<EndedText, RunError> {
        let ended_at = Instant::now();
        if stop_reason != StopReason::StopString {
            self.reply.finish()?;
        }
        if self.reply.has_news() || !self.pending_ids.is_empty() {
            for delta in self.reply.take_deltas(self.pending_ids) {
                sink(delta);
            }
        }
        let reply = self.reply.into_reply();
        if stop_reason == StopReason::Eos && reply.ends_with_call {
            stop_reason = StopReason::ToolCalls;
        }
        Ok(EndedText {
            reply,
            generated: self.generated,
            token_times: self.token_times,
            prefill_started: self.prefill_started,
            first_token_at: self.first_token_at,
            last_token_at: self.last_token_at,
            ended_at,
            stop_reason,
        })
    }
}

/// What the engine says of how a run was scheduled, besides its own
/// timings: the context `conclude` records.
pub struct RunSetting {
    pub load_kind: LoadKind,
    pub load_ms: f64,
    /// When the engine took the request (after any load).
    pub accepted_at: Instant,
    /// The batch it shared, `None` for a run that had the engine alone.
    pub batch: Option<BatchShare>,
}

/// Runs `request` on `model` with `conversation`'s cache, streaming events to
/// `sink` (all but the final `Finished`/`Failed`, which the caller sends).
pub fn run(
    model: &LoadedModel,
    conversation: &mut Conversation,
    request: &GenerateRequest,
    setting: RunSetting,
    disk: Option<&mut DiskPromptCache>,
    cancel: &CancelToken,
    sink: &mut dyn FnMut(RunEvent),
) -> Result<RunOutcome, RunError> {
    let prepared = prepare(model, conversation, request, disk)?;
    run_prepared(
        model,
        conversation,
        request,
        prepared,
        setting,
        cancel,
        sink,
    )
}

/// `run` of a prompt that `prepare` has placed on `conversation`'s cache.
pub fn run_prepared(
    model: &LoadedModel,
    conversation: &mut Conversation,
    request: &GenerateRequest,
    prepared: PreparedRun,
    setting: RunSetting,
    cancel: &CancelToken,
    sink: &mut dyn FnMut(RunEvent),
) -> Result<RunOutcome, RunError> {
    sink(RunEvent::Started {
        load_kind: setting.load_kind,
        load_ms: setting.load_ms,
        prompt_tokens: prepared.prompt.len(),
        cached_tokens: prepared.cached,
    });
    let sampler = Sampler::new(request.sampler.clone())?;
    let constraint = request
        .constraint
        .as_ref()
        .map(|c| model.constraint(c, prepared.format))
        .transpose()?
        .flatten();
    let mut steps = TokenSteps::new(&model.model, &mut conversation.cache, prepared.new_tokens())?
        .with_constraint(constraint)
        .with_prefill_step_size(request.prefill_step_size)
        .with_loop_shape(request.loop_shape)
        .with_sampler(sampler)
        .with_cancel(cancel.clone())
        .with_graph_count(request.count_graph_nodes)
        .with_images(prepared.new_images());
    let mut text = RunText::new(model, request, &prepared);
    let mut stop_reason = StopReason::MaxTokens;
    while text.generated() < request.max_tokens {
        // A split model's steps stop on every rank together, through the
        // step's stop flag, which carries the cancel.
        if cancel.is_cancelled() && !steps.is_split() {
            stop_reason = StopReason::Cancelled;
            break;
        }
        let token = match steps.next() {
            Some(Ok(token)) => token,
            Some(Err(_)) if cancel.is_cancelled() => {
                stop_reason = StopReason::Cancelled;
                break;
            }
            Some(Err(e)) => return Err(e.into()),
            None => {
                // The grammar allows nothing more: the reply is whole.
                if steps.grammar_complete() {
                    stop_reason = StopReason::Eos;
                }
                break;
            }
        };
        match text.token(token, sink) {
            Ok(Some(reason)) => {
                stop_reason = reason;
                break;
            }
            Ok(None) => {}
            Err(error) => {
                steps.stop_other_ranks();
                return Err(error);
            }
        }
    }
    // The grammar may be complete with the last token the budget allowed.
    if stop_reason == StopReason::MaxTokens && steps.grammar_complete() {
        stop_reason = StopReason::Eos;
    }
    let ended = text.end(stop_reason, sink)?;
    let anatomy = steps.anatomy();
    let prefill_snapshot = steps.take_prefill_snapshot();
    let constraint = steps.constraint().map(TokenConstraint::stats);
    drop(steps);
    let mut outcome = conclude(
        model,
        conversation,
        request,
        prepared,
        ended,
        prefill_snapshot,
        anatomy,
        setting,
    )?;
    outcome.stats.constraint = constraint;
    Ok(outcome)
}

/// The run's outcome once its tokens are in and `conversation.cache` holds
/// what it fed: the conversation keeps its tokens and this turn's
/// snapshots, and the timings are worked out.
#[allow(clippy::too_many_arguments)]
pub fn conclude(
    model: &LoadedModel,
    conversation: &mut Conversation,
    request: &GenerateRequest,
    prepared: PreparedRun,
    ended: EndedText,
    prefill_snapshot: Option<CacheSnapshot>,
    anatomy: StepAnatomy,
    setting: RunSetting,
) -> Result<RunOutcome, RunError> {
    let PreparedRun {
        prompt,
        cached,
        prefix,
        templated,
        images,
        image_marks,
        ..
    } = prepared;
    let EndedText {
        reply,
        generated,
        token_times,
        prefill_started,
        first_token_at,
        last_token_at,
        ended_at,
        stop_reason,
    } = ended;
    // The cache holds the prompt and the generated tokens fed back (each
    // step feeds its token in before the next is read; `offset` says how
    // far it got).
    conversation.tokens = prompt.clone();
    conversation.tokens.extend(&generated);
    let synced = conversation.cache.first().map_or(0, |c| c.offset()) as usize;
    conversation.tokens.truncate(synced);
    conversation.images = image_marks
        .iter()
        .copied()
        .filter(|mark| mark.start < synced)
        .collect();
    // A model with state layers keeps this turn's boundaries for the next
    // prompt to branch from (`KEPT_SNAPSHOTS`).
    for snapshot in prefill_snapshot
        .into_iter()
        .chain(CacheSnapshot::take(&conversation.cache))
    {
        conversation.keep_snapshot(snapshot);
    }
    let kv_cache_bytes = conversation.kv_cache_bytes();

    let first = first_token_at.unwrap_or(last_token_at);
    let (prefill_tokens, prefill_ms) = match first_token_at {
        Some(first) => (
            prompt.len() - cached,
            (first - prefill_started).as_secs_f64() * 1e3,
        ),
        // Stopped before the first token: only the chunks that ran were
        // computed (the cache holds them), for as long as they took.
        None => (
            synced.saturating_sub(cached),
            (ended_at - prefill_started).as_secs_f64() * 1e3,
        ),
    };
    let ttft_ms = (first - setting.accepted_at).as_secs_f64() * 1e3;
    let decode_ms = (last_token_at - first).as_secs_f64() * 1e3;
    let (reasoning_tokens, reasoning_ms) = reasoning_share(&reply.reasoning_tokens, &token_times);
    let stats = RunStats {
        model_dir: model.dir.display().to_string(),
        model_type: model.model_type.clone(),
        quantization: model.quantization_label(),
        weights_bytes: model.weights_bytes as u64,
        load_kind: setting.load_kind,
        load_ms: setting.load_ms,
        ttft_ms: if generated.is_empty() { 0.0 } else { ttft_ms },
        prefill_ms,
        decode_ms,
        prompt_tokens: prompt.len(),
        cached_tokens: cached,
        prefix_source: prefix.source,
        prefix_read_bytes: prefix.bytes,
        prefix_read_ms: prefix.ms,
        prefill_tokens,
        generated_tokens: generated.len(),
        reasoning_tokens,
        reasoning_ms,
        prefill_tps: per_second(prefill_tokens, prefill_ms),
        decode_tps: per_second(generated.len().saturating_sub(1), decode_ms),
        // mlx-lm counts the tokens it was given: those not already cached.
        prompt_tps: per_second(prefill_tokens, ttft_ms),
        generation_tps: per_second(generated.len(), decode_ms),
        mlx_peak_bytes: mlx_rs::memory::peak_memory()? as u64,
        mlx_active_bytes: mlx_rs::memory::active_memory()? as u64,
        mlx_cache_bytes: mlx_rs::memory::cache_memory()? as u64,
        kv_cache_bytes: kv_cache_bytes as u64,
        loop_shape: request.loop_shape,
        prefill_step_size: request.prefill_step_size,
        max_kv_size: request.max_kv_size,
        // A bounded (rotating) cache stays in floats whatever kv_bits says.
        kv_bits: request
            .kv_quantization()
            .filter(|_| request.max_kv_size.is_none())
            .map(|q| q.bits as u8),
        images: image_marks.len(),
        image_tokens: image_marks.iter().map(|m| m.shape.tokens()).sum(),
        image_encode_ms: images.as_ref().map_or(0.0, |i| i.encode_ms),
        sampler: request.sampler.clone(),
        stop_reason,
        stop_string: reply.stop_string.clone(),
        chat_template: templated,
        batch: setting.batch,
        // The caller adds what holding the reply to a grammar cost.
        constraint: None,
    };
    Ok(RunOutcome {
        text: reply.answer,
        reasoning: reply.reasoning,
        tool_calls: reply.tool_calls,
        raw_text: reply.raw_text,
        token_ids: generated,
        stats,
        anatomy,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::engine::reply::{ThinkStart, ToolCallSyntax};
    use crate::synth::tokenizer::{TokenizerSpec, write_tokenizer};

    #[test]
    fn on_disk_an_images_tokens_say_which_file_it_was() {
        let mark = |start, digest: u8| ImageMark {
            start,
            shape: ImageShape { rows: 2, cols: 2 },
            digest: [digest; 32],
        };
        // Text, four image tokens (id 9), text.
        let tokens = [1, 2, 9, 9, 9, 9, 3, 4];
        let cat = tokens_on_disk(&tokens, &[mark(2, 7)]);
        let dog = tokens_on_disk(&tokens, &[mark(2, 8)]);
        assert_eq!(cat[..2], tokens[..2]);
        assert_eq!(cat[6..], tokens[6..]);
        assert!(cat[2..6].iter().all(|&t| t >= 0x8000_0000));
        assert_eq!(cat, tokens_on_disk(&tokens, &[mark(2, 7)]));
        // Another file differs from its first token on, and so does the
        // same file at another place.
        assert_eq!(reusable_prefix(&cat, &dog), 2);
        assert_eq!(
            reusable_prefix(&cat, &tokens_on_disk(&tokens, &[mark(1, 7)])),
            1
        );
        // A conversation cut inside an image keys what it holds.
        assert_eq!(tokens_on_disk(&tokens[..4], &[mark(2, 7)]), cat[..4]);
    }

    const QWEN_TOOLS: ReplyFormat = ReplyFormat::Marked {
        think: Some(ThinkStart::ModelOpens),
        tool_calls: Some(ToolCallSyntax::Tagged),
    };

    fn tokenizer() -> (tempfile::TempDir, std::sync::Arc<tokenizers::Tokenizer>) {
        let dir = tempfile::tempdir().unwrap();
        write_tokenizer(
            &TokenizerSpec {
                vocab_size: 1024,
                seed: 5,
            },
            dir.path(),
        )
        .unwrap();
        let tokenizer =
            tokenizers::Tokenizer::from_file(dir.path().join("tokenizer.json")).unwrap();
        (dir, std::sync::Arc::new(tokenizer))
    }

    /// Streams `text`'s tokens one by one, taking the deltas after each, as
    /// a run that sends every token would; returns the deltas and the reply.
    fn stream_tokens(
        tokenizer: &std::sync::Arc<tokenizers::Tokenizer>,
        format: ReplyFormat,
        stops: &[String],
        text: &str,
    ) -> (Vec<RunEvent>, FinishedReply, Vec<u32>) {
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let mut stream = ReplyStream::new(tokenizer, format, stops);
        let mut deltas = Vec::new();
        let mut stopped = false;
        for id in &ids {
            stopped = stream.push(*id).unwrap();
            deltas.extend(stream.take_deltas(vec![*id]));
            if stopped {
                break;
            }
        }
        if !stopped {
            stream.finish().unwrap();
        }
        deltas.extend(stream.take_deltas(Vec::new()));
        (deltas, stream.into_reply(), ids)
    }

    /// The deltas' reasoning, text, calls and token ids, each joined.
    fn joined(deltas: &[RunEvent]) -> (String, String, Vec<ToolCall>, Vec<u32>) {
        let mut all = (String::new(), String::new(), Vec::new(), Vec::new());
        for delta in deltas {
            let RunEvent::Delta {
                text,
                reasoning,
                tool_calls,
                token_ids,
            } = delta
            else {
                panic!("not a delta: {delta:?}");
            };
            all.0.push_str(reasoning);
            all.1.push_str(text);
            all.2.extend(tool_calls.iter().cloned());
            all.3.extend(token_ids);
        }
        all
    }

    #[test]
    fn a_reply_is_split_token_by_token_with_its_raw_text_kept() {
        let (_dir, tokenizer) = tokenizer();
        // The synthetic tokenizer has no <think> token: every tag arrives
        // over several byte-level tokens, split at arbitrary places.
        let text = "<think>\nThe user wants 온도 in Seoul.\n</think>\n\nIt is 31°C 🌡 there.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Seoul\", \"days\": 2}}\n</tool_call>";
        let (deltas, reply, ids) = stream_tokens(&tokenizer, QWEN_TOOLS, &[], text);
        assert_eq!(reply.raw_text, text);
        assert_eq!(reply.reasoning, "The user wants 온도 in Seoul.");
        assert_eq!(reply.answer, "It is 31°C 🌡 there.");
        assert_eq!(reply.tool_calls.len(), 1);
        let call = &reply.tool_calls[0];
        assert_eq!(call.function.name, "get_weather");
        assert_eq!(
            serde_json::to_string(&call.function.arguments).unwrap(),
            r#"{"city":"Seoul","days":2}"#
        );
        assert!(reply.ends_with_call);
        let (reasoning, answer, calls, token_ids) = joined(&deltas);
        assert_eq!(reasoning, reply.reasoning);
        assert_eq!(answer, reply.answer);
        assert_eq!(calls, reply.tool_calls);
        assert_eq!(token_ids, ids, "every token id is in exactly one delta");
        // Reasoning streamed before the answer began.
        let first_answer = deltas
            .iter()
            .position(|d| matches!(d, RunEvent::Delta { text, .. } if !text.is_empty()))
            .unwrap();
        assert!(
            deltas[..first_answer]
                .iter()
                .any(|d| matches!(d, RunEvent::Delta { reasoning, .. } if !reasoning.is_empty()))
        );
    }

    /// The text of the tokens the stream counted as reasoning, and of the rest.
    fn reasoning_and_rest(
        tokenizer: &tokenizers::Tokenizer,
        ids: &[u32],
        reply: &FinishedReply,
    ) -> (String, String) {
        assert_eq!(reply.reasoning_tokens.len(), ids.len());
        let pick = |reasoning: bool| -> String {
            let picked: Vec<u32> = ids
                .iter()
                .zip(&reply.reasoning_tokens)
                .filter(|(_, r)| **r == reasoning)
                .map(|(id, _)| *id)
                .collect();
            tokenizer.decode(&picked, false).unwrap()
        };
        (pick(true), pick(false))
    }

    #[test]
    fn the_tokens_that_wrote_the_reasoning_are_counted_as_reasoning() {
        let (_dir, tokenizer) = tokenizer();
        let text = "<think>\nThe user wants 온도.\n</think>\n\nIt is 31°C.";
        let (_, reply, ids) = stream_tokens(&tokenizer, QWEN_TOOLS, &[], text);
        let (reasoning, rest) = reasoning_and_rest(&tokenizer, &ids, &reply);
        // The tokens up to the one that completes `</think>`, and no more
        // (the next may carry the blank line after it).
        assert!(
            reasoning.starts_with("<think>") && reasoning.contains("</think>"),
            "{reasoning:?}"
        );
        let closing = reasoning.find("</think>").unwrap() + "</think>".len();
        assert!(reasoning[closing..].trim().is_empty(), "{reasoning:?}");
        assert!(rest.trim_start().starts_with("It is 31°C."), "{rest:?}");
        let first_answer = reply.reasoning_tokens.iter().position(|r| !r).unwrap();
        assert!(reply.reasoning_tokens[first_answer..].iter().all(|r| !r));

        // Opened by the prompt and never closed: every token.
        let opened = ReplyFormat::Marked {
            think: Some(ThinkStart::PromptOpened),
            tool_calls: None,
        };
        let (_, reply, _) = stream_tokens(&tokenizer, opened, &[], "Still weighing 2 + 2 </thi");
        assert!(reply.reasoning_tokens.iter().all(|r| *r));
        // Not a thinking model: none.
        let (_, reply, _) = stream_tokens(&tokenizer, ReplyFormat::PLAIN, &[], text);
        assert!(reply.reasoning_tokens.iter().all(|r| !r));
    }

    #[test]
    fn harmony_analysis_tokens_are_reasoning_and_the_final_channel_is_not() {
        let (_dir, tokenizer) = tokenizer();
        let text = "<|channel|>analysis<|message|>Easy sum.<|end|><|start|>assistant<|channel|>final<|message|>4.";
        let format = ReplyFormat::Harmony { tool_calls: false };
        let (_, reply, ids) = stream_tokens(&tokenizer, format, &[], text);
        assert_eq!(reply.reasoning, "Easy sum.");
        assert_eq!(reply.answer, "4.");
        let (reasoning, rest) = reasoning_and_rest(&tokenizer, &ids, &reply);
        assert!(
            reasoning.starts_with("<|channel|>analysis<|message|>Easy sum.<|end|>"),
            "{reasoning:?}"
        );
        assert!(rest.ends_with("final<|message|>4."), "{rest:?}");
        assert!(!rest.contains("Easy"), "{rest:?}");
    }

    #[test]
    fn the_reasoning_share_counts_each_reasoning_tokens_time_since_the_one_before() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let times = [at(0), at(10), at(30), at(60), at(100)];
        // The first token's time is prefill's: it adds nothing.
        assert_eq!(
            reasoning_share(&[true, true, true, false, false], &times),
            (3, 30.0)
        );
        assert_eq!(
            reasoning_share(&[false, false, false, true, true], &times),
            (2, 70.0)
        );
        assert_eq!(reasoning_share(&[false; 5], &times), (0, 0.0));
        // An end-of-sequence token has a time and no text, so no flag.
        assert_eq!(reasoning_share(&[true, true], &times), (2, 10.0));
    }

    #[test]
    fn a_reply_that_is_all_reasoning_spent_exactly_the_decode_time() {
        // Intervals in odd nanoseconds, whose milliseconds do not add up
        // exactly in floating point.
        let start = Instant::now();
        let mut times = vec![start];
        for step in 0..64u64 {
            let last = times[times.len() - 1];
            times.push(last + Duration::from_nanos(123_457 + step * 7_919));
        }
        let decode_ms = (times[times.len() - 1] - times[0]).as_secs_f64() * 1e3;
        let (count, reasoning_ms) = reasoning_share(&vec![true; times.len()], &times);
        assert_eq!(count, times.len());
        assert_eq!(reasoning_ms, decode_ms);
    }

    #[test]
    fn parts_out_of_order_in_one_delta_go_in_separate_deltas() {
        let (_dir, tokenizer) = tokenizer();
        let text = "Hi.<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>Then more.";
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        let mut stream = ReplyStream::new(&tokenizer, QWEN_TOOLS, &[]);
        for id in &ids {
            assert!(!stream.push(*id).unwrap());
        }
        stream.finish().unwrap();
        // All at once: text, a call, then text again, which a single delta
        // (reasoning, text, calls) could not put in order.
        let deltas = stream.take_deltas(ids.clone());
        assert_eq!(deltas.len(), 2, "{deltas:?}");
        assert!(
            matches!(&deltas[0], RunEvent::Delta { text, tool_calls, token_ids, .. }
            if text == "Hi." && tool_calls.len() == 1 && *token_ids == ids)
        );
        assert!(
            matches!(&deltas[1], RunEvent::Delta { text, tool_calls, token_ids, .. }
            if text == "Then more." && tool_calls.is_empty() && token_ids.is_empty())
        );
        assert!(!stream.into_reply().ends_with_call);
    }

    #[test]
    fn a_stop_string_cuts_the_raw_text_and_the_split_follows() {
        let (_dir, tokenizer) = tokenizer();
        let stops = vec!["STOP".to_owned()];
        let text = "<think>\nShort.\n</think>\n\nThe answer STOP and more";
        let (deltas, reply, _) = stream_tokens(&tokenizer, QWEN_TOOLS, &stops, text);
        assert_eq!(reply.raw_text, "<think>\nShort.\n</think>\n\nThe answer ");
        assert_eq!(reply.reasoning, "Short.");
        assert_eq!(reply.answer, "The answer ");
        let (_, answer, _, _) = joined(&deltas);
        assert_eq!(answer, reply.answer);
        assert_eq!(reply.stop_string.as_deref(), Some("STOP"));
        // Of several, the one the text reached first is named.
        let stops = vec!["more".to_owned(), "answer".to_owned()];
        let (_, reply, _) = stream_tokens(&tokenizer, QWEN_TOOLS, &stops, text);
        assert_eq!(reply.stop_string.as_deref(), Some("answer"));
        let (_, reply, _) = stream_tokens(&tokenizer, QWEN_TOOLS, &[], text);
        assert_eq!(reply.stop_string, None);
    }

    #[test]
    fn plain_replies_are_all_answer() {
        let (_dir, tokenizer) = tokenizer();
        let text = "<think>not parsed</think> {\"name\": \"x\"}";
        let (deltas, reply, _) = stream_tokens(&tokenizer, ReplyFormat::PLAIN, &[], text);
        assert_eq!(reply.answer, text);
        assert_eq!(reply.raw_text, text);
        assert!(reply.reasoning.is_empty() && reply.tool_calls.is_empty());
        assert_eq!(joined(&deltas).1, text);
    }

    #[test]
    fn text_that_may_start_a_stop_string_is_held_back() {
        let stops = vec!["</answer>".to_owned(), "STOP".to_owned()];
        assert_eq!(held_back("hello </ans", &stops), 5);
        assert_eq!(held_back("hello ST", &stops), 2);
        assert_eq!(held_back("hello", &stops), 0);
        assert_eq!(held_back("", &stops), 0);
    }

    /// A cache of one growing KV layer and one convolution layer, fed
    /// `tokens` (each token's value written into both).
    fn hybrid_feed(conversation: &mut Conversation, tokens: &[u32]) {
        use crate::engine::cache::LayerCache;
        let n = tokens.len() as i32;
        let data: Vec<f32> = tokens.iter().map(|&t| t as f32).collect();
        let x = mlx_rs::Array::from_slice(&data, &[1, n, 1]);
        let kv = mlx_rs::Array::from_slice(&data, &[1, 1, n, 1]);
        for layer in &mut conversation.cache {
            match layer {
                LayerCache::Conv(c) => {
                    c.extend(&x).unwrap();
                }
                other => {
                    other.update_and_fetch(&kv, &kv).unwrap();
                }
            }
        }
        conversation.tokens.extend(tokens);
    }

    fn hybrid_cache() -> Vec<crate::engine::cache::LayerCache> {
        use crate::engine::cache::{ConvState, LayerCache};
        vec![LayerCache::new(None), LayerCache::Conv(ConvState::new(3))]
    }

    #[test]
    fn a_hybrid_conversation_branches_from_its_latest_snapshot_within_the_prefix() {
        let mut conversation = Conversation::with_cache(hybrid_cache(), None);
        // Turn one: a prompt of 6 prefilled up to its last token, then the
        // last token and a reply of 3.
        hybrid_feed(&mut conversation, &[1, 2, 3, 4, 5]);
        let prefilled = CacheSnapshot::take(&conversation.cache).unwrap();
        conversation.keep_snapshot(prefilled);
        hybrid_feed(&mut conversation, &[6, 7, 8, 9]);
        let replied = CacheSnapshot::take(&conversation.cache).unwrap();
        conversation.keep_snapshot(replied);
        assert_eq!(conversation.snapshot_positions(), vec![5, 9]);
        // The conv state's 2 inputs of 4 bytes, twice, besides the cache.
        assert_eq!(conversation.snapshot_bytes(), 16);
        let live: usize = conversation.cache.iter().map(|l| l.nbytes()).sum();
        assert_eq!(conversation.kv_cache_bytes(), live + 16);

        // The next prompt extends everything: nothing to go back to.
        let cached = conversation.reuse_prefix(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], || {
            panic!("nothing to start over")
        });
        assert_eq!(cached, 9);

        // A prompt that leaves the reply (an edit of it): back to the end
        // of the first prompt's prefill, the state as it was there.
        let cached = conversation.reuse_prefix(&[1, 2, 3, 4, 5, 6, 70, 80], || {
            panic!("a snapshot lies within the prefix")
        });
        assert_eq!(cached, 5);
        assert_eq!(conversation.tokens, vec![1, 2, 3, 4, 5]);
        assert!(conversation.cache.iter().all(|l| l.offset() == 5));
        assert_eq!(conversation.snapshot_positions(), vec![5]);
        hybrid_feed(&mut conversation, &[6, 70]);
        let mut one_pass = Conversation::with_cache(hybrid_cache(), None);
        hybrid_feed(&mut one_pass, &[1, 2, 3, 4, 5, 6, 70]);
        let state = |c: &Conversation| {
            let arrays = c.cache[1].state();
            arrays[0].eval().unwrap();
            arrays[0].as_slice::<f32>().to_vec()
        };
        assert_eq!(state(&conversation), state(&one_pass));
        assert_eq!(state(&conversation), vec![6., 70.]);

        // A prompt sharing less than any snapshot starts over.
        let mut started_over = false;
        let cached = conversation.reuse_prefix(&[1, 2, 9, 9], || {
            started_over = true;
            hybrid_cache()
        });
        assert_eq!(cached, 0);
        assert!(started_over);
        assert!(conversation.tokens.is_empty() && conversation.snapshot_positions().is_empty());
    }

    #[test]
    fn a_conversation_keeps_its_latest_snapshots_only() {
        let mut conversation = Conversation::with_cache(hybrid_cache(), None);
        for turn in 0..6u32 {
            hybrid_feed(&mut conversation, &[turn + 1, turn + 100]);
            let snapshot = CacheSnapshot::take(&conversation.cache).unwrap();
            conversation.keep_snapshot(snapshot);
        }
        assert_eq!(conversation.snapshot_positions(), vec![6, 8, 10, 12]);
        assert_eq!(KEPT_SNAPSHOTS, 4);
    }
}
