//! Is Ondo computing what mlx-lm computes? Greedy decoding of the same
//! prompt on the same weights must give the same tokens, and on the CPU it
//! does, so any difference there is a bug. A GPU is different: its reduction
//! kernels need not add in the same order twice, and at long prompts mlx-lm
//! itself can pick a different token from one run to the next where two
//! logits are nearly tied. So when Ondo's tokens differ, the benchmark asks
//! mlx-lm for the same prompt again: if mlx-lm repeats itself, the
//! difference is Ondo's (a bug); if it does not, there is no verdict, only
//! where each side first departed.
//!
//! Ondo's own CUDA matrix-vector kernel (`engine::backend`) sums
//! in another order than MLX's by design, so with it greedy tokens may part
//! at any near-tie. There the benchmark asks mlx-lm how near: at the first
//! differing token it scores both candidates with the model in float32, and
//! measures how far rounding in the model's own dtype moves a logit at that
//! position. A departure where float32 prefers Ondo's token, or ranks
//! mlx-lm's above it by no more than `NEAR_TIE_ROUNDINGS` times that
//! rounding, is a near tie; one beyond it is a bug in the kernel.
//!
//! A model with routed experts (qwen3_moe, gpt-oss) needs one more
//! question. Each of its expert blocks picks the top k of its router's
//! scores, a choice that jumps where two scores cross: a rounding-level
//! difference in a router's input can swap an expert, and the logits after
//! it then move far more than rounding moves a logit. So mlx-lm also
//! measures, over the positions where Ondo's kernel ran (the last prompt
//! position to the departure), the expert choice nearest to a tie: the
//! float32 gap between the k-th and (k+1)-th router score against how far
//! rounding moves that layer's router scores (`RoutingTie`). A departure is
//! a near tie when either the logits or that expert choice lie within
//! `NEAR_TIE_ROUNDINGS` roundings of a tie, and the report says which.

use serde::{Deserialize, Serialize};

/// How one measured repetition compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundCheck {
    /// Ondo's tokens are mlx-lm's.
    Same,
    /// mlx-lm gave the same tokens twice and Ondo's part from them at
    /// `ondo_departs_at` (a token index).
    Different { ondo_departs_at: usize },
    /// mlx-lm's two runs part at `reference_departs_at`; Ondo's part from
    /// mlx-lm's first run at `ondo_departs_at`.
    ReferenceUnstable {
        reference_departs_at: usize,
        ondo_departs_at: usize,
    },
}

/// The first index where `a` and `b` differ (a shorter one ends there), or
/// `None` when they are equal.
pub fn first_departure(a: &[u32], b: &[u32]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() == b.len() => None,
        None => Some(a.len().min(b.len())),
    }
}

/// Judges one repetition from Ondo's tokens, mlx-lm's, and (only asked
/// for when the first two differ) mlx-lm's on the same prompt again.
pub fn judge(ondo: &[u32], reference: &[u32], reference_again: Option<&[u32]>) -> RoundCheck {
    let Some(ondo_departs_at) = first_departure(ondo, reference) else {
        return RoundCheck::Same;
    };
    match reference_again.and_then(|again| first_departure(reference, again)) {
        Some(reference_departs_at) => RoundCheck::ReferenceUnstable {
            reference_departs_at,
            ondo_departs_at,
        },
        None => RoundCheck::Different { ondo_departs_at },
    }
}

/// How far apart a departure's two candidate tokens are: `gap_f32` within
/// this many times mlx-lm's own rounding is a near tie. Ondo's kernel is off
/// from float32 by about half what MLX's is (`scripts/gpu-matvec.py
/// --check`), and the gap of two logits carries both sides' errors, so a
/// kernel that rounds as well as MLX stays within a few roundings of it.
pub const NEAR_TIE_ROUNDINGS: f64 = 4.0;

/// What a block with routed experts ranks to choose them: mlx-lm's
/// qwen3_moe ranks a softmax of its router's logits (rounded to the model's
/// dtype, so two can tie), gpt-oss the logits themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum RouterScores {
    Logits,
    Softmax,
    Sigmoid,
}

