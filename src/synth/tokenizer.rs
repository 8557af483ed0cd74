//! The tokenizer half of `ondo synth`: trains a small byte-level BPE on a built-in,
//! seed-varied corpus and writes `tokenizer.json` and `tokenizer_config.json` in the
//! Llama 3 layout that Hugging Face `transformers`, mlx-lm and Ondo all read.
//!
//! Vocabulary layout: ids `0..n` are the trained BPE vocabulary (the 256 byte-level
//! symbols first, then merged tokens in the order they were learned), and the six
//! special tokens follow at `n..n + 6` in the order of [`SPECIAL_TOKENS`], as in
//! Llama 3 where they sit after the 128,000 BPE ids. The total (`n + 6`) equals the
//! requested size as long as the corpus has pairs left to merge; the built-in corpus
//! runs out at about 4,600 ids (4,571 to 4,668 over the seeds tried), and past that
//! [`SynthTokenizer::vocab_size`] reports what was reached. A model's embedding may
//! be larger than its tokenizer, as in real checkpoints.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::ser::SerializeMap;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainer};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior, TokenizerImpl};

/// Start of every sequence; the post-processor prepends it.
pub const BEGIN_OF_TEXT: &str = "<|begin_of_text|>";
/// End of a document (base-model EOS).
pub const END_OF_TEXT: &str = "<|end_of_text|>";
/// Opens a role header in the chat format.
pub const START_HEADER_ID: &str = "<|start_header_id|>";
/// Closes a role header in the chat format.
pub const END_HEADER_ID: &str = "<|end_header_id|>";
/// End of one chat turn (chat EOS, the `eos_token` of `tokenizer_config.json`).
pub const EOT_ID: &str = "<|eot_id|>";
/// Padding; never produced by encoding text.
pub const PAD: &str = "<|finetune_right_pad_id|>";

/// The special tokens in id order; they take the ids right after the BPE vocabulary.
pub const SPECIAL_TOKENS: [&str; 6] = [
    BEGIN_OF_TEXT,
    END_OF_TEXT,
    START_HEADER_ID,
    END_HEADER_ID,
    EOT_ID,
    PAD,
];

/// Number of byte-level symbols every byte-level BPE starts from.
const BYTE_ALPHABET_SIZE: usize = 256;

/// The smallest total vocabulary [`write_tokenizer`] accepts: all bytes plus the
/// special tokens (a BPE with no merges, still able to encode any text).
pub const MIN_VOCAB_SIZE: usize = BYTE_ALPHABET_SIZE + SPECIAL_TOKENS.len();

/// `model_max_length` written to `tokenizer_config.json`, in tokens (Llama 3.2's).
pub const MODEL_MAX_LENGTH: usize = 131_072;

