//! The text form of schedule steps: `{stage}{F|B|I|W}{microbatch}` for an action (`3F1`), an
//! overlapped pair as `(0F7;7B3)`; what [`Action`] and [`Step`] print, parse from and serialize
//! to (JSON strings).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{Action, ActionKind, Step};

/// Why a text action or step could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot parse `{text}` as a schedule step: {reason} (expected `{{stage}}{{F|B|I|W}}{{microbatch}}` like `3F1`, or an overlapped pair like `(0F7;7B3)`)")]
pub struct ParseStepError {
    /// The text that failed.
    pub text: String,
    /// What was wrong with it.
    pub reason: String,
}

impl fmt::Display for Action {
    /// `{stage}{F|B|I|W}{microbatch}`, written as one string (schedules print tens of
    /// thousands of actions; the formatting machinery per number cost more than the rest).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // two u32 in decimal (10 digits each) and the letter
        let mut buf = [0u8; 21];
        let mut end = buf.len();
        for (i, n) in [self.microbatch, self.stage].into_iter().enumerate() {
            let mut n = n;
            loop {
                end -= 1;
                buf[end] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            if i == 0 {
                end -= 1;
                buf[end] = self.kind.letter() as u8;
            }
        }
        f.write_str(std::str::from_utf8(&buf[end..]).map_err(|_| fmt::Error)?)
    }
}

impl FromStr for Action {
    type Err = ParseStepError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason: &str| ParseStepError {
            text: s.to_string(),
            reason: reason.to_string(),
        };
        let t = s.trim();
        let pos = t
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| err("no action letter"))?;
        let (stage, rest) = t.split_at(pos);
        let mut chars = rest.chars();
        let letter = chars.next().ok_or_else(|| err("no action letter"))?;
        let kind = ActionKind::from_letter(letter)
            .ok_or_else(|| err(&format!("`{letter}` is not one of F, B, I, W")))?;
        let mb = chars.as_str();
        if stage.is_empty() {
            return Err(err("missing stage number"));
        }
        if mb.is_empty() || !mb.bytes().all(|b| b.is_ascii_digit()) {
            return Err(err("missing or malformed micro-batch number"));
        }
        let stage: u32 = stage.parse().map_err(|_| err("stage number too large"))?;
        let microbatch: u32 = mb
            .parse()
            .map_err(|_| err("micro-batch number too large"))?;
        Ok(Action {
            stage,
            microbatch,
            kind,
        })
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::One(a) => write!(f, "{a}"),
            Step::Overlapped(a, b) => write!(f, "({a};{b})"),
        }
    }
}

impl FromStr for Step {
    type Err = ParseStepError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        if let Some(inner) = t.strip_prefix('(') {
            let inner = inner.strip_suffix(')').ok_or_else(|| ParseStepError {
                text: s.to_string(),
                reason: "missing closing `)`".to_string(),
            })?;
            let (a, b) = inner.split_once(';').ok_or_else(|| ParseStepError {
                text: s.to_string(),
                reason: "an overlapped pair needs two actions separated by `;`".to_string(),
            })?;
            Ok(Step::Overlapped(a.parse()?, b.parse()?))
        } else {
            Ok(Step::One(t.parse()?))
        }
    }
}

/// Serializes `$t` as its text form (a JSON string) and parses it back from one.
macro_rules! serde_as_text {
    ($($t:ty),*) => {$(
        impl Serialize for $t {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = String::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}

serde_as_text!(Action, Step);

/// Parses a whitespace-separated list of steps, e.g. `"0F0 0F1 (0F2;1B0) 0B1"`.
pub fn parse_steps(text: &str) -> Result<Vec<Step>, ParseStepError> {
    text.split_whitespace().map(str::parse).collect()
}