impl RouterScores {
    fn name(self) -> &'static str {
        match self {
            Self::Logits => "router logits",
            Self::Softmax => "softmax probabilities",
            Self::Sigmoid => "sigmoid scores",
        }
    }
}

/// The expert choice nearest to a tie on the way to a departure, from
/// mlx-lm with the model in float32 and in its own dtype, over the positions
/// where Ondo's own kernel computed anything: the last prompt position (the
/// step that chose token 0) to the departure's. Ondo prefills the rest of
/// the prompt with MLX's own kernels (`engine::generate`, `TokenSteps`: the
/// cache takes all but the last prompt token in chunks of several
/// positions, and Ondo's kernel takes only one-position products).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct RoutingTie {
    /// The decoder layer whose expert block it was.
    pub layer: usize,
    /// The position in the sequence (prompt, then generated tokens, from 0)
    /// whose step made the choice.
    pub position: usize,
    /// The generated token that step chose (0: the step fed the last prompt
    /// token).
    pub token: usize,
    /// Experts the block picks, and of how many.
    pub top_k: usize,
    pub experts: usize,
    /// What the block ranks.
    pub ranks: RouterScores,
    /// The model in float32: the k-th best score minus the (k+1)-th there.
    pub margin_f32: f64,
    /// Root mean square of that layer's scores in the model's own dtype
    /// minus float32's over those positions and every expert: how far
    /// rounding moves a router score there.
    pub rounding: f64,
}

impl RoutingTie {
    /// Whether rounding could have swapped this expert choice: its float32
    /// margin is within `NEAR_TIE_ROUNDINGS` roundings.
    pub fn is_near_tie(&self) -> bool {
        self.margin_f32 <= NEAR_TIE_ROUNDINGS * self.rounding
    }

    /// How near a tie, in words: "2.5 roundings from a tie".
    fn closeness(&self) -> String {
        if self.rounding > 0.0 {
            format!(
                "{:.1} roundings from a tie",
                self.margin_f32 / self.rounding
            )
        } else if self.margin_f32 <= 0.0 {
            "an exact tie".to_owned()
        } else {
            format!("{:.4} from a tie where nothing rounds", self.margin_f32)
        }
    }

    fn describe(&self) -> String {
        format!(
            "an expert choice at layer {}, position {} (the step choosing token {}) was {} \
             (top {} of {} {}, float32 margin {:.4}, rounding {:.4})",
            self.layer,
            self.position,
            self.token,
            self.closeness(),
            self.top_k,
            self.experts,
            self.ranks.name(),
            self.margin_f32,
            self.rounding
        )
    }
}

/// What puts a departure within rounding of a tie (`TieScore::near_tie`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum TieCause {
    /// The two candidates' float32 logits: float32 prefers Ondo's token, or
    /// ranks mlx-lm's above it within `NEAR_TIE_ROUNDINGS` roundings.
    Logits,
    /// An expert choice on the way (`TieScore::routing`) within
    /// `NEAR_TIE_ROUNDINGS` roundings of a tie.
    Routing,
}

/// mlx-lm's scores for the two tokens at the first position where Ondo's
/// greedy token left mlx-lm's (`MlxLmPeer::score`), and for a model with
/// routed experts the expert choice nearest to a tie on the way there.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct TieScore {
    pub reference_token: u32,
    pub ondo_token: u32,
    /// The model in float32: mlx-lm's token's logit minus Ondo's (negative
    /// where float32 prefers Ondo's token).
    pub gap_f32: f64,
    /// Root mean square of the model's own logits minus float32's there:
    /// how far rounding in its dtype moves a logit.
    pub rounding: f64,
    /// The expert choice nearest to a tie on the way; `None` for a model
    /// without routed experts, or in reports written before it was asked.
    #[serde(default)]
    pub routing: Option<RoutingTie>,
    /// What explains the departure as rounding (`near_tie`), written with
    /// the score for readers of the JSON; `None` where nothing does.
    #[serde(default)]
    pub explained_by: Option<TieCause>,
}