/// Llama-3-style pre-tokenization: English contractions, letter runs with one
/// leading non-letter, numbers in groups of at most three digits, punctuation runs,
/// newlines, and whitespace that leaves its last space to the next word.
const SPLIT_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The chat format: an optional system turn is just the first message; each message
/// is a role header, a blank line, the trimmed content and `<|eot_id|>`. Uses only
/// `+`, `trim`, `for` and `if`, so that small Jinja engines (minijinja) render it
/// as Jinja2 does.
const CHAT_TEMPLATE: &str = r"{#- Ondo synthetic chat format (Llama 3 style). -#}
{{- bos_token -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' -}}
{{- message['content'] | trim -}}
{{- '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
";

/// The chat format of a synthetic vision model: the same turns, with a
/// message whose content is a list of parts writing its image parts as the
/// image marker (the first of the model's image tokens) and its text parts
/// as text, as Gemma 3's template writes them.
const VISION_CHAT_TEMPLATE: &str = r"{#- Ondo synthetic chat format (Llama 3 style, with images). -#}
{{- bos_token -}}
{%- for message in messages -%}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' -}}
{%- if message['content'] is string -%}
{{- message['content'] | trim -}}
{%- else -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'image' -%}
{{- 'IMAGE_MARKER' -}}
{%- elif part['type'] == 'text' -%}
{{- part['text'] | trim -}}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
";

/// What tokenizer to synthesize.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerSpec {
    /// Requested total vocabulary, special tokens included; at least [`MIN_VOCAB_SIZE`].
    pub vocab_size: usize,
    /// Varies the training corpus; the same seed gives a byte-identical tokenizer.
    pub seed: u64,
}

/// The tokenizer that [`write_tokenizer`] wrote, as the model config needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SynthTokenizer {
    /// Total vocabulary, special tokens included: every id is below this. Equal to
    /// the requested size unless the built-in corpus ran out of pairs to merge.
    pub vocab_size: usize,
    /// Id of `<|begin_of_text|>`.
    pub bos_token_id: u32,
    /// Ids that end generation, ascending: `<|end_of_text|>` and `<|eot_id|>`.
    pub eos_token_ids: Vec<u32>,
    /// Id of `<|finetune_right_pad_id|>`.
    pub pad_token_id: u32,
}

/// Why a synthetic tokenizer could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerSynthError {
    /// The requested vocabulary cannot hold the byte alphabet and the special tokens.
    #[error(
        "a vocabulary of {requested} tokens is too small: a byte-level BPE needs 256 byte \
         tokens plus {specials} special tokens; ask for at least {minimum}"
    )]
    VocabTooSmall {
        /// The size asked for.
        requested: usize,
        /// [`MIN_VOCAB_SIZE`].
        minimum: usize,
        /// Number of special tokens.
        specials: usize,
    },
    /// Building or training the tokenizer failed; the inputs are all built in, so
    /// this is a bug rather than something the user did.
    #[error(
        "building the synthetic tokenizer failed while {step}: {reason}; this is a bug in \
         Ondo's synthetic models, please report it with the vocabulary size and seed"
    )]
    Build {
        /// What was being done, e.g. "training the BPE".
        step: &'static str,
        /// The library's message.
        reason: String,
    },
    /// The output folder could not be created.
    #[error(
        "could not create the folder {}: {source}; check that its parent exists and is writable",
        path.display()
    )]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A tokenizer file could not be written.
    #[error(
        "could not write {}: {source}; check that the folder is writable and the disk has space",
        path.display()
    )]
    WriteFile {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl TokenizerSynthError {
    fn build(step: &'static str, reason: impl std::fmt::Display) -> Self {
        Self::Build {
            step,
            reason: reason.to_string(),
        }
    }
}

type BpeTokenizer = TokenizerImpl<
    BPE,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// Adds a vision model's image tokens (`(text, name)`: the token and the
/// name `extra_special_tokens` gives it) to the tokenizer written in `dir`,
/// as special tokens after all others, and switches its chat template to
/// one that writes `marker` for each image. Returns their ids, in order.
pub fn add_vision_tokens(
    dir: &Path,
    tokens: &[(&str, &str)],
    marker: &str,
    written: &mut SynthTokenizer,
) -> Result<Vec<u32>, TokenizerSynthError> {
    let tokenizer_path = dir.join("tokenizer.json");
    let mut tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path)
        .map_err(|e| TokenizerSynthError::build("reading tokenizer.json back", e))?;
    let added: Vec<AddedToken> = tokens
        .iter()
        .map(|(text, _)| AddedToken::from(*text, true))
        .collect();
    tokenizer.add_special_tokens(&added);
    let mut ids = Vec::with_capacity(tokens.len());
    for (text, _) in tokens {
        ids.push(tokenizer.token_to_id(text).ok_or_else(|| {
            TokenizerSynthError::build("adding the image tokens", format!("{text} has no id"))
        })?);
    }
    tokenizer
        .save(&tokenizer_path, true)
        .map_err(|source| TokenizerSynthError::WriteFile {
            path: tokenizer_path,
            source,
        })?;
    let config_path = dir.join("tokenizer_config.json");
    let write_error =
        |e: Box<dyn std::error::Error + Send + Sync>| TokenizerSynthError::WriteFile {
            path: config_path.clone(),
            source: e,
        };
    let text = std::fs::read_to_string(&config_path).map_err(|e| write_error(Box::new(e)))?;
    let mut config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| write_error(Box::new(e)))?;
    let mut names = serde_json::Map::new();
    for ((text, name), id) in tokens.iter().zip(&ids) {
        config["added_tokens_decoder"][id.to_string()] = serde_json::json!({
            "content": text, "lstrip": false, "normalized": false, "rstrip": false,
            "single_word": false, "special": true,
        });
        names.insert((*name).to_owned(), serde_json::json!(text));
    }
    config["extra_special_tokens"] = serde_json::Value::Object(names);
    config["chat_template"] =
        serde_json::json!(VISION_CHAT_TEMPLATE.replace("IMAGE_MARKER", marker));
    let mut text = serde_json::to_string_pretty(&config)
        .map_err(|e| TokenizerSynthError::build("serializing tokenizer_config.json", e))?;
    text.push('\n');
    std::fs::write(&config_path, text).map_err(|e| write_error(Box::new(e)))?;
    written.vocab_size = tokenizer.get_vocab_size(true);
    Ok(ids)
}

