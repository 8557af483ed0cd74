//! Choosing the next token: greedy, or temperature sampling narrowed by
//! top-p, min-p and top-k, after an optional repetition penalty. The same
//! settings mean what they mean in mlx-lm (`--temp`, `--top-p`, `--min-p`,
//! `--top-k`, `--repetition-penalty`); a seed makes sampling repeatable.

use mlx_rs::error::Exception;
use mlx_rs::{Array, ops, random};

/// Sampler settings; the defaults are greedy decoding.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "specta", derive(specta::Type))]
pub struct SamplerSettings {
    /// 0 picks the most likely token (greedy); higher flattens the distribution.
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability mass
    /// reaches `top_p`; 0 or 1 turns it off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 is off.
    pub min_p: f32,
    /// Keep only the `top_k` most likely tokens; 0 is off.
    pub top_k: u32,
    /// Scale down the logits of recently generated tokens (> 1 discourages
    /// repeats); `None` is off.
    pub repetition_penalty: Option<f32>,
    /// How many recent tokens the repetition penalty looks at.
    pub repetition_context_size: usize,
    /// Seed of the sampling RNG; `None` takes one from the clock.
    pub seed: Option<u64>,
}

impl Default for SamplerSettings {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_p: 0.0,
            min_p: 0.0,
            top_k: 0,
            repetition_penalty: None,
            repetition_context_size: 20,
            seed: None,
        }
    }
}

/// Why settings were refused.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplerError {
    #[error("temperature {0} is negative; use 0 for greedy or a positive value")]
    NegativeTemperature(f32),
    #[error("top-p {0} is outside [0, 1]")]
    TopPOutOfRange(f32),
    #[error("min-p {0} is outside [0, 1]")]
    MinPOutOfRange(f32),
    #[error("repetition penalty {0} must be positive")]
    NonPositivePenalty(f32),
}