impl TieScore {
    /// A departure's scores, with what explains it as rounding.
    pub fn new(
        reference_token: u32,
        ondo_token: u32,
        gap_f32: f64,
        rounding: f64,
        routing: Option<RoutingTie>,
    ) -> Self {
        let mut score = Self {
            reference_token,
            ondo_token,
            gap_f32,
            rounding,
            routing,
            explained_by: None,
        };
        score.explained_by = score.near_tie();
        score
    }

    /// What makes the departure a near tie, judged from the numbers (a
    /// report written before `explained_by` existed is judged the same):
    /// the logits when float32 prefers Ondo's token or ranks the two within
    /// `NEAR_TIE_ROUNDINGS` roundings, else an expert choice on the way
    /// within as many roundings of its own; `None` when neither is.
    pub fn near_tie(&self) -> Option<TieCause> {
        if self.gap_f32 <= NEAR_TIE_ROUNDINGS * self.rounding {
            Some(TieCause::Logits)
        } else if self.routing.is_some_and(|r| r.is_near_tie()) {
            Some(TieCause::Routing)
        } else {
            None
        }
    }

    /// Whether rounding explains the departure (`near_tie`).
    pub fn is_near_tie(&self) -> bool {
        self.near_tie().is_some()
    }

    fn describe(&self) -> String {
        if self.gap_f32 <= 0.0 {
            return format!(
                "float32 ranks Ondo's token {} at or above mlx-lm's {} (by {:.4})",
                self.ondo_token, self.reference_token, -self.gap_f32
            );
        }
        let logits = format!(
            "float32 ranks mlx-lm's token {} above Ondo's {} by {:.4}, {:.1}x the {:.4} \
             that rounding moves a logit there",
            self.reference_token,
            self.ondo_token,
            self.gap_f32,
            self.gap_f32 / self.rounding.max(f64::MIN_POSITIVE),
            self.rounding
        );
        match (self.near_tie(), self.routing) {
            (Some(TieCause::Routing), Some(routing)) => {
                format!("{logits}, but {}", routing.describe())
            }
            (None, Some(routing)) => format!(
                "{logits}, and the expert choice nearest to a tie on the way (layer {}, \
                 position {}) was {}",
                routing.layer,
                routing.position,
                routing.closeness()
            ),
            _ => logits,
        }
    }
}

/// A repetition whose tokens differed, with where.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct Departure {
    pub prompt_tokens: usize,
    pub repetition: usize,
    /// The first token index where Ondo's tokens leave mlx-lm's (first run).
    pub ondo_departs_at: usize,
    /// Where mlx-lm's second run on the same prompt left its first; `None`
    /// when mlx-lm repeated itself exactly (then the difference is Ondo's).
    pub reference_departs_at: Option<usize>,
    /// mlx-lm's scores for the two tokens where Ondo's departed; `None` in
    /// reports written before it was asked, or where one side simply ended.
    #[serde(default)]
    pub score: Option<TieScore>,
}

/// The comparison's token check over every measured repetition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct TokenCheck {
    /// Measured repetitions compared.
    pub rounds: usize,
    /// The repetitions whose tokens differed.
    pub departures: Vec<Departure>,
    /// Ondo decoded with its own CUDA matrix-vector kernel
    /// (`engine::backend`), whose sums round differently from
    /// MLX's: its tokens may part from mlx-lm's at any near-tie, so a
    /// difference is no verdict.
    #[serde(default)]
    pub own_cuda_kernel: bool,
}

/// What the check concludes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
#[serde(rename_all = "snake_case")]
pub enum TokenVerdict {
    /// The same tokens in every measured repetition.
    Identical,
    /// At least once mlx-lm repeated itself and Ondo differed: a bug.
    Different,
    /// Every difference came where mlx-lm disagreed with itself too: no
    /// verdict (a GPU's non-deterministic reductions at a near-tie).
    ReferenceUnstable,
    /// Tokens differed while Ondo ran its own CUDA matrix-vector kernel,
    /// which rounds differently from mlx-lm's by design, and a difference
    /// was not scored (a report from before scoring): no verdict.
    OwnKernel,
    /// With Ondo's own CUDA kernel, tokens parted from mlx-lm's only at
    /// near-ties (`TieScore::is_near_tie`): what rounding explains.
    NearTies,
}