/// Trains a byte-level BPE for `spec` and writes `tokenizer.json` and
/// `tokenizer_config.json` into `dir` (created if missing; existing files replaced).
pub fn write_tokenizer(
    spec: &TokenizerSpec,
    dir: &Path,
) -> Result<SynthTokenizer, TokenizerSynthError> {
    if spec.vocab_size < MIN_VOCAB_SIZE {
        return Err(TokenizerSynthError::VocabTooSmall {
            requested: spec.vocab_size,
            minimum: MIN_VOCAB_SIZE,
            specials: SPECIAL_TOKENS.len(),
        });
    }
    let documents = corpus_documents(spec.seed);
    let mut tokenizer = train_bpe(&documents, spec.vocab_size - SPECIAL_TOKENS.len())?;

    let special: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|content| AddedToken::from(*content, true))
        .collect();
    tokenizer.add_special_tokens(&special);
    let mut ids = [0u32; SPECIAL_TOKENS.len()];
    for (id, content) in ids.iter_mut().zip(SPECIAL_TOKENS) {
        *id = tokenizer.token_to_id(content).ok_or_else(|| {
            TokenizerSynthError::build("adding the special tokens", format!("{content} has no id"))
        })?;
    }
    let [bos, end_of_text, _, _, eot, pad] = ids;

    let post_processor = bos_template(bos)?;
    tokenizer.with_post_processor(Some(post_processor));

    std::fs::create_dir_all(dir).map_err(|source| TokenizerSynthError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let tokenizer_path = dir.join("tokenizer.json");
    tokenizer
        .save(&tokenizer_path, true)
        .map_err(|source| TokenizerSynthError::WriteFile {
            path: tokenizer_path,
            source,
        })?;

    let config_path = dir.join("tokenizer_config.json");
    let config = tokenizer_config_json(&ids)?;
    std::fs::write(&config_path, config).map_err(|source| TokenizerSynthError::WriteFile {
        path: config_path,
        source: Box::new(source),
    })?;

    Ok(SynthTokenizer {
        vocab_size: tokenizer.get_vocab_size(true),
        bos_token_id: bos,
        eos_token_ids: vec![end_of_text, eot],
        pad_token_id: pad,
    })
}

/// Trains the byte-level BPE model with `bpe_vocab_size` ids (fewer if the corpus
/// runs out of pairs), without special tokens.
fn train_bpe(
    documents: &[String],
    bpe_vocab_size: usize,
) -> Result<BpeTokenizer, TokenizerSynthError> {
    let split = Split::new(
        SplitPattern::Regex(SPLIT_PATTERN.to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| TokenizerSynthError::build("compiling the split pattern", e))?;
    // The split regex already did the word splitting, so ByteLevel only maps bytes
    // to its printable alphabet (use_regex = false), as Llama 3 configures it.
    let byte_level = ByteLevel::new(false, true, false);
    let pre_tokenizer = Sequence::new(vec![split.into(), byte_level.into()]);

    let mut tokenizer: BpeTokenizer = TokenizerImpl::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    // The decoder maps the printable alphabet back to bytes, then to UTF-8.
    tokenizer.with_decoder(Some(ByteLevel::default()));

    // All 256 byte symbols are in the vocabulary whether or not the corpus uses
    // them, so any text encodes without an unknown token.
    let alphabet: HashSet<char> = ByteLevel::alphabet().into_iter().collect();
    let mut trainer = BpeTrainer::builder()
        .vocab_size(bpe_vocab_size)
        .min_frequency(0)
        .show_progress(false)
        .initial_alphabet(alphabet)
        .build();
    tokenizer
        .train(&mut trainer, documents.iter())
        .map_err(|e| TokenizerSynthError::build("training the BPE", e))?;
    Ok(tokenizer)
}

/// Prepends `<|begin_of_text|>` to every sequence (and to the second of a pair), as
/// Llama 3 does.
fn bos_template(bos: u32) -> Result<TemplateProcessing, TokenizerSynthError> {
    let step = "building the BOS post-processor";
    TemplateProcessing::builder()
        .try_single(format!("{BEGIN_OF_TEXT} $A"))
        .map_err(|e| TokenizerSynthError::build(step, e))?
        .try_pair(format!("{BEGIN_OF_TEXT} $A {BEGIN_OF_TEXT}:1 $B:1"))
        .map_err(|e| TokenizerSynthError::build(step, e))?
        .special_tokens(vec![(BEGIN_OF_TEXT, bos)])
        .build()
        .map_err(|e| TokenizerSynthError::build(step, e))
}

/// One entry of `added_tokens_decoder`, with the fields Hugging Face writes.
#[derive(Serialize)]
struct AddedTokenEntry {
    content: &'static str,
    lstrip: bool,
    normalized: bool,
    rstrip: bool,
    single_word: bool,
    special: bool,
}

/// `added_tokens_decoder` in ascending id order; a JSON object keyed by the id as a
/// string (a BTreeMap would sort "1000" before "999").
struct AddedTokensDecoder(Vec<(u32, AddedTokenEntry)>);

impl Serialize for AddedTokensDecoder {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (id, entry) in &self.0 {
            map.serialize_entry(&id.to_string(), entry)?;
        }
        map.end()
    }
}

