//! Which KV cache an API request continues. Clients of a chat API send the
//! whole conversation every time and no conversation id, so the server
//! keeps, per model, the prompts of a few recent conversations and gives a
//! request the id of the one it continues: the engine then prefills only
//! what the cache does not hold (it keeps the common token prefix). A
//! request that continues none gets a new conversation while there is room,
//! else the one it shares the most with.

use std::collections::{HashMap, VecDeque};

/// Conversations remembered per model (each holds a KV cache in the engine).
pub(crate) const CONVERSATIONS_PER_MODEL: usize = 8;

/// A prompt as a list of parts compared in order: for a chat, the tools
/// and template options, then one part per message; for raw text, the text.
pub(crate) type PromptParts = Vec<String>;

struct Remembered {
    id: String,
    parts: PromptParts,
}

/// The recent conversations of every model, most recent first.
#[derive(Default)]
pub(crate) struct ConversationIndex {
    next_id: u64,
    by_model: HashMap<String, VecDeque<Remembered>>,
}

impl ConversationIndex {
    /// The conversation id for a request to `model` with `parts`.
    pub fn conversation_for(&mut self, model: &str, parts: PromptParts) -> String {
        let recent = self.by_model.entry(model.to_owned()).or_default();
        let continued = recent.iter().position(|r| continues(&parts, &r.parts));
        let chosen = match continued {
            Some(at) => at,
            None if recent.len() < CONVERSATIONS_PER_MODEL => {
                self.next_id += 1;
                recent.push_front(Remembered {
                    id: format!("api-{}", self.next_id),
                    parts: Vec::new(),
                });
                0
            }
            // Full: reuse the one it shares most with (the least recently
            // used among equals); its cache is cut to what they share.
            None => {
                let mut best = recent.len() - 1;
                let mut best_shared = 0;
                for (at, remembered) in recent.iter().enumerate().rev() {
                    let shared = shared_chars(&parts, &remembered.parts);
                    if shared > best_shared {
                        (best, best_shared) = (at, shared);
                    }
                }
                best
            }
        };
        let mut remembered = recent.remove(chosen).unwrap_or_else(|| Remembered {
            id: String::new(),
            parts: Vec::new(),
        });
        remembered.parts = parts;
        let id = remembered.id.clone();
        recent.push_front(remembered);
        id
    }
}

/// Whether `new` starts with all of `old` (the last of `old`'s parts may
/// have grown: raw text that continues).
fn continues(new: &[String], old: &[String]) -> bool {
    let Some((old_last, old_rest)) = old.split_last() else {
        return false;
    };
    new.len() >= old.len()
        && new[..old_rest.len()] == *old_rest
        && new[old_rest.len()].starts_with(old_last.as_str())
}

/// How many characters two prompts share from the start.
fn shared_chars(a: &[String], b: &[String]) -> usize {
    let mut shared = 0;
    for (x, y) in a.iter().zip(b) {
        if x == y {
            shared += x.len();
        } else {
            shared += x
                .chars()
                .zip(y.chars())
                .take_while(|(p, q)| p == q)
                .map(|(p, _)| p.len_utf8())
                .sum::<usize>();
            break;
        }
    }
    shared
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(items: &[&str]) -> PromptParts {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_follow_up_continues_its_conversation() {
        let mut index = ConversationIndex::default();
        let a = index.conversation_for("tiny", parts(&["tools", "u: hi"]));
        let b = index.conversation_for("tiny", parts(&["tools", "u: other"]));
        assert_ne!(a, b);
        let a2 = index.conversation_for("tiny", parts(&["tools", "u: hi", "a: yo", "u: more"]));
        assert_eq!(a2, a);
        let b2 = index.conversation_for("tiny", parts(&["tools", "u: other", "a: x", "u: y"]));
        assert_eq!(b2, b);
        // The same prompt again (a retry) continues too.
        assert_eq!(
            index.conversation_for("tiny", parts(&["tools", "u: other", "a: x", "u: y"])),
            b
        );
        // Raw text that grows continues its conversation.
        let raw = index.conversation_for("tiny", parts(&["raw", "Once upon"]));
        assert_eq!(
            index.conversation_for("tiny", parts(&["raw", "Once upon a time"])),
            raw
        );
        // Another model has conversations of its own.
        assert_ne!(
            index.conversation_for("other", parts(&["tools", "u: hi"])),
            a
        );
    }

    #[test]
    fn when_full_the_closest_conversation_is_reused() {
        let mut index = ConversationIndex::default();
        let ids: Vec<String> = (0..CONVERSATIONS_PER_MODEL)
            .map(|n| index.conversation_for("m", parts(&["sys", &format!("u: question {n}")])))
            .collect();
        let unique: std::collections::HashSet<_> = ids.iter().collect();
        assert_eq!(unique.len(), CONVERSATIONS_PER_MODEL);
        // Shares the most with conversation 3 ("u: question 3" vs "u: question 35").
        let reused = index.conversation_for("m", parts(&["sys", "u: question 35"]));
        assert_eq!(reused, ids[3]);
        // Sharing nothing: the least recently used goes.
        let reused = index.conversation_for("m", parts(&["other"]));
        assert_eq!(reused, ids[0]);
    }
}