impl TokenCheck {
    /// Adds one repetition's result, with mlx-lm's scores for the tokens
    /// where Ondo's departed when it was asked.
    pub fn add(
        &mut self,
        prompt_tokens: usize,
        repetition: usize,
        check: RoundCheck,
        score: Option<TieScore>,
    ) {
        self.rounds += 1;
        let (ondo_departs_at, reference_departs_at) = match check {
            RoundCheck::Same => return,
            RoundCheck::Different { ondo_departs_at } => (ondo_departs_at, None),
            RoundCheck::ReferenceUnstable {
                reference_departs_at,
                ondo_departs_at,
            } => (ondo_departs_at, Some(reference_departs_at)),
        };
        self.departures.push(Departure {
            prompt_tokens,
            repetition,
            ondo_departs_at,
            reference_departs_at,
            score,
        });
    }

    /// Whether mlx-lm disagreed with itself at this prompt length in any
    /// repetition. Two runs that agree once do not make a device
    /// deterministic: on the H200, at a prompt of 2048, mlx-lm repeated
    /// itself in one repetition while Ondo's run departed late (token 83),
    /// and disagreed with itself in the four others. A length where the
    /// reference ever wavers gets no verdict.
    fn reference_wavers_at(&self, prompt_tokens: usize) -> bool {
        self.departures
            .iter()
            .any(|d| d.prompt_tokens == prompt_tokens && d.reference_departs_at.is_some())
    }

    /// The first difference that is Ondo's. With Ondo's own kernel: one
    /// that mlx-lm's scores put beyond a near tie. Without: mlx-lm repeated
    /// itself there, and never wavered at that prompt length.
    fn first_bug(&self) -> Option<&Departure> {
        if self.own_cuda_kernel {
            return self
                .departures
                .iter()
                .find(|d| d.score.is_some_and(|s| !s.is_near_tie()));
        }
        self.departures.iter().find(|d| {
            d.reference_departs_at.is_none() && !self.reference_wavers_at(d.prompt_tokens)
        })
    }

    pub fn verdict(&self) -> TokenVerdict {
        if self.departures.is_empty() {
            TokenVerdict::Identical
        } else if self.first_bug().is_some() {
            TokenVerdict::Different
        } else if !self.own_cuda_kernel {
            TokenVerdict::ReferenceUnstable
        } else if self.departures.iter().all(|d| d.score.is_some()) {
            TokenVerdict::NearTies
        } else {
            TokenVerdict::OwnKernel
        }
    }