/// `tokenizer_config.json`; fields in the order Hugging Face tends to write them.
#[derive(Serialize)]
struct TokenizerConfig {
    added_tokens_decoder: AddedTokensDecoder,
    bos_token: &'static str,
    chat_template: &'static str,
    clean_up_tokenization_spaces: bool,
    eos_token: &'static str,
    model_input_names: [&'static str; 2],
    model_max_length: usize,
    pad_token: &'static str,
    tokenizer_class: &'static str,
}

/// The `tokenizer_config.json` text for special tokens with `ids` (in
/// [`SPECIAL_TOKENS`] order).
fn tokenizer_config_json(ids: &[u32]) -> Result<String, TokenizerSynthError> {
    let decoder = SPECIAL_TOKENS
        .iter()
        .zip(ids)
        .map(|(content, id)| {
            let entry = AddedTokenEntry {
                content,
                lstrip: false,
                normalized: false,
                rstrip: false,
                single_word: false,
                special: true,
            };
            (*id, entry)
        })
        .collect();
    let config = TokenizerConfig {
        added_tokens_decoder: AddedTokensDecoder(decoder),
        bos_token: BEGIN_OF_TEXT,
        chat_template: CHAT_TEMPLATE,
        clean_up_tokenization_spaces: false,
        eos_token: EOT_ID,
        model_input_names: ["input_ids", "attention_mask"],
        model_max_length: MODEL_MAX_LENGTH,
        pad_token: PAD,
        tokenizer_class: "PreTrainedTokenizerFast",
    };
    let mut text = serde_json::to_string_pretty(&config)
        .map_err(|e| TokenizerSynthError::build("serializing tokenizer_config.json", e))?;
    text.push('\n');
    Ok(text)
}

// ---------------------------------------------------------------------------
// The training corpus.
// ---------------------------------------------------------------------------

/// Hand-written fragments (prose in several scripts, code, tables, emoji), separated
/// by lines holding only `%%`. Every corpus contains each of them at least once so
/// that every seed learns merges for multi-byte UTF-8 and for code.
const FRAGMENTS: &str = include_str!("tokenizer_corpus.txt");

/// Documents generated from the seed; with the fragments this makes roughly 200 kB.
const GENERATED_DOCUMENTS: usize = 900;

/// Invented words per seed; they make the vocabulary differ between seeds.
const INVENTED_WORDS: usize = 240;

// Word lists stay several words to a line (rustfmt would give each its own).
#[rustfmt::skip]
const NAMES: &[&str] = &[
    "Ada", "Bruno", "Chloé", "Dmitri", "Esther", "Farid", "Grace", "Hana", "Ines", "Jonas",
    "Kofi", "Lena", "Mateo", "Nora", "Oskar", "Priya", "Quentin", "Rosa", "Sven", "Tomás",
    "Uma", "Viktor", "Wen", "Yusuf", "Zoë", "Minji", "Haruto", "Aylin",
];

#[rustfmt::skip]
const NOUNS: &[&str] = &[
    "kettle", "river", "window", "garden", "engine", "letter", "bridge", "market", "lamp",
    "model", "token", "teacher", "bicycle", "forest", "harbor", "report", "cloud", "kitchen",
    "signal", "library", "thermometer", "mountain", "station", "village", "notebook",
    "painter", "ladder", "orchard", "tunnel", "compass", "island", "clock", "battery",
    "violin", "blanket", "meadow", "server", "question", "answer", "recipe", "ticket",
    "camera", "planet", "window sill", "memory", "cache", "prompt", "weight", "layer",
    "museum", "farmer", "sailor", "student", "doctor", "festival", "winter", "summer",
    "morning", "evening", "storm", "breeze", "oven", "freezer", "spoon", "basket",
];

#[rustfmt::skip]
const ADJECTIVES: &[&str] = &[
    "quiet", "bright", "old", "warm", "cold", "tiny", "enormous", "careful", "strange",
    "green", "silver", "broken", "gentle", "noisy", "patient", "rapid", "narrow", "wide",
    "heavy", "light", "curious", "ancient", "modern", "honest", "lazy", "clever", "fragile",
    "golden", "hidden", "empty", "crowded", "distant", "familiar", "sudden", "steady",
    "humid", "frozen", "sunny", "cloudy", "quantized", "random", "synthetic",
];

#[rustfmt::skip]
const VERBS: &[&str] = &[
    "found", "carried", "painted", "opened", "repaired", "measured", "borrowed", "watched",
    "followed", "counted", "described", "forgot", "remembered", "cleaned", "built", "sold",
    "moved", "tested", "loaded", "decoded", "sampled", "cached", "trained", "wrote", "read",
    "heated", "cooled", "crossed", "visited", "answered", "ignored", "noticed", "compared",
];

#[rustfmt::skip]
const ADVERBS: &[&str] = &[
    "slowly", "quickly", "carefully", "quietly", "suddenly", "often", "rarely", "gladly",
    "barely", "nearly", "happily", "politely", "twice", "again", "already", "finally",
];

#[rustfmt::skip]
const PLACES: &[&str] = &[
    "Lisbon", "Seoul", "Oslo", "Nairobi", "Montréal", "Kyoto", "Zürich", "Lima", "Hanoi",
    "Reykjavík", "Busan", "Tbilisi", "Porto", "Dakar", "Perth", "Kraków", "São Paulo",
    "the old harbor", "the north station", "the hill", "the lab", "the attic",
];

#[rustfmt::skip]
const UNITS: &[&str] = &[
    "km", "kg", "ms", "MB", "GB", "tokens", "tok/s", "°C", "°F", "%", "meters", "seconds",
    "minutes", "liters", "euros", "dollars", "won",
];

#[rustfmt::skip]
const EMOJI: &[&str] = &[
    "🌡️", "☀️", "❄️", "🔥", "🙂", "🚀", "🤖", "📈", "✅", "🍵", "🌧️", "🎉", "👋", "💡",
];

/// Sentence templates; `{slot}` names a word list or a number form (see `fill`).
const TEMPLATES: &[&str] = &[
    "{name} {verb} the {adj} {noun} near {place}.",
    "The {noun} was {adj}, so {name} {adv} {verb} it.",
    "Did {name} really {verb_base} the {noun}?",
    "In {year}, {count} {noun}s {verb} {place}.",
    "It's {adj} today: {temp} °C in {place} {emoji}",
    "We're {adv} late; the {noun} leaves at {time}.",
    "{name} said, \"I'm not sure the {noun} is {adj}.\"",
    "Prices rose by {pct}% while the {noun} stayed {adj}.",
    "The {invented} of {place} weighs {dec} {unit}.",
    "{Invented} is what they call a {adj} {noun} in {place}.",
    "Why would anyone {verb_base} a {adj} {invented}?",
    "They've {verb} {count} {noun}s since {year}, and they'll do it again.",
    "Note: the {noun} ({invented}) must stay below {temp} °C.",
    "{name} and {name} {verb} the {noun}; it took {count} {unit}.",
    "Step {count}: {verb_base} the {noun}, then wait {count} seconds.",
    "You'd think a {adj} {noun} would be {adj}, but it isn't.",
    "Order #{big} shipped on {date} to {place} {emoji}",
    "Between {time} and {time}, the {noun} {verb} {count} times.",
    "The {adj} {invented} {adv} {verb} the {noun}!",
    "Is the {noun} {adj} or {adj}? {name} can't decide.",
    "{name}'s {noun} reached {dec} {unit} — a new record.",
    "Temperature {dec}, top-p 0.{count}, seed {big}: the {noun} {verb} {adv}.",
    "La température à {place} est de {temp} °C ; le {invented} est {adj}.",
    "Die Temperatur in {place} liegt bei {temp} °C, sagt {name}.",
    "{place}의 온도는 {temp}도입니다. {name} 씨가 {invented}를 샀어요.",
    "{place}の気温は{temp}度です。{name}さんは元気です。",
    "En {place} hace {temp} grados; {name} está {adj}.",
    "В городе {place} сейчас {temp} градусов, {name} дома.",
];

/// SplitMix64: a tiny generator that is reproducible on every platform, so a seed
/// names the same corpus everywhere.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`); the modulo bias is far below anything a corpus
    /// could show.
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

/// The training documents for `seed`: every hand-written fragment, then generated
/// prose, lists and code. Deterministic in `seed`.
pub(crate) fn corpus_documents(seed: u64) -> Vec<String> {
    let mut rng = SplitMix64(seed);
    let invented: Vec<String> = (0..INVENTED_WORDS)
        .map(|_| invented_word(&mut rng))
        .collect();
    let mut documents: Vec<String> = FRAGMENTS
        .split("\n%%\n")
        .map(|fragment| fragment.trim_end_matches('\n').to_string())
        .filter(|fragment| !fragment.is_empty())
        .collect();
    for _ in 0..GENERATED_DOCUMENTS {
        let document = match rng.below(10) {
            0 => code_document(&mut rng, &invented),
            1 => list_document(&mut rng, &invented),
            _ => prose_document(&mut rng, &invented),
        };
        documents.push(document);
    }
    documents
}

/// A pronounceable made-up word of two or three syllables.
fn invented_word(rng: &mut SplitMix64) -> String {
    const ONSETS: &[&str] = &[
        "b", "k", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "kr",
        "st", "tr", "sh", "th", "ch", "pl", "gl", "",
    ];
    const VOWELS: &[&str] = &["a", "e", "i", "o", "u", "ai", "ou", "ea", "y", "io"];
    const CODAS: &[&str] = &["", "", "", "n", "r", "l", "s", "m", "th", "x", "nd", "rt"];
    let syllables = 2 + rng.below(2);
    let mut word = String::new();
    for _ in 0..syllables {
        word.push_str(rng.pick(ONSETS));
        word.push_str(rng.pick(VOWELS));
        word.push_str(rng.pick(CODAS));
    }
    word
}

fn capitalized(word: &str) -> String {
    let mut chars = word.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

/// Fills a sentence template; unknown slots stay as written (none exist today).
fn fill(template: &str, rng: &mut SplitMix64, invented: &[String]) -> String {
    let mut out = String::with_capacity(template.len() + 32);
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return out;
        };
        let slot = &after[..close];
        let invented_word = &invented[rng.below(invented.len())];
        let value = match slot {
            "name" => rng.pick(NAMES).to_string(),
            "noun" => rng.pick(NOUNS).to_string(),
            "adj" => rng.pick(ADJECTIVES).to_string(),
            "verb" => rng.pick(VERBS).to_string(),
            "verb_base" => base_form(rng.pick(VERBS)).to_string(),
            "adv" => rng.pick(ADVERBS).to_string(),
            "place" => rng.pick(PLACES).to_string(),
            "unit" => rng.pick(UNITS).to_string(),
            "emoji" => rng.pick(EMOJI).to_string(),
            "invented" => invented_word.clone(),
            "Invented" => capitalized(invented_word),
            "count" => (2 + rng.below(98)).to_string(),
            "big" => (1000 + rng.below(99_000)).to_string(),
            "pct" => (1 + rng.below(99)).to_string(),
            "temp" => (rng.below(60) as i64 - 20).to_string(),
            "dec" => format!("{}.{:02}", rng.below(500), rng.below(100)),
            "year" => (1950 + rng.below(80)).to_string(),
            "time" => format!("{:02}:{:02}", rng.below(24), rng.below(60)),
            "date" => format!(
                "{}-{:02}-{:02}",
                2000 + rng.below(30),
                1 + rng.below(12),
                1 + rng.below(28)
            ),
            _ => format!("{{{slot}}}"),
        };
        out.push_str(&value);
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

/// A rough present-tense form of a past-tense verb from [`VERBS`]; good enough for
/// a corpus whose only job is to give BPE some structure.
fn base_form(past: &str) -> &str {
    match past {
        "found" => "find",
        "forgot" => "forget",
        "built" => "build",
        "sold" => "sell",
        "wrote" => "write",
        "read" => "read",
        _ => past.strip_suffix("ed").unwrap_or(past),
    }
}

fn sentence(rng: &mut SplitMix64, invented: &[String]) -> String {
    let template = rng.pick(TEMPLATES);
    capitalized(&fill(template, rng, invented))
}

fn prose_document(rng: &mut SplitMix64, invented: &[String]) -> String {
    let sentences = 2 + rng.below(6);
    let mut text = String::new();
    for i in 0..sentences {
        if i > 0 {
            // Mostly one paragraph; sometimes a line or paragraph break, so the
            // newline pieces of the split pattern get trained too.
            text.push_str(match rng.below(8) {
                0 => "\n",
                1 => "\n\n",
                _ => " ",
            });
        }
        text.push_str(&sentence(rng, invented));
    }
    text
}

fn list_document(rng: &mut SplitMix64, invented: &[String]) -> String {
    let items = 3 + rng.below(5);
    let mut text = format!("{}:\n", capitalized(rng.pick(NOUNS)));
    for i in 0..items {
        let line = match rng.below(3) {
            0 => format!(
                "- {} {}",
                invented[rng.below(invented.len())],
                rng.pick(NOUNS)
            ),
            1 => format!(
                "{}. {} ({} {})",
                i + 1,
                rng.pick(ADJECTIVES),
                rng.below(1000),
                rng.pick(UNITS)
            ),
            _ => format!(
                "* {}: {}",
                rng.pick(NAMES),
                fill("{dec} {unit}", rng, invented)
            ),
        };
        text.push_str(&line);
        text.push('\n');
    }
    text
}

fn code_document(rng: &mut SplitMix64, invented: &[String]) -> String {
    let name = &invented[rng.below(invented.len())];
    let arg = &invented[rng.below(invented.len())];
    let n = rng.below(1000);
    match rng.below(4) {
        0 => format!(
            concat!(
                "fn {name}_{noun}({arg}: u32) -> u32 {{\n",
                "    let scale = {n};\n",
                "    {arg} * scale + 1\n",
                "}}\n",
            ),
            noun = rng.pick(NOUNS).replace(' ', "_"),
            // Arguments are named because a format string built by concat! cannot
            // capture variables.
            name = name,
            arg = arg,
            n = n,
        ),
        1 => format!(
            concat!(
                "def {name}({arg}, limit={n}):\n",
                "    if {arg} > limit:\n",
                "        return None\n",
                "    return [{arg}] * 2\n",
            ),
            name = name,
            arg = arg,
            n = n,
        ),
        2 => format!(
            "{{\"{name}\": {n}, \"{arg}\": \"{adj}\", \"ok\": true, \"ratio\": 0.{n}}}\n",
            adj = rng.pick(ADJECTIVES),
        ),
        _ => format!("let {name} = {arg}.iter().filter(|x| x.{arg} >= {n}).count();\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::Tokenizer;

    const SAMPLES: &[&str] = &[
        "Hello, world!",
        "The quick brown fox jumps over the lazy dog. It's 42 °C?!",
        "température 온도 温度 🌡️🚀 naïve café",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "  leading spaces and\ttabs\n\nand blank lines  ",
        "unseen bytes: \u{1F9EC} \u{0915}\u{094D}\u{0937} ẞ",
    ];

    fn write(vocab_size: usize, seed: u64) -> (tempfile::TempDir, SynthTokenizer) {
        let dir = tempfile::tempdir().unwrap();
        let spec = TokenizerSpec { vocab_size, seed };
        let synth = write_tokenizer(&spec, dir.path()).unwrap();
        (dir, synth)
    }

    fn load(dir: &Path) -> Tokenizer {
        Tokenizer::from_file(dir.join("tokenizer.json")).unwrap()
    }

    #[test]
    fn round_trips_ascii_and_non_ascii_text() {
        let (dir, _) = write(2048, 1);
        let tokenizer = load(dir.path());
        for text in SAMPLES {
            let ids = tokenizer.encode(*text, false).unwrap().get_ids().to_vec();
            assert_eq!(tokenizer.decode(&ids, true).unwrap(), *text);
            let with_bos = tokenizer.encode(*text, true).unwrap().get_ids().to_vec();
            assert_eq!(tokenizer.decode(&with_bos, true).unwrap(), *text);
        }
    }

    #[test]
    fn merges_make_text_shorter_than_its_bytes() {
        let (dir, _) = write(2048, 1);
        let tokenizer = load(dir.path());
        let text = "The quiet river was warm, so Ada slowly opened the window.";
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        assert!(
            ids.len() * 3 < text.len(),
            "{} tokens for {} bytes",
            ids.len(),
            text.len()
        );
    }

    #[test]
    fn bos_is_prepended_only_with_special_tokens() {
        let (dir, synth) = write(2048, 1);
        let tokenizer = load(dir.path());
        let with = tokenizer.encode("Hello", true).unwrap().get_ids().to_vec();
        let without = tokenizer.encode("Hello", false).unwrap().get_ids().to_vec();
        assert_eq!(with[0], synth.bos_token_id);
        assert_eq!(&with[1..], &without[..]);
        assert!(!without.contains(&synth.bos_token_id));
    }

    #[test]
    fn special_tokens_are_single_ids_after_the_bpe_vocabulary() {
        let (dir, synth) = write(2048, 1);
        let tokenizer = load(dir.path());
        let first = (synth.vocab_size - SPECIAL_TOKENS.len()) as u32;
        for (offset, content) in SPECIAL_TOKENS.iter().enumerate() {
            let ids = tokenizer
                .encode(*content, false)
                .unwrap()
                .get_ids()
                .to_vec();
            assert_eq!(ids, vec![first + offset as u32], "{content}");
        }
        assert_eq!(synth.bos_token_id, first);
        assert_eq!(synth.eos_token_ids, vec![first + 1, first + 4]);
        assert_eq!(synth.pad_token_id, first + 5);

        let turn = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
        let ids = tokenizer.encode(turn, false).unwrap().get_ids().to_vec();
        assert_eq!(ids[0], first + 2);
        assert_eq!(*ids.last().unwrap(), first + 4);
        assert!(ids.contains(&(first + 3)));
        // Special tokens vanish when decoding with skip_special_tokens.
        assert_eq!(tokenizer.decode(&ids, true).unwrap(), "user\n\nHi");
        assert_eq!(tokenizer.decode(&ids, false).unwrap(), turn);
    }

    #[test]
    fn same_seed_gives_byte_identical_files() {
        let (a, _) = write(2048, 7);
        let (b, _) = write(2048, 7);
        for file in ["tokenizer.json", "tokenizer_config.json"] {
            let left = std::fs::read(a.path().join(file)).unwrap();
            let right = std::fs::read(b.path().join(file)).unwrap();
            assert!(left == right, "{file} differs between two runs with seed 7");
        }
    }

    #[test]
    fn different_seeds_give_different_tokenizers() {
        let (a, synth_a) = write(2048, 1);
        let (b, synth_b) = write(2048, 2);
        let left = std::fs::read(a.path().join("tokenizer.json")).unwrap();
        let right = std::fs::read(b.path().join("tokenizer.json")).unwrap();
        assert!(left != right);
        // Same layout all the same.
        assert_eq!(synth_a, synth_b);
    }

    #[test]
    fn vocab_size_is_exact_while_the_corpus_has_pairs_left() {
        for requested in [MIN_VOCAB_SIZE, 300, 2048, 4096] {
            let (dir, synth) = write(requested, 3);
            assert_eq!(synth.vocab_size, requested);
            assert_eq!(load(dir.path()).get_vocab_size(true), requested);
        }
    }

    #[test]
    fn a_huge_request_stops_where_the_corpus_ends() {
        let (dir, synth) = write(128_256, 3);
        assert!(synth.vocab_size < 128_256);
        assert!(synth.vocab_size > 4096, "only {} tokens", synth.vocab_size);
        assert_eq!(load(dir.path()).get_vocab_size(true), synth.vocab_size);
        assert_eq!(
            synth.bos_token_id as usize,
            synth.vocab_size - SPECIAL_TOKENS.len()
        );
    }

    #[test]
    fn too_small_a_vocabulary_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let spec = TokenizerSpec {
            vocab_size: MIN_VOCAB_SIZE - 1,
            seed: 0,
        };
        let err = write_tokenizer(&spec, dir.path()).unwrap_err();
        let minimum = match err {
            TokenizerSynthError::VocabTooSmall { minimum, .. } => minimum,
            ref other => panic!("unexpected error {other:?}"),
        };
        assert_eq!(minimum, MIN_VOCAB_SIZE);
        assert!(err.to_string().contains("at least 262"), "{err}");
        assert!(!dir.path().join("tokenizer.json").exists());
    }

    #[test]
    fn tokenizer_config_names_the_special_tokens_and_has_the_chat_template() {
        let (dir, synth) = write(2048, 1);
        let text = std::fs::read_to_string(dir.path().join("tokenizer_config.json")).unwrap();
        let config: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(config["bos_token"], BEGIN_OF_TEXT);
        assert_eq!(config["eos_token"], EOT_ID);
        assert_eq!(config["pad_token"], PAD);
        assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
        assert_eq!(config["clean_up_tokenization_spaces"], false);
        assert_eq!(config["model_max_length"], MODEL_MAX_LENGTH);

        let decoder = config["added_tokens_decoder"].as_object().unwrap();
        let keys: Vec<&String> = decoder.keys().collect();
        let first = synth.bos_token_id as usize;
        let expected: Vec<String> = (first..first + SPECIAL_TOKENS.len())
            .map(|id| id.to_string())
            .collect();
        assert_eq!(keys, expected.iter().collect::<Vec<_>>());
        let eot = &decoder[&(first + 4).to_string()];
        assert_eq!(eot["content"], EOT_ID);
        assert_eq!(eot["special"], true);
        for field in ["lstrip", "rstrip", "normalized", "single_word"] {
            assert_eq!(eot[field], false, "{field}");
        }

        let template = config["chat_template"].as_str().unwrap();
        for needle in [
            START_HEADER_ID,
            END_HEADER_ID,
            EOT_ID,
            "bos_token",
            "add_generation_prompt",
        ] {
            assert!(template.contains(needle), "chat template lacks {needle}");
        }
    }

    #[test]
    fn corpus_is_deterministic_and_covers_several_scripts() {
        let a = corpus_documents(11);
        assert_eq!(a, corpus_documents(11));
        assert_ne!(a, corpus_documents(12));
        let all = a.concat();
        for needle in [
            "température",
            "온도",
            "温度",
            "🌡️",
            "fn ",
            "def ",
            "\n\n",
            "\t",
            "'s",
        ] {
            assert!(all.contains(needle), "corpus lacks {needle:?}");
        }
        for special in SPECIAL_TOKENS {
            assert!(!all.contains(special), "corpus contains {special}");
        }
        // Every template slot was filled.
        assert!(!all.contains("{name}") && !all.contains("{noun}"));
    }

    /// Writes a tokenizer and the ids Rust gives for a few strings, then runs
    /// `tests/python/check_tokenizer.py` (transformers and mlx-lm) on them with
    /// `ONDO_PYTHON`, else the project venv's Python. Without either it fails
    /// and says how to get one; ONDO_SKIP_PYTHON marks it ignored instead
    /// (build.rs, and tests/common/mod.rs for the other Python comparisons).
    #[test]
    #[cfg_attr(ondo_skip_python, ignore = "ONDO_SKIP_PYTHON: no Python with mlx-lm")]
    fn python_tokenizers_agree() {
        let python = std::env::var_os("ONDO_PYTHON")
            .filter(|p| !p.is_empty())
            .map(std::path::PathBuf::from)
            .or_else(|| {
                let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
                venv.is_file().then_some(venv)
            })
            .unwrap_or_else(|| {
                panic!(
                    "this test compares with Python and there is none: run `make setup`, or set \
                     ONDO_PYTHON to a Python with transformers and mlx-lm (ONDO_SKIP_PYTHON=1 \
                     reports it as ignored unless ONDO_REQUIRE_PYTHON is set)"
                )
            });
        let (dir, _) = write(2048, 5);
        let tokenizer = load(dir.path());
        let mut expected = serde_json::Map::new();
        for text in SAMPLES
            .iter()
            .chain(["<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"].iter())
        {
            let ids = tokenizer.encode(*text, true).unwrap().get_ids().to_vec();
            expected.insert(text.to_string(), serde_json::json!(ids));
        }
        let expect_path = dir.path().join("expected_ids.json");
        std::fs::write(&expect_path, serde_json::to_string(&expected).unwrap()).unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/check_tokenizer.py");
        let output = std::process::Command::new(python)
            .arg(&script)
            .arg(dir.path())
            .arg("--expect-json")
            .arg(&expect_path)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "check_tokenizer.py failed ({}):\n{stdout}\n{stderr}",
            output.status
        );
    }
}