impl SamplerSettings {
    /// Checks the ranges before any token is generated.
    pub fn validate(&self) -> Result<(), SamplerError> {
        if self.temperature < 0.0 {
            return Err(SamplerError::NegativeTemperature(self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return Err(SamplerError::TopPOutOfRange(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplerError::MinPOutOfRange(self.min_p));
        }
        if let Some(p) = self.repetition_penalty
            && p <= 0.0
        {
            return Err(SamplerError::NonPositivePenalty(p));
        }
        Ok(())
    }

    /// True when no randomness is involved.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// A sampler with its own RNG key, advanced once per sampled token.
pub struct Sampler {
    settings: SamplerSettings,
    key: Array,
}

impl Sampler {
    pub fn new(settings: SamplerSettings) -> Result<Self, Exception> {
        let seed = settings
            .seed
            .unwrap_or_else(crate::engine::distributed::fresh_seed);
        Ok(Self {
            key: random::key(seed)?,
            settings,
        })
    }

    pub fn settings(&self) -> &SamplerSettings {
        &self.settings
    }

    /// Picks the next token from log-probabilities `[1, vocab]`; returns a
    /// `[1]` uint32 array (not evaluated, so the caller decides when to sync).
    pub fn sample(&mut self, logprobs: &Array) -> Result<Array, Exception> {
        let s = &self.settings;
        if s.is_greedy() {
            return ops::indexing::argmax_axis(logprobs, -1, None);
        }
        let mut filtered = logprobs.clone();
        if s.top_p > 0.0 && s.top_p < 1.0 {
            filtered = top_p(&filtered, s.top_p)?;
        }
        if s.min_p > 0.0 {
            filtered = min_p(&filtered, s.min_p)?;
        }
        if s.top_k > 0 {
            filtered = top_k(&filtered, s.top_k)?;
        }
        let (next_key, step_key) = random::split(&self.key, 2)?;
        self.key = next_key;
        let scaled = ops::multiply(&filtered, Array::from_f32(1.0 / s.temperature))?;
        random::categorical(&scaled, -1, None, &step_key)
    }
}

fn neg_inf() -> Array {
    Array::from_f32(f32::NEG_INFINITY)
}

/// Keeps the smallest set of most likely tokens whose mass reaches `p`.
fn top_p(logprobs: &Array, p: f32) -> Result<Array, Exception> {
    let sorted = ops::sort_axis(logprobs, -1)?;
    let probs = ops::exp(sorted.as_dtype(mlx_rs::Dtype::Float32)?)?;
    // Mass strictly above each position of the ascending order.
    let mass_above = ops::cumsum(&probs, -1, true, false)?;
    let total = ops::sum_axis(&probs, -1, true)?;
    let dropped = ops::ge(&mass_above, ops::multiply(&total, Array::from_f32(p))?)?
        .as_dtype(mlx_rs::Dtype::Int32)?
        .sum_axis(-1, true)?;
    let threshold = ops::indexing::take_along_axis(&sorted, &dropped, -1)?;
    ops::select(&ops::lt(logprobs, &threshold)?, neg_inf(), logprobs)
}

/// Drops tokens less likely than `p` times the most likely one.
fn min_p(logprobs: &Array, p: f32) -> Result<Array, Exception> {
    let top = logprobs.max_axis(-1, true)?;
    let floor = ops::add(&top, Array::from_f32(p.ln()))?;
    ops::select(&ops::lt(logprobs, &floor)?, neg_inf(), logprobs)
}

/// Keeps the `k` most likely tokens.
fn top_k(logprobs: &Array, k: u32) -> Result<Array, Exception> {
    let vocab = logprobs.shape()[logprobs.ndim() - 1];
    let k = i32::try_from(k).unwrap_or(i32::MAX);
    if k >= vocab {
        return Ok(logprobs.clone());
    }
    let order = ops::argpartition_axis(&ops::negative(logprobs)?, k - 1, -1)?;
    let drop = order.index((.., k..));
    ops::indexing::put_along_axis(logprobs, &drop, neg_inf(), -1)
}

use mlx_rs::ops::indexing::IndexOp;

/// Divides positive logits and multiplies negative ones of `tokens` by
/// `penalty`, so a repeated token always becomes less likely for penalty > 1.
/// `tokens` is `[1, n]` uint32 and may still be lazy.
pub fn repetition_penalty(
    logits: &Array,
    tokens: &Array,
    penalty: f32,
) -> Result<Array, Exception> {
    let idx = tokens;
    let selected = ops::indexing::take_along_axis(logits, idx, -1)?;
    let penalised = ops::select(
        &ops::lt(&selected, Array::from_f32(0.0))?,
        ops::multiply(&selected, Array::from_f32(penalty))?,
        ops::divide(&selected, Array::from_f32(penalty))?,
    )?;
    ops::indexing::put_along_axis(logits, idx, &penalised, -1)
}

/// The token ids a repetition penalty looks at: the latest
/// `repetition_context_size`, `[1, n]`, extended lazily by each step's
/// input so a pipelined loop never waits for them.
pub struct RecentTokens {
    ids: Option<Array>,
    context: i32,
    penalty: f32,
}

impl RecentTokens {
    /// The recent tokens of a run with `settings`, starting from the
    /// prompt tokens before its last (the last is the first step's input);
    /// `None` when the settings have no repetition penalty.
    pub fn new(settings: &SamplerSettings, prompt_before_last: &[u32]) -> Option<Self> {
        let penalty = settings.repetition_penalty?;
        let context = settings.repetition_context_size;
        let tail = &prompt_before_last[prompt_before_last
            .len()
            .saturating_sub(context.saturating_sub(1))..];
        let ids = (!tail.is_empty()).then(|| {
            let n = i32::try_from(tail.len()).unwrap_or(i32::MAX);
            Array::from_slice(tail, &[1, n])
        });
        Some(Self {
            ids,
            context: i32::try_from(context).unwrap_or(i32::MAX).max(1),
            penalty,
        })
    }

    /// `logits` (`[1, vocab]`) with the penalty applied to the recent
    /// tokens, `input` (this step's input token, one id) added to them
    /// first.
    pub fn penalize(&mut self, logits: &Array, input: &Array) -> Result<Array, Exception> {
        let input = input.reshape(&[1, 1])?;
        let recent = match self.ids.take() {
            Some(ids) => ops::concatenate(&[ids, input], 1)?,
            None => input,
        };
        let length = recent.shape()[1];
        let recent = if length > self.context {
            recent.index((.., (length - self.context)..))
        } else {
            recent
        };
        let penalized = repetition_penalty(logits, &recent, self.penalty)?;
        self.ids = Some(recent);
        Ok(penalized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logprobs(values: &[f32]) -> Array {
        let logits = Array::from_slice(values, &[1, values.len() as i32]);
        let lse = logits.logsumexp_axis(-1, true).unwrap();
        ops::subtract(&logits, &lse).unwrap()
    }

    fn draw(settings: SamplerSettings, values: &[f32], n: usize) -> Vec<u32> {
        let mut sampler = Sampler::new(settings).unwrap();
        let lp = logprobs(values);
        (0..n)
            .map(|_| {
                let t = sampler.sample(&lp).unwrap();
                t.eval().unwrap();
                t.as_slice::<u32>()[0]
            })
            .collect()
    }

    fn sampling(temperature: f32) -> SamplerSettings {
        SamplerSettings {
            temperature,
            seed: Some(7),
            ..SamplerSettings::default()
        }
    }

    /// The penalty looks at the prompt's tail and each step's input, never
    /// more than the context: a token that slid out of it is free again.
    #[test]
    fn recent_tokens_penalize_the_latest_within_the_context() {
        let settings = SamplerSettings {
            repetition_penalty: Some(2.0),
            repetition_context_size: 3,
            ..SamplerSettings::default()
        };
        assert!(RecentTokens::new(&SamplerSettings::default(), &[1, 2]).is_none());
        let mut recent = RecentTokens::new(&settings, &[5, 6, 7, 8]).unwrap();
        let logits = Array::from_slice(&[2.0f32; 12], &[1, 12]);
        let penalized = |recent: &mut RecentTokens, input: u32| -> Vec<usize> {
            let out = recent
                .penalize(&logits, &Array::from_slice(&[input], &[1]))
                .unwrap();
            out.eval().unwrap();
            (0..12)
                .filter(|&i| out.as_slice::<f32>()[i] == 1.0)
                .collect()
        };
        // The prompt's last two before the input, then the input.
        assert_eq!(penalized(&mut recent, 9), vec![7, 8, 9]);
        assert_eq!(penalized(&mut recent, 10), vec![8, 9, 10]);
    }

    #[test]
    fn greedy_takes_the_most_likely_token() {
        assert_eq!(
            draw(SamplerSettings::default(), &[0.1, 2.0, 1.9, -1.0], 3),
            vec![1, 1, 1]
        );
    }

    #[test]
    fn the_same_seed_draws_the_same_tokens() {
        let values = [1.0, 1.0, 1.0, 1.0];
        let a = draw(sampling(1.0), &values, 32);
        assert_eq!(a, draw(sampling(1.0), &values, 32));
        // Uniform logits: all four tokens show up in 32 draws.
        for token in 0..4 {
            assert!(a.contains(&token), "{a:?}");
        }
        let other = draw(
            SamplerSettings {
                seed: Some(8),
                ..sampling(1.0)
            },
            &values,
            32,
        );
        assert_ne!(a, other);
    }

    #[test]
    fn top_k_one_is_greedy_even_when_sampling() {
        let settings = SamplerSettings {
            top_k: 1,
            ..sampling(2.0)
        };
        assert_eq!(draw(settings, &[0.0, 0.5, 3.0, 0.2], 20), vec![2; 20]);
    }

    #[test]
    fn top_k_never_draws_outside_the_k_best() {
        let settings = SamplerSettings {
            top_k: 2,
            ..sampling(5.0)
        };
        let drawn = draw(settings, &[0.0, 1.0, 0.9, 0.1], 64);
        assert!(drawn.iter().all(|t| *t == 1 || *t == 2), "{drawn:?}");
    }

    #[test]
    fn min_p_drops_tokens_far_below_the_best() {
        // probabilities ~ [0.665, 0.245, 0.09, ~0]: min_p 0.2 keeps the first two.
        let settings = SamplerSettings {
            min_p: 0.2,
            ..sampling(1.0)
        };
        let drawn = draw(settings, &[3.0, 2.0, 1.0, -20.0], 64);
        assert!(drawn.iter().all(|t| *t <= 1), "{drawn:?}");
        assert!(drawn.contains(&1), "{drawn:?}");
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // probabilities ~ [0.64, 0.24, 0.09, 0.03]: top_p 0.8 needs the first two.
        let settings = SamplerSettings {
            top_p: 0.8,
            ..sampling(1.0)
        };
        let drawn = draw(settings, &[3.0, 2.0, 1.0, 0.0], 64);
        assert!(drawn.iter().all(|t| *t <= 1), "{drawn:?}");
        assert!(drawn.contains(&0) && drawn.contains(&1), "{drawn:?}");
    }

    #[test]
    fn repetition_penalty_makes_repeats_less_likely() {
        let logits = Array::from_slice(&[2.0f32, 1.9, -1.0, 0.5], &[1, 4]);
        let out =
            repetition_penalty(&logits, &Array::from_slice(&[0u32, 2], &[1, 2]), 2.0).unwrap();
        out.eval().unwrap();
        assert_eq!(out.as_slice::<f32>(), &[1.0, 1.9, -2.0, 0.5]);
    }

    #[test]
    fn bad_settings_are_refused_with_the_value() {
        let bad = SamplerSettings {
            temperature: -1.0,
            ..SamplerSettings::default()
        };
        assert_eq!(bad.validate(), Err(SamplerError::NegativeTemperature(-1.0)));
        let bad = SamplerSettings {
            top_p: 1.5,
            ..SamplerSettings::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("1.5"));
    }
}