    /// One line for the comparison's table.
    pub fn describe(&self) -> String {
        if self.departures.is_empty() {
            return format!(
                "tokens: identical to mlx-lm's in every measured run ({})",
                self.rounds
            );
        }
        if let Some(d) = self.first_bug() {
            let why = match d.score {
                Some(score) if self.own_cuda_kernel => format!(
                    "{}, more than rounding explains ({NEAR_TIE_ROUNDINGS}x): a bug in Ondo's \
                     own CUDA kernel",
                    score.describe()
                ),
                _ => "where mlx-lm repeats itself: a correctness bug".to_owned(),
            };
            return format!(
                "tokens: DIFFERENT from mlx-lm's at prompt {} (repetition {}) from token {}, {why}",
                d.prompt_tokens, d.repetition, d.ondo_departs_at
            );
        }
        let parts: Vec<String> = self
            .departures
            .iter()
            .map(|d| {
                let at = match d.reference_departs_at {
                    Some(at) => format!(
                        "prompt {} rep {}: mlx-lm's two runs part at token {at}, Ondo's from \
                         mlx-lm's first at token {}",
                        d.prompt_tokens, d.repetition, d.ondo_departs_at
                    ),
                    None => format!(
                        "prompt {} rep {}: mlx-lm repeated itself, Ondo's departs at token {}",
                        d.prompt_tokens, d.repetition, d.ondo_departs_at
                    ),
                };
                match d.score {
                    Some(score) => format!("{at} ({})", score.describe()),
                    None => at,
                }
            })
            .collect();
        let (what, why) = match self.verdict() {
            TokenVerdict::NearTies => (
                "near ties only".to_owned(),
                "Ondo ran its own CUDA matrix-vector kernel, which rounds differently from \
                 MLX's (ONDO_CUDA_MATVEC=0 turns it off), and every difference came where \
                 rounding explains it",
            ),
            TokenVerdict::OwnKernel => (
                "no verdict".to_owned(),
                "Ondo ran its own CUDA matrix-vector kernel, which rounds differently from \
                 MLX's (ONDO_CUDA_MATVEC=0 turns it off), so greedy tokens part at near-ties, \
                 and the difference was not scored",
            ),
            _ => (
                "no verdict".to_owned(),
                "mlx-lm disagrees with itself there (near-tied logits on this device)",
            ),
        };
        format!(
            "tokens: {what} in {} of {} runs, {why}; {}",
            self.departures.len(),
            self.rounds,
            parts.join("; ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departures_are_the_first_differing_index() {
        assert_eq!(first_departure(&[1, 2, 3], &[1, 2, 3]), None);
        assert_eq!(first_departure(&[1, 2, 3], &[1, 9, 3]), Some(1));
        assert_eq!(first_departure(&[1, 2], &[1, 2, 3]), Some(2));
        assert_eq!(first_departure(&[], &[]), None);
    }

    #[test]
    fn a_difference_where_the_reference_repeats_itself_is_a_bug() {
        let check = judge(&[1, 2, 7], &[1, 2, 3], Some(&[1, 2, 3]));
        assert_eq!(check, RoundCheck::Different { ondo_departs_at: 2 });
        let mut all = TokenCheck::default();
        all.add(128, 0, RoundCheck::Same, None);
        all.add(2048, 1, check, None);
        assert_eq!(all.verdict(), TokenVerdict::Different);
        assert!(all.describe().contains("a correctness bug"));
        assert!(all.describe().contains("prompt 2048"));
    }

    #[test]
    fn with_ondos_own_cuda_kernel_a_difference_is_no_verdict_but_is_shown() {
        let mut all = TokenCheck {
            own_cuda_kernel: true,
            ..TokenCheck::default()
        };
        all.add(128, 0, RoundCheck::Same, None);
        all.add(128, 1, RoundCheck::Different { ondo_departs_at: 4 }, None);
        assert_eq!(all.verdict(), TokenVerdict::OwnKernel);
        let line = all.describe();
        assert!(line.contains("no verdict in 1 of 2"), "{line}");
        assert!(line.contains("ONDO_CUDA_MATVEC=0"), "{line}");
        assert!(line.contains("departs at token 4"), "{line}");
        assert!(!line.contains("bug"), "{line}");
        // Identical tokens are still identical with the kernel.
        let same = TokenCheck {
            own_cuda_kernel: true,
            rounds: 1,
            departures: Vec::new(),
        };
        assert_eq!(same.verdict(), TokenVerdict::Identical);
        // A report written before the field existed reads as without it.
        let old: TokenCheck = serde_json::from_str(r#"{"rounds": 1, "departures": []}"#).unwrap();
        assert!(!old.own_cuda_kernel);
    }

    fn scored(gap_f32: f64, rounding: f64) -> Option<TieScore> {
        Some(TieScore::new(7, 9, gap_f32, rounding, None))
    }

    /// A qwen3_moe-like expert choice (top 2 of 8 softmax probabilities) at
    /// layer 3 while choosing token 2 after a 128-token prompt, its float32
    /// margin `margin_f32` against a rounding of 0.001.
    fn routed(margin_f32: f64) -> RoutingTie {
        RoutingTie {
            layer: 3,
            position: 129,
            token: 2,
            top_k: 2,
            experts: 8,
            ranks: RouterScores::Softmax,
            margin_f32,
            rounding: 0.001,
        }
    }

    /// A check with Ondo's own kernel where repetition `repetition` at
    /// prompt 128 departed at token 5, float32 ranking mlx-lm's token above
    /// Ondo's by 3 roundings.
    fn own_kernel_three_roundings_apart(repetition: usize) -> TokenCheck {
        let mut all = TokenCheck {
            own_cuda_kernel: true,
            ..TokenCheck::default()
        };
        all.add(
            128,
            repetition,
            RoundCheck::Different { ondo_departs_at: 5 },
            scored(0.03, 0.01),
        );
        all
    }

    #[test]
    fn with_the_own_kernel_a_departure_within_rounding_is_a_near_tie() {
        let mut all = own_kernel_three_roundings_apart(1);
        all.add(128, 0, RoundCheck::Same, None);
        // float32 prefers Ondo's token outright.
        all.add(
            2048,
            0,
            RoundCheck::Different { ondo_departs_at: 2 },
            scored(-0.2, 0.01),
        );
        assert_eq!(all.verdict(), TokenVerdict::NearTies);
        let line = all.describe();
        assert!(line.contains("near ties only in 2 of 3"), "{line}");
        assert!(line.contains("by 0.0300, 3.0x the 0.0100"), "{line}");
        assert!(
            line.contains("float32 ranks Ondo's token 9 at or above"),
            "{line}"
        );
        assert!(!line.contains("bug"), "{line}");
    }

    #[test]
    fn with_the_own_kernel_a_departure_beyond_rounding_is_a_bug() {
        let mut all = own_kernel_three_roundings_apart(0);
        // Even where mlx-lm wavers: float32 says which token is right.
        all.add(
            2048,
            3,
            RoundCheck::ReferenceUnstable {
                reference_departs_at: 1,
                ondo_departs_at: 0,
            },
            scored(0.5, 0.01),
        );
        assert_eq!(all.verdict(), TokenVerdict::Different);
        let line = all.describe();
        assert!(
            line.contains("at prompt 2048 (repetition 3) from token 0"),
            "{line}"
        );
        assert!(line.contains("a bug in Ondo's own CUDA kernel"), "{line}");
        // A float32 model rounds nothing: any gap is beyond rounding.
        assert!(!scored(1e-6, 0.0).unwrap().is_near_tie());
        assert!(scored(0.0, 0.0).unwrap().is_near_tie());
    }

    #[test]
    fn without_the_own_kernel_a_near_tie_is_still_a_bug_where_mlx_lm_repeats_itself() {
        let mut all = TokenCheck::default();
        all.add(
            128,
            0,
            RoundCheck::Different { ondo_departs_at: 5 },
            scored(0.001, 0.01),
        );
        assert_eq!(all.verdict(), TokenVerdict::Different);
        assert!(all.describe().contains("a correctness bug"));
    }

    #[test]
    fn a_difference_where_the_reference_disagrees_with_itself_is_no_verdict() {
        let check = judge(&[5, 6, 7], &[5, 8, 9], Some(&[5, 6, 7]));
        assert_eq!(
            check,
            RoundCheck::ReferenceUnstable {
                reference_departs_at: 1,
                ondo_departs_at: 1
            }
        );
        let mut all = TokenCheck::default();
        all.add(2048, 0, check, None);
        all.add(128, 0, RoundCheck::Same, None);
        assert_eq!(all.verdict(), TokenVerdict::ReferenceUnstable);
        let line = all.describe();
        assert!(line.contains("no verdict in 1 of 2"), "{line}");
        assert!(!line.contains("bug"), "{line}");
        // Where mlx-lm wavered at that length, a repetition in which it
        // happened to repeat itself is no proof against Ondo.
        all.add(
            2048,
            1,
            RoundCheck::Different {
                ondo_departs_at: 83,
            },
            None,
        );
        assert_eq!(all.verdict(), TokenVerdict::ReferenceUnstable);
        assert!(
            all.describe()
                .contains("mlx-lm repeated itself, Ondo's departs at token 83")
        );
        // At a length where mlx-lm never wavered, a difference is a bug.
        all.add(128, 1, RoundCheck::Different { ondo_departs_at: 0 }, None);
        assert_eq!(all.verdict(), TokenVerdict::Different);
        assert!(all.describe().contains("at prompt 128"));
    }

    #[test]
    fn equal_tokens_need_no_second_reference_run() {
        assert_eq!(judge(&[1, 2], &[1, 2], None), RoundCheck::Same);
        let mut all = TokenCheck::default();
        all.add(16, 0, RoundCheck::Same, None);
        assert_eq!(all.verdict(), TokenVerdict::Identical);
        assert!(all.describe().contains("identical"));
    }

    #[test]
    fn a_departure_beyond_rounding_after_an_expert_choice_near_a_tie_is_a_near_tie() {
        // The logits alone put it at 16x rounding, as a swapped expert does.
        let far = TieScore::new(7, 9, 0.16, 0.01, Some(routed(0.002)));
        assert_eq!(far.near_tie(), Some(TieCause::Routing));
        assert_eq!(far.explained_by, Some(TieCause::Routing));
        let mut all = TokenCheck {
            own_cuda_kernel: true,
            ..TokenCheck::default()
        };
        all.add(
            128,
            1,
            RoundCheck::Different {
                ondo_departs_at: 11,
            },
            Some(far),
        );
        assert_eq!(all.verdict(), TokenVerdict::NearTies);
        let line = all.describe();
        assert!(line.contains("16.0x the 0.0100"), "{line}");
        assert!(
            line.contains(
                "but an expert choice at layer 3, position 129 (the step choosing token 2) was \
                 2.0 roundings from a tie (top 2 of 8 softmax probabilities"
            ),
            "{line}"
        );
        assert!(!line.contains("bug"), "{line}");
        // The JSON says which explained it.
        let json = serde_json::to_value(far).unwrap();
        assert_eq!(json["explained_by"], "routing");
        assert_eq!(json["routing"]["ranks"], "softmax");
        assert_eq!(serde_json::from_value::<TieScore>(json).unwrap(), far);
    }

    #[test]
    fn an_expert_choice_far_from_a_tie_leaves_a_departure_beyond_rounding_a_bug() {
        let far = TieScore::new(7, 9, 0.16, 0.01, Some(routed(0.005)));
        assert_eq!(far.near_tie(), None);
        assert_eq!(far.explained_by, None);
        let mut all = TokenCheck {
            own_cuda_kernel: true,
            ..TokenCheck::default()
        };
        all.add(
            128,
            1,
            RoundCheck::Different {
                ondo_departs_at: 11,
            },
            Some(far),
        );
        assert_eq!(all.verdict(), TokenVerdict::Different);
        let line = all.describe();
        assert!(line.contains("a bug in Ondo's own CUDA kernel"), "{line}");
        assert!(
            line.contains(
                "the expert choice nearest to a tie on the way (layer 3, position 129) was 5.0 \
                 roundings from a tie"
            ),
            "{line}"
        );
        // Where the logits explain it, they are named, routing or not.
        let near = TieScore::new(7, 9, 0.03, 0.01, Some(routed(0.002)));
        assert_eq!(near.near_tie(), Some(TieCause::Logits));
        // Where nothing rounds, only an exact tie of experts explains.
        let exact = RoutingTie {
            rounding: 0.0,
            ..routed(0.0)
        };
        assert!(exact.is_near_tie());
        assert!(
            !RoutingTie {
                rounding: 0.0,
                ..routed(1e-6)
            }
            .is_near_tie()
        );
    }

    #[test]
    fn without_routing_scores_the_logits_alone_decide() {
        // A model without routed experts, or a report written before they
        // were scored: the logits' rule, as before.
        assert_eq!(scored(0.16, 0.01).unwrap().near_tie(), None);
        assert_eq!(
            scored(0.03, 0.01).unwrap().near_tie(),
            Some(TieCause::Logits)
        );
        let old: TieScore = serde_json::from_str(
            r#"{"reference_token": 7, "ondo_token": 9, "gap_f32": 0.03, "rounding": 0.01}"#,
        )
        .unwrap();
        assert_eq!(old.routing, None);
        assert!(old.is_near_tie());
        let old_far: TieScore = serde_json::from_str(
            r#"{"reference_token": 7, "ondo_token": 9, "gap_f32": 0.16, "rounding": 0.01}"#,
        )
        .unwrap();
        assert!(!old_far.is_near_tie());
        assert!(!old_far.describe().contains("expert"));
    }
}
